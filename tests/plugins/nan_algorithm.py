"""A test-only algorithm: FedAvg whose client 1 produces NaN in round 2 (listed in a config's ``plugins``)."""

import torch

from raysim.algorithms.fedavg import FedAvg
from raysim.registry import register_algorithm


@register_algorithm("nan_fedavg")
class NanFedAvg(FedAvg):
    def client_loss(self, model, x, y, ctx):
        loss, parts = super().client_loss(model, x, y, ctx)
        if ctx.client_id == 1 and ctx.round == 2:
            loss = loss * torch.tensor(float("nan"))
        return loss, parts
