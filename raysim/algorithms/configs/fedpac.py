"""fedpac's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedpac.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raysim.config import AlgorithmConfig, require


@dataclass
class FedPACConfig(AlgorithmConfig):
    name: str = "fedpac"
    lam: float = 1.0  # weight of the feature-alignment MSE (options.py --lam)
    head_epochs: int = 1  # classifier epochs before the extractor's train.local_epochs (epoch_classifier = 1)
    head_lr: Optional[float] = 0.1  # the classifier phase's learning rate (the authors' 0.1; null: train.lr)
    combine_heads: bool = True  # classifier collaboration by the QP (options.py --agg_g 1); False: own heads
    weight_eps: float = 1e-3  # combination weights below this are zeroed (get_head_agg_weight's eps)

    def validate(self) -> None:
        require(self.lam >= 0, "algorithm.lam", f"must be >= 0, got {self.lam}")
        require(self.head_epochs >= 0, "algorithm.head_epochs", f"must be >= 0, got {self.head_epochs}")
        require(self.head_lr is None or self.head_lr > 0, "algorithm.head_lr", f"must be > 0, got {self.head_lr}")
        require(0 <= self.weight_eps < 1, "algorithm.weight_eps", f"must be in [0, 1), got {self.weight_eps}")
