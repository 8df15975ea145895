"""ditto's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/ditto.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from raysim.config import AlgorithmConfig, is_finite, require


PREDICTS = ("personal", "global")


@dataclass
class DittoConfig(AlgorithmConfig):
    name: str = "ditto"
    lam: float = 1.0  # λ, the pull of the personal model towards the global one (authors' scripts: 1)
    predict: str = "personal"  # personal: v_k (acc_mean) | global: the averaged model (acc_global too)
    select_lam: bool = False  # λ per client and step by validation loss (the paper's procedure, --dynamic_lam)
    lam_candidates: list[float] = field(default_factory=lambda: [0.1, 1.0, 2.0])  # the authors' candidates
    val_fraction: float = 0.1  # with select_lam: the tail of each client's training data held out (authors: 10 %)

    def refusal(self, feature: str) -> Optional[str]:
        if feature == "stack" and self.select_lam:
            return "ditto's select_lam picks λ on each client's validation data, which a stack's loss does not see"
        return None

    def validate(self) -> None:
        require(is_finite(self.lam, 0.0), "algorithm.lam", f"must be a number >= 0, got {self.lam}")
        require(len(self.lam_candidates) > 0 and all(is_finite(v, 0.0) for v in self.lam_candidates),
                "algorithm.lam_candidates", f"must be a non-empty list of numbers >= 0, got {self.lam_candidates}")
        require(is_finite(self.val_fraction, 0.0, strict=True) and self.val_fraction < 1, "algorithm.val_fraction",
                f"must be a number in (0, 1), got {self.val_fraction}")
        require(self.predict in PREDICTS, "algorithm.predict",
                f"must be one of {', '.join(PREDICTS)}, got {self.predict!r}")
