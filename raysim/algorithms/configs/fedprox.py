"""fedprox's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedprox.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, require


@dataclass
class FedProxConfig(AlgorithmConfig):
    name: str = "fedprox"
    mu: float = 0.01  # proximal weight (authors' flearn/optimizer/pgd.py default); 0 is FedAvg

    def validate(self) -> None:
        require(self.mu >= 0, "algorithm.mu", f"must be >= 0, got {self.mu}")  # also refuses NaN
