"""FedRep (Collins et al., 2021): the representation (backbone) is averaged, each client keeps its own head.

Every round a client first fits its head on the freshly downloaded backbone (``algorithm.head_epochs``), then
trains the backbone with the head frozen (``train.local_epochs``), as in FedRep's alternating schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.config import AlgorithmConfig, require
from raysim.registry import register_algorithm


@dataclass
class FedRepConfig(AlgorithmConfig):
    name: str = "fedrep"
    head_epochs: int = 1  # local epochs on the head before the body's train.local_epochs (FedRep's paper: 10)

    def validate(self) -> None:
        require(self.head_epochs >= 0, "algorithm.head_epochs", f"must be >= 0, got {self.head_epochs}")


@register_algorithm("fedrep")
class FedRep(Algorithm):
    """Shares the backbone; each client trains its own head first, then the body."""

    Config = FedRepConfig
    shared = "backbone"
    vectorizable = True  # engine.vectorize: the same two phases for every client

    def local_phases(self, model: nn.Module, ctx: ClientContext) -> list[tuple[list[nn.Parameter], int]]:
        phases = [(list(model.head.parameters()), self.config.head_epochs),
                  (list(model.backbone.parameters()), self.cfg.train.local_epochs)]
        return [(params, epochs) for params, epochs in phases if epochs > 0]
