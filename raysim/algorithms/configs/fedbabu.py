"""fedbabu's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedbabu.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, is_finite, is_whole, require


@dataclass
class FedBABUConfig(AlgorithmConfig):
    name: str = "fedbabu"
    finetune_epochs: int = 5  # τ_f: epochs of whole-model fine-tuning before personalised evaluation (--ft_ep)
    finetune_lr: float = 0.001  # fine-tuning SGD learning rate (analysis.ipynb)

    def validate(self) -> None:
        require(is_whole(self.finetune_epochs), "algorithm.finetune_epochs",
                f"must be an integer >= 0, got {self.finetune_epochs}")
        require(is_finite(self.finetune_lr, 0, strict=True), "algorithm.finetune_lr",
                f"must be a finite number > 0, got {self.finetune_lr}")
