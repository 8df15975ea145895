"""A test-only algorithm: FedAvg whose clients raise in round 2 (listed in a config's ``plugins``)."""

from raysim.algorithms.fedavg import FedAvg
from raysim.registry import register_algorithm


@register_algorithm("fail_round2")
class FailRound2(FedAvg):
    def client_loss(self, model, x, y, ctx):
        if ctx.round == 2:
            raise RuntimeError("deliberate failure in round 2 | for the test")
        return super().client_loss(model, x, y, ctx)
