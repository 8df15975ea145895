"""FedAvgM (Hsu et al., 2019): FedAvg with server momentum, as a raysim plugin algorithm.

The server treats ``global - average`` as a pseudo-gradient and takes a momentum step with it:

    v <- beta * v + (global - average);    global <- global - server_lr * v

With ``server_momentum=0`` and ``server_lr=1`` this is FedAvg exactly. Use it with::

    raysim run experiments/smoke.yaml plugins=[fedavgm] algorithm.name=fedavgm algorithm.server_momentum=0.9

(``examples/plugins`` on PYTHONPATH where you type the command; Ray ships the module to the workers.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim import Algorithm, register_algorithm
from raysim.algorithms.base import average_updates
from raysim.config import AlgorithmConfig, require


@dataclass
class FedAvgMConfig(AlgorithmConfig):
    name: str = "fedavgm"
    server_lr: float = 1.0  # server learning rate on the pseudo-gradient (global - average)
    server_momentum: float = 0.9  # server momentum beta; 0 with server_lr 1 is FedAvg

    def validate(self) -> None:
        require(self.server_lr > 0, "algorithm.server_lr", f"must be > 0, got {self.server_lr}")
        require(0.0 <= self.server_momentum < 1.0, "algorithm.server_momentum",
                f"must be in [0, 1), got {self.server_momentum}")


@register_algorithm("fedavgm")
class FedAvgM(Algorithm):
    """FedAvg with server momentum on the averaged update (FedAvgM); an example plugin."""

    Config = FedAvgMConfig
    shared = "all"

    def init_server_state(self, initial_state):
        state = super().init_server_state(initial_state)
        state["velocity"] = {k: torch.zeros_like(v) for k, v in state["model"].items() if v.is_floating_point()}
        return state

    def server_aggregate(self, updates, server_state, round):
        average = average_updates(updates)  # FedAvg's average of this round's ClientUpdates, by sample counts
        lr, beta = self.config.server_lr, self.config.server_momentum
        new = {}
        for key, avg in average.items():
            if key not in server_state["velocity"]:  # integer buffers (BatchNorm's counters): plain average
                new[key] = avg
                continue
            v = server_state["velocity"][key]
            v.mul_(beta).add_(server_state["model"][key] - avg)
            new[key] = server_state["model"][key] - lr * v
        server_state["model"] = new
        return server_state
