"""fedrcl's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedrcl.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raysim.config import AlgorithmConfig, is_whole, require


@dataclass
class FedRCLConfig(AlgorithmConfig):
    name: str = "fedrcl"
    tau: float = 0.05  # temperature (rcl_loss.temp)
    threshold: float = 0.7  # λ: same-class similarity above which the divergence penalty acts (penalty.threshold)
    scl_weight: float = 1.0  # weight of L_SCL (pairs[scl].weight)
    penalty_weight: float = 1.0  # β, weight of L_Div (pairs[penalty].weight)
    topk_pos: int = 1  # hardest positives per sample (rcl_loss.topk_pos)
    topk_neg: int = 2  # hardest negatives per sample (rcl_loss.topk_neg)
    stages: Optional[list[int]] = None  # stage indices the loss uses; null = all (branch_level [0..4] on ResNet)
    clip_grad_norm: Optional[float] = 10.0  # gradient-norm clip per step (RCLClient.local_train); null: none

    def validate(self) -> None:
        require(self.tau > 0, "algorithm.tau", f"must be > 0, got {self.tau}")
        require(-1 <= self.threshold <= 1, "algorithm.threshold",
                f"must be a cosine similarity in [-1, 1], got {self.threshold}")
        for key in ("scl_weight", "penalty_weight"):
            require(getattr(self, key) >= 0, f"algorithm.{key}", f"must be >= 0, got {getattr(self, key)}")
        for key in ("topk_pos", "topk_neg"):
            require(is_whole(getattr(self, key), 1), f"algorithm.{key}",
                    f"must be an integer >= 1, got {getattr(self, key)}")
        require(self.clip_grad_norm is None or self.clip_grad_norm > 0, "algorithm.clip_grad_norm",
                f"must be > 0 or null, got {self.clip_grad_norm}")
        if self.stages is not None:
            stages = list(self.stages)
            require(bool(stages) and all(is_whole(s) for s in stages) and len(set(stages)) == len(stages),
                    "algorithm.stages", f"must be null (all) or a list of distinct stage indices >= 0, got {stages}")
