"""moon's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/moon.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, is_whole, require


@dataclass
class MOONConfig(AlgorithmConfig):
    name: str = "moon"
    mu: float = 1.0  # weight of ℓ_con (authors' --mu default 1; paper: 5 on CIFAR-10, 1 on CIFAR-100)
    tau: float = 0.5  # temperature (authors' --temperature)
    out_dim: int = 256  # projection head output (authors' --out_dim)
    model_buffer_size: int = 1  # previous local models contrasted against (authors' --model_buffer_size)

    def validate(self) -> None:
        require(self.mu >= 0, "algorithm.mu", f"must be >= 0, got {self.mu}")
        require(self.tau > 0, "algorithm.tau", f"must be > 0, got {self.tau}")
        require(is_whole(self.out_dim, 1), "algorithm.out_dim", f"must be an integer >= 1, got {self.out_dim}")
        require(is_whole(self.model_buffer_size, 1), "algorithm.model_buffer_size",
                f"must be an integer >= 1, got {self.model_buffer_size}")
