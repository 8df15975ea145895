"""What the verbs share: exit codes, when the command started, the run it is running (for the resume hint), how CONFIG
and its overrides are told apart, and what a ``--resume`` may change."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Optional, Sequence

import raysim.interrupts as interrupts
from raysim.errors import UserError

EXIT_USER_ERROR = 2
EXIT_STOPPED = 3
EXIT_TRIALS_FAILED = 1  # a sweep or seed set ran to its end, but some trials failed
EXIT_INTERRUPTED = interrupts.EXIT_INTERRUPTED  # Ctrl-C
EXIT_TERMINATED = interrupts.EXIT_TERMINATED  # SIGTERM (a scheduler preempting the job)
_LAUNCHED = time.perf_counter()  # when the command started (the summary's wall time counts start-up)
_RUN_DIR: list[Path] = []  # the run directory of the current `raysim run`, for the resume hint


def _interrupted() -> str:
    how = "stopped by SIGTERM" if interrupts.terminated() else "interrupted"
    return f"{how}: {interrupts.abandoned()}" if interrupts.abandoned() else how


def _resume_hint(exc: Optional[BaseException], say_round: bool = False) -> str:
    """"; resume with: ..." for the run, seed set or sweep that ``exc`` stopped (None: the run of this `raysim run`),
    as far as it is known; ``say_round``: also which round a run's checkpoint holds (a RunStopped message says so
    itself)."""
    command = getattr(exc, "resume_command", None)  # set by a sweep or seed set
    if command:
        return f"; resume with: {command}"
    run_dir = getattr(exc, "run_dir", None) or (_RUN_DIR[0] if _RUN_DIR else None)
    if run_dir is None:
        return ""
    from raysim.engine.state import has_checkpoint, read_checkpoint

    if not has_checkpoint(Path(run_dir)):
        return "; no round was checkpointed: start the run again"
    done = ""
    if say_round:
        with contextlib.suppress(UserError):
            done = f"round {int(read_checkpoint(Path(run_dir))['round'])} is checkpointed; "
    return f"; {done}resume with: raysim run --resume {run_dir}"



def _exists(path: str) -> bool:
    """``Path(path).exists()``, False where the name cannot be a path at all (a 300-character override)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def _split_config_and_overrides(args: argparse.Namespace) -> tuple[Optional[str], list[str]]:
    """argparse can't tell CONFIG from an override when CONFIG is omitted (``--resume DIR rounds=8``)."""
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not _exists(config):
        overrides.insert(0, config)
        config = None
    return config, overrides



def _plugins(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())



# what a resume may change: what the run is (its length) and how it runs, never what it computes (the single run's
# rule, raysim.engine.runner, stated here for the one-line answer that every kind of resume gives)
RESUMABLE = ("rounds", "eval.every", "eval.chunk", "engine.*", "log.*")


def check_resume_overrides(kind: str, overrides: Sequence[str], target: Path) -> None:
    """``--resume`` of a run (``kind="run"``), a seed set (``"seeds"``) or a sweep (``"sweep"``) with overrides: the
    same rule for all three, answered in one line before anything starts. A run applies the keys of ``RESUMABLE``
    and refuses the rest; a seed set or sweep resumes its runs with the config they started with, so it refuses
    every override, naming the command that applies it to one of its runs."""
    given = [o for o in overrides if "=" in o and not o.startswith("log.dir=")]
    if not given:
        return
    keys = [o.split("=", 1)[0] for o in given]
    if kind == "run":
        bad = [o for o, k in zip(given, keys)
               if not (k in ("rounds", "eval.every", "eval.chunk") or k.startswith(("engine.", "log.")))]
        if bad:
            raise UserError(f"--resume {target}: {' '.join(bad)} would change what the run computes, so a resume "
                            f"refuses it; a resume may change {', '.join(RESUMABLE)} (start a new run for the rest)")
        return
    what = "seed set" if kind == "seeds" else "sweep"
    one = next(iter(sorted(target.glob("seed-*" if kind == "seeds" else "trials/*"))), None)
    example = one if one is not None else target / ("seed-0" if kind == "seeds" else "trials/<trial>")
    raise UserError(f"--resume {target}: a {what} resumes its runs with the config they started with, so it "
                    f"applies no override ({' '.join(given)}); resume one of its runs alone to change "
                    f"{', '.join(RESUMABLE)}: raysim run --resume {example} {' '.join(given)}")
