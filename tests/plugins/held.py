"""Test-only algorithms whose round ``algorithm.hold_round`` waits for the file ``algorithm.hold_until``, so a test can
act at a known point of a run (the multi-node test removes a node there, the preemption tests send SIGTERM, the
Ctrl-C tests press Ctrl-C in a round that cannot end).

``algorithm.hold_at`` says where the round waits: ``start`` (before its clients train: between two rounds) or
``aggregate`` (``held_stateful`` only: after its clients trained, before aggregation and evaluation: mid-round, when
the round's new client states exist but nothing has read them yet). ``algorithm.hold_reached``, when set, is a file
written as the wait begins, so the test knows the run is there; ``HOLD_UNTIL.waiting`` is written then too. In the
main thread (the driver of ``raysim run`` in the process that runs it) the wait also notes every Ctrl-C it sees in
``HOLD_UNTIL.sigints`` before the run's own handler gets it. Waiting changes no number.

The driver reads the files, in the process where the command was typed; without a gate, a test that acts on what
the run prints races the rounds that follow. (tests/plugins/held_jobs.py holds client jobs instead, for any
algorithm.)

- ``held_fedavg``: FedAvg.
- ``held_stateful``: every client keeps its whole model (client state, read at evaluation too) and uploads it; the
  server keeps each client's last ``algorithm.history`` uploads (``server_history``, as FedCDA's cache) and, on a
  worker, logs their mean squared norm (``stateful/history_norm``). Every kind of object a run keeps across rounds,
  each above Ray's inline limit (100 KB) once the model is large enough.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from raysim.algorithms.base import Algorithm, ClientUpdate, ServerContext, split_state
from raysim.algorithms.fedavg import FedAvg
from raysim.config import AlgorithmConfig
from raysim.registry import register_algorithm


@dataclass
class HeldConfig(AlgorithmConfig):
    name: str = "held_fedavg"
    hold_round: int = 0  # the round that waits (0: none)
    hold_at: str = "start"  # start | aggregate: where it waits
    hold_until: str = ""  # the file it waits for
    hold_reached: str = ""  # a file written when the wait begins ("": none)
    hold_timeout_s: float = 180.0


@contextlib.contextmanager
def _noting_sigints(gate: str):
    """In the main thread: every SIGINT appends a line to ``GATE.sigints``, then goes to the handler in place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)

    def noted(signum, frame):
        with open(f"{gate}.sigints", "a") as fh:
            fh.write("SIGINT\n")
        if callable(handler):
            handler(signum, frame)

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


class Held:
    """The gate, for any algorithm: ``server_payload`` opens a round (start); an algorithm that also waits after its
    clients' training (aggregate) calls ``_hold`` from its ``server_aggregate`` (overriding that hook would take
    FedAvg off its partial-sum path, ``Algorithm.sums_uploads``)."""

    def _hold(self, round: int, at: str) -> None:
        c = self.config
        if round != c.hold_round or at != c.hold_at:
            return
        if c.hold_reached:
            Path(c.hold_reached).touch()
        Path(f"{c.hold_until}.waiting").write_text(f"round {round}\n")
        deadline = time.monotonic() + c.hold_timeout_s
        with _noting_sigints(c.hold_until):
            while not Path(c.hold_until).exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"round {round} held for {c.hold_timeout_s:g} s: {c.hold_until} never "
                                       f"appeared")
                time.sleep(0.05)

    def server_payload(self, server_state: dict, round: int) -> dict:
        self._hold(round, "start")
        return super().server_payload(server_state, round)


@register_algorithm("held_fedavg")
class HeldFedAvg(Held, FedAvg):
    """FedAvg whose round ``hold_round`` waits for the file ``hold_until``."""

    Config = HeldConfig


@dataclass
class HeldStatefulConfig(HeldConfig):
    name: str = "held_stateful"
    history: int = 2  # uploads the server keeps per client


@register_algorithm("held_stateful")
class HeldStateful(Held, Algorithm):
    """Local training with its state, its uploads and the server's history of them all kept across rounds."""

    Config = HeldStatefulConfig
    shared = "none"  # each client keeps its whole model: nothing is averaged into it

    def __init__(self, cfg):
        super().__init__(cfg)
        self.server_history = self.config.history

    def client_upload(self, model, ctx) -> dict:
        return split_state(model, lambda key: True)

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        self._hold(round, "aggregate")
        return server_state  # nothing is shared

    def server_train(self, server_state: dict, updates: list[ClientUpdate], ctx: ServerContext) -> dict:
        norms = [sum(float((t.double() ** 2).sum()) for t in kept.values())
                 for cid in sorted(ctx.history) for kept in ctx.history[cid]]
        server_state["history_norm"] = sum(norms) / len(norms) if norms else 0.0
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        return {"stateful/history_norm": float(server_state.get("history_norm", 0.0))}
