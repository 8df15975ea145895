"""Test-only: the client jobs of one round wait at a gate, whatever the algorithm (listed in a config's ``plugins``).

A file ``LOG_DIR.hold`` beside the run directory holds ``ROUND GATE``: every training job of round ROUND first
appends ``round client pid`` to ``GATE.jobs``, then waits for the file GATE. A test that kills the process named
there kills a worker in the middle of a job; a second line for the same client, from another pid, shows that the
job ran again. The module patches ``ClientJobs.start`` wherever it is imported (every worker imports a config's
plugins), the start of every training job, one client at a time or in a stack (``engine.vectorize``:
the stack waits at its first client's start; a client that a stack trains alone after all notes a second line from
the same pid). Without the file nothing changes, so a run with and without the hold computes the same numbers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import raysim.engine.core as core

TIMEOUT_S = 300.0


def jobs_file(gate: str | Path) -> Path:
    """Where held jobs note ``round client pid``, one line each."""
    return Path(f"{gate}.jobs")


def read_jobs(gate: str | Path) -> list[tuple[int, int, int]]:
    """(round, client, pid) of every held job so far, in the order they started."""
    try:
        lines = jobs_file(gate).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in lines if len(line.split()) == 3)]


def hold(log_dir: str | Path, round: int, gate: str | Path) -> None:
    """Make the jobs of ``round`` of the run in ``log_dir`` wait for ``gate`` (call before the run starts)."""
    Path(f"{Path(log_dir)}.hold").write_text(f"{round} {gate}\n")


_start = core.ClientJobs.start


def _held_start(self, job, shared, own, state):
    hold = Path(f"{self.cfg.log.dir}.hold")
    spec = hold.read_text().split(maxsplit=1) if hold.is_file() else []
    if len(spec) == 2 and job.round == int(spec[0]):
        gate = spec[1].strip()
        with open(jobs_file(gate), "a") as fh:
            fh.write(f"{job.round} {job.client_id} {os.getpid()}\n")
        deadline = time.monotonic() + TIMEOUT_S
        while not Path(gate).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"client {job.client_id} in round {job.round} held for {TIMEOUT_S:g} s: {gate} "
                                   f"never appeared")
            time.sleep(0.05)
    return _start(self, job, shared, own, state)


core.ClientJobs.start = _held_start
