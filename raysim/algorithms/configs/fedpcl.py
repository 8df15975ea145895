"""fedpcl's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedpcl.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from raysim.config import AlgorithmConfig, is_finite, require


@dataclass
class PretrainConfig:
    """The offline stand-in for pretrained backbones (used where ``model.weights`` gives none)."""

    epochs: int = 30  # central pre-training epochs (SGD with momentum 0.9, as FAPD's offline teacher)
    lr: float = 0.05
    batch_size: int = 32
    cache_dir: Optional[str] = None  # null: data.cache_dir, $RAYSIM_CACHE or ~/.cache/raysim (+ fedpcl-backbone)

    def validate(self) -> None:
        key = "algorithm.pretrain."
        require(self.epochs >= 1, f"{key}epochs", f"must be >= 1, got {self.epochs}")
        require(is_finite(self.lr, 0, strict=True), f"{key}lr", f"must be a finite number > 0, got {self.lr}")
        require(self.batch_size >= 2, f"{key}batch_size", f"must be >= 2, got {self.batch_size}")
        if self.cache_dir is not None:
            self.cache_dir = os.path.abspath(os.path.expanduser(str(self.cache_dir)))


@dataclass
class FedPCLConfig(AlgorithmConfig):
    name: str = "fedpcl"
    tau: float = 0.07  # ConLoss(temperature=0.07)
    base_tau: float = 0.07  # ConLoss's base_temperature (the loss is scaled by tau / base_tau)
    proj_dim: int = 256  # ProjandDeci(in_d, 256, classes)
    global_weight: float = 0.0  # > 0: add this times the contrast with the global prototypes alone (not in the code)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)

    def validate(self) -> None:
        for name in ("tau", "base_tau"):
            value = getattr(self, name)
            require(is_finite(value, 0, strict=True), f"algorithm.{name}",
                    f"must be a finite number > 0, got {value}")
        require(self.proj_dim >= 1, "algorithm.proj_dim", f"must be >= 1, got {self.proj_dim}")
        require(is_finite(self.global_weight, 0), "algorithm.global_weight",
                f"must be a finite number >= 0, got {self.global_weight}")
        self.pretrain.validate()
