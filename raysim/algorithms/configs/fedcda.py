"""fedcda's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedcda.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raysim.config import AlgorithmConfig, is_finite, is_whole, require


@dataclass
class FedCDAConfig(AlgorithmConfig):
    name: str = "fedcda"
    memory_size: int = 3  # K: local models kept per client as candidates, this round's included
    num_batches: int = 3  # B: random batches the round's clients are cut into, each searched exhaustively
    warmup_rounds: Optional[int] = None  # rounds of plain FedAvg first; null: a quarter of `rounds` (reproductions: 50)
    smoothness: float = 1.0  # L: weight L/2 of the divergence term against the mean local loss

    def validate(self) -> None:
        for key, low in (("memory_size", 1), ("num_batches", 1)):
            value = getattr(self, key)
            require(is_whole(value, low), f"algorithm.{key}", f"must be an integer >= {low}, got {value}")
        w = self.warmup_rounds
        require(w is None or is_whole(w, 0), "algorithm.warmup_rounds", f"must be null or an integer >= 0, got {w}")
        require(is_finite(self.smoothness, 0), "algorithm.smoothness",
                f"must be a finite number >= 0, got {self.smoothness}")
