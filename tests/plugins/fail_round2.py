"""A test-only algorithm: FedAvg whose clients raise in round 2 (listed in a config's ``plugins``), unless a file
``PASS`` lies in the folder that holds the run directory (a sweep's ``trials/``): a test makes a failed trial pass
on ``--resume``."""

from pathlib import Path

from raysim.algorithms.fedavg import FedAvg
from raysim.registry import register_algorithm


@register_algorithm("fail_round2")
class FailRound2(FedAvg):
    def client_loss(self, model, x, y, ctx):
        if ctx.round == 2 and not (Path(self.cfg.log.dir).parent / "PASS").exists():
            raise RuntimeError("deliberate failure in round 2 | for the test")
        return super().client_loss(model, x, y, ctx)
