"""A run's checkpoint, written after a round and read back by ``--resume``.

``checkpoint/server.pt`` holds the round, the server state, the running totals, the engine's choices that must
stand for the whole run (``engine.vectorize=auto``'s stack size), the config it was made with, the index of the
client states and the server's kept history (their files beside it, each with its sha256), and what each stage
keeps (its :meth:`raysim.stages.Stage.state`; the schedule's own files first, :meth:`raysim.stages.Schedule.save`).
Files are written before the ``server.pt`` that names them, so a crash at any point leaves the last complete
checkpoint readable (``raysim.engine.state``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from raysim.engine.state import ClientHistoryStore, ClientStateStore, checkpoint_dir, checksums, read_checkpoint
from raysim.stages import RoundRun, StageSet


@dataclass
class Restored:
    """What a resume continues from."""

    round: int
    server_state: dict
    totals: dict
    vectorize: Optional[int]


def save_checkpoint(run_dir: Path, round: int, server_state: dict, totals: dict, states: ClientStateStore,
                    history: ClientHistoryStore, stages: StageSet, extra: dict[str, Any], final: bool) -> None:
    """Write the checkpoint of ``round``: the history's and the schedule's new files, then ``server.pt`` naming
    them (``extra``: the engine's own entries, ``vectorize`` and ``config``)."""
    ckpt = checkpoint_dir(run_dir)
    kept = history.save(ckpt)  # new entries' files, before server.pt names them
    schedule = stages.schedule.save(ckpt) if stages.schedule is not None else {}
    states.save(ckpt, round, {"server_state": server_state, "totals": dict(totals), "history": kept, **extra,
                              **stages.state(), **schedule}, checksums=history.checksums)
    history.prune(ckpt)
    if stages.schedule is not None:
        stages.schedule.saved(ckpt, final)


def restore_checkpoint(run_dir: Path, states: ClientStateStore, history: ClientHistoryStore, stages: StageSet,
                       run: RoundRun) -> Restored:
    """Read the checkpoint back: the client states and the history (verified against their digests), every
    stage's state; the schedule continues last, from the restored server state (``run.server_state``)."""
    ckpt = read_checkpoint(run_dir)
    folder = checkpoint_dir(run_dir)
    restored = Restored(round=int(ckpt["round"]), server_state=ckpt["server_state"], totals=dict(ckpt["totals"]),
                        vectorize=int(ckpt["vectorize"]) if ckpt.get("vectorize") else None)
    states.load(folder, ckpt["client_files"], checksums(ckpt, "clients"))
    history.load(folder, ckpt.get("history", {}), checksums(ckpt, "history"))
    for stage in stages:
        if stage is not stages.schedule:
            stage.load(ckpt)
    run.server_state = restored.server_state
    if stages.schedule is not None:
        stages.schedule.restore(ckpt, folder, run)
    return restored
