"""fednova's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fednova.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, is_finite, require


@dataclass
class FedNovaConfig(AlgorithmConfig):
    name: str = "fednova"
    mu: float = 0.0  # proximal weight (the authors' --mu, default 0: FedNova on plain local SGD)
    server_momentum: float = 0.0  # the authors' gmf, the global (server) momentum factor (default 0)

    def validate(self) -> None:
        require(is_finite(self.mu, 0.0), "algorithm.mu", f"must be a number >= 0, got {self.mu}")
        require(is_finite(self.server_momentum, 0.0) and self.server_momentum < 1.0, "algorithm.server_momentum",
                f"must be in [0, 1), got {self.server_momentum}")
