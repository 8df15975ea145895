"""fedrep's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedrep.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, require


@dataclass
class FedRepConfig(AlgorithmConfig):
    name: str = "fedrep"
    head_epochs: int = 1  # local epochs on the head before the body's train.local_epochs (FedRep's paper: 10)

    def validate(self) -> None:
        require(self.head_epochs >= 0, "algorithm.head_epochs", f"must be >= 0, got {self.head_epochs}")
