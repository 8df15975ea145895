"""Test-only algorithms: FedAvg whose client 1 produces NaN (``nan_fedavg``) or +Inf (``inf_fedavg``) in round 2
(listed in a config's ``plugins``)."""

import torch

from raysim.algorithms.fedavg import FedAvg
from raysim.registry import register_algorithm


@register_algorithm("nan_fedavg")
class NanFedAvg(FedAvg):
    value = float("nan")

    def client_loss(self, model, x, y, ctx):
        loss, parts = super().client_loss(model, x, y, ctx)
        if ctx.client_id == 1 and ctx.round == 2:
            loss = loss * torch.tensor(self.value)
        return loss, parts


@register_algorithm("inf_fedavg")
class InfFedAvg(NanFedAvg):
    value = float("inf")
