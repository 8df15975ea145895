"""A test-only algorithm: FedAvg whose round ``algorithm.hold_round`` starts only once the file
``algorithm.hold_until`` exists, so a test can act between two rounds (the multi-node test removes a node there).

The driver reads the file, and the driver runs where the command was typed. Ray runs the driver's rounds ahead of
the caller reading them (a streaming generator), so without a gate a round can be over before the test acts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from raysim.algorithms.fedavg import FedAvg
from raysim.config import AlgorithmConfig
from raysim.registry import register_algorithm


@dataclass
class HeldConfig(AlgorithmConfig):
    name: str = "held_fedavg"
    hold_round: int = 0  # the round whose start waits (0: none)
    hold_until: str = ""  # the file it waits for
    hold_timeout_s: float = 180.0


@register_algorithm("held_fedavg")
class HeldFedAvg(FedAvg):
    """FedAvg whose round ``hold_round`` waits for the file ``hold_until`` before it starts."""

    Config = HeldConfig

    def server_payload(self, server_state: dict, round: int) -> dict:
        if round == self.config.hold_round:
            deadline = time.monotonic() + self.config.hold_timeout_s
            while not Path(self.config.hold_until).exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"round {round} held for {self.config.hold_timeout_s:g} s: "
                                       f"{self.config.hold_until} never appeared")
                time.sleep(0.05)
        return super().server_payload(server_state, round)
