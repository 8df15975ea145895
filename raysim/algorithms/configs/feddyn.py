"""feddyn's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/feddyn.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raysim.config import AlgorithmConfig, is_finite, require


EVALUATES = ("mean", "server")  # algorithm.evaluate


@dataclass
class FedDynConfig(AlgorithmConfig):
    name: str = "feddyn"
    alpha: float = 0.01  # α, the regulariser's weight (authors' alpha_coef)
    scale_alpha: bool = True  # α_k = α·n̄/n_k (the authors' code); false: α for every client (the paper)
    max_grad_norm: Optional[float] = 10.0  # the authors' gradient clip; null: none
    evaluate: str = "mean"  # mean: the plain mean of the round's models (the authors' avg_model) | server: θ^t

    def validate(self) -> None:
        require(self.evaluate in EVALUATES, "algorithm.evaluate",
                f"must be one of {', '.join(EVALUATES)}, got {self.evaluate!r}")
        require(is_finite(self.alpha, 0.0, strict=True), "algorithm.alpha", f"must be a number > 0, got {self.alpha}")
        require(self.max_grad_norm is None or is_finite(self.max_grad_norm, 0.0, strict=True),
                "algorithm.max_grad_norm", f"must be a number > 0 or null, got {self.max_grad_norm}")
