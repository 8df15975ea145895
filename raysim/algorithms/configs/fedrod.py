"""fedrod's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedrod.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, require


PREDICTS = ("personal", "generic")


@dataclass
class FedRoDConfig(AlgorithmConfig):
    name: str = "fedrod"
    predict: str = "personal"  # personal: generic + personal logits (acc_mean); generic: the global model (acc_global)

    def validate(self) -> None:
        require(self.predict in PREDICTS, "algorithm.predict",
                f"must be one of {', '.join(PREDICTS)}, got {self.predict!r}")
