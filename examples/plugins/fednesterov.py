"""FedAvgM with Nesterov momentum on the server, as a raysim plugin: the built-in server-optimiser hook, from outside.

raysim's FedAvgM, FedAdam, FedYogi and FedAdagrad share one hook (``raysim.algorithms.fedopt.FedOpt``): the server
averages the clients' models, and ``server_step(x, average, moments)`` turns each tensor's current value x and its
average x̄ into the new value, with that tensor's optimiser state ``moments`` (made by ``init_moments``, kept in the
server state, checkpointed with the run). This plugin changes only the step: Nesterov's look-ahead on the
pseudo-gradient g = x − x̄ (PyTorch's ``SGD(nesterov=True)`` convention, which FL-bench's FedAvgM uses):

    v <- beta * v + g;    x <- x - server_lr * (g + beta * v)

written as x̄ + (1 - server_lr) * g - server_lr * beta * v, so that beta = 0, server_lr = 1 is FedAvg exactly. It
keeps the built-in's keys, ``algorithm.server_lr`` and ``algorithm.server_momentum``. Use it with::

    raysim run experiments/smoke.yaml plugins=[fednesterov] algorithm.name=fednesterov algorithm.server_momentum=0.9

(``examples/plugins`` on PYTHONPATH where you type the command; Ray ships the module to the workers.) Its client
hooks are FedAvg's, so it declares ``vectorizable = True``: ``engine.vectorize=auto`` or ``=N`` may stack its clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim import register_algorithm
from raysim.algorithms.fedopt import FedAvgM, FedAvgMConfig


@dataclass
class FedNesterovConfig(FedAvgMConfig):
    name: str = "fednesterov"


@register_algorithm("fednesterov")
class FedNesterov(FedAvgM):
    """FedAvg with Nesterov server momentum (an example plugin on raysim's server-optimiser hook)."""

    Config = FedNesterovConfig
    # its client hooks are FedAvg's: engine.vectorize may train its clients as batched stacks (docs/hooks.md). A
    # plugin that overrides a client hook (client_loss, client_setup, local_phases, ...) declares it itself
    vectorizable = True

    def init_moments(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"v": torch.zeros_like(x)}

    def server_step(self, x: torch.Tensor, average: torch.Tensor, moments: dict[str, torch.Tensor]) -> torch.Tensor:
        lr, beta, v = self.config.server_lr, self.config.server_momentum, moments["v"]
        g = x - average
        v.mul_(beta).add_(g)
        return average + (1.0 - lr) * g - (lr * beta) * v
