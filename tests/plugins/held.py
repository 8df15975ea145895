"""Test-only algorithms whose round ``algorithm.hold_round`` waits for the file ``algorithm.hold_until``, so that a
test acts at a moment it chose instead of racing the run (the multi-node test removes a node there, the preemption
tests send SIGTERM, the Ctrl-C tests press Ctrl-C).

- ``algorithm.hold_in=server`` (the default): the round waits in the driver. ``algorithm.hold_at`` says where:
  ``start`` (before its clients train: between two rounds) or ``aggregate`` (``held_stateful`` only: after its
  clients trained, before aggregation and evaluation: mid-round, when the round's new client states exist but
  nothing has read them yet). The driver runs where the command was typed; without a gate, a test that acts on
  what the run prints races the rounds that follow. ``algorithm.hold_reached``, when set, is a file written as the
  wait begins, so the test knows the run is there. Waiting, it also notes so in ``HOLD_UNTIL.waiting``; in the main
  thread (the driver in-process, ``engine.backend=inline``) it notes every Ctrl-C it sees in ``HOLD_UNTIL.sigints``
  before the run's own handler gets it.
- ``algorithm.hold_in=client``: every client job of the round first appends ``round client pid`` to
  ``HOLD_UNTIL.jobs``, then waits. A test that kills the process named there kills a worker in the middle of a job;
  a second line for the same client, from another pid, shows that the job was run again.

Waiting changes no number: ``held_fedavg``, ``held_moon`` and ``held_fedproto`` compute what FedAvg, MOON and
FedProto do. ``held_stateful``: every client keeps its whole model (client state, read at evaluation too) and
uploads it; the server keeps each client's last ``algorithm.history`` uploads (``server_history``, as FedCDA's
cache) and, on a worker, logs their mean squared norm (``stateful/history_norm``). Every kind of object a run keeps
across rounds, each above Ray's inline limit (100 KB) once the model is large enough.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from raysim.algorithms.base import Algorithm, ClientUpdate, ServerContext, split_state
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.fedproto import FedProto
from raysim.algorithms.moon import MOON
from raysim.config import AlgorithmConfig
from raysim.registry import register_algorithm


def jobs_file(gate: str | Path) -> Path:
    """Where held client jobs note ``round client pid``, one line each."""
    return Path(f"{gate}.jobs")


def read_jobs(gate: str | Path) -> list[tuple[int, int, int]]:
    """(round, client, pid) of every held client job so far, in the order they started."""
    try:
        lines = jobs_file(gate).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [tuple(int(v) for v in line.split()) for line in lines if len(line.split()) == 3]  # type: ignore[misc]


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


def _wait(config, what: str) -> None:
    deadline = time.monotonic() + config.hold_timeout_s
    noting = _noting_sigints(config.hold_until) if config.hold_in == "server" else contextlib.nullcontext()
    Path(f"{config.hold_until}.waiting").write_text(f"{what}\n")
    with noting:
        while not Path(config.hold_until).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} held for {config.hold_timeout_s:g} s: {config.hold_until} never "
                                   f"appeared")
            time.sleep(0.05)


@dataclass
class HeldConfig(AlgorithmConfig):
    name: str = "held_fedavg"
    hold_round: int = 0  # the round that waits (0: none)
    hold_at: str = "start"  # start | aggregate: where it waits (hold_in=server)
    hold_in: str = "server"  # server: the round waits in the driver | client: each client job of the round waits
    hold_until: str = ""  # the file it waits for
    hold_reached: str = ""  # a file written when the wait begins ("": none)
    hold_timeout_s: float = 180.0


class Held:
    """The gate, for any algorithm: ``server_payload`` opens a round (start); an algorithm that also waits after its
    clients' training (aggregate) calls ``_hold`` from its ``server_aggregate`` (overriding that hook would take
    FedAvg off its partial-sum path, ``Algorithm.sums_uploads``); ``client_setup`` holds client jobs."""

    def _hold(self, round: int, at: str) -> None:
        c = self.config
        if c.hold_in != "server" or round != c.hold_round or at != c.hold_at:
            return
        if c.hold_reached:
            Path(c.hold_reached).touch()
        _wait(c, f"round {round}")

    def server_payload(self, server_state: dict, round: int) -> dict:
        self._hold(round, "start")
        return super().server_payload(server_state, round)

    def client_setup(self, model, ctx) -> None:
        c = self.config
        if c.hold_in == "client" and ctx.round == c.hold_round:
            with open(jobs_file(c.hold_until), "a") as fh:
                fh.write(f"{ctx.round} {ctx.client_id} {os.getpid()}\n")
            _wait(c, f"client {ctx.client_id} in round {ctx.round}")
        super().client_setup(model, ctx)


def held(base: type[Algorithm], algorithm_name: str) -> type[Algorithm]:
    """``base`` with the hold, registered as ``algorithm_name``; its config adds the hold_* keys to base's own."""

    @dataclass
    class HoldConfig(base.Config):  # type: ignore[name-defined, misc]
        name: str = algorithm_name
        hold_round: int = 0
        hold_at: str = "start"
        hold_in: str = "server"
        hold_until: str = ""
        hold_reached: str = ""
        hold_timeout_s: float = 180.0

    class HeldAlgorithm(Held, base):  # type: ignore[valid-type, misc]
        __doc__ = f"{base.__name__} whose round algorithm.hold_round waits for the file algorithm.hold_until."
        Config = HoldConfig

    HeldAlgorithm.__name__ = HeldAlgorithm.__qualname__ = f"Held{base.__name__}"
    return register_algorithm(algorithm_name)(HeldAlgorithm)


HeldFedAvg = held(FedAvg, "held_fedavg")
HeldMOON = held(MOON, "held_moon")
HeldFedProto = held(FedProto, "held_fedproto")


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
