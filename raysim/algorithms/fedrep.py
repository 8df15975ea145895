"""FedRep (Collins et al., 2021): the representation (backbone) is averaged, each client keeps its own head.

Every round a client first fits its head on the freshly downloaded backbone (``algorithm.head_epochs``), then
trains the backbone with the head frozen (``train.local_epochs``), as in FedRep's alternating schedule.
"""

from __future__ import annotations


from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.algorithms.configs.fedrep import FedRepConfig
from raysim.registry import register_algorithm


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
