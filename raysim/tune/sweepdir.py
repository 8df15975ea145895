"""The sweep directory on disk: checked and prepared before a sweep starts, with raysim's record of the sweep
(``raysim.tune.state``), which is all that ``--resume`` reads of it."""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

from raysim.tune.results import write_atomically
from raysim.tune.spec import SweepError, SweepSpec, spec_to_yaml
from raysim.tune.search import draw_trials
from raysim.tune.state import STATE_FILE, SweepState, TrialRecord, read_state


def _check_sweep_dir(spec: SweepSpec, sweep_dir: Path, resume: bool) -> SweepState:
    """Check (and prepare) the sweep directory; returns the sweep's record, verified on a resume, new otherwise.

    A new sweep's record is saved before ``sweep.yaml`` and before Tune starts, so a directory with a
    ``sweep.yaml`` and no record was not made by this raysim."""
    if resume:
        state = read_state(sweep_dir)
        recorded = {k: v for k, v in dataclasses.asdict(state.spec).items() if k != "dir"}
        if recorded != {k: v for k, v in dataclasses.asdict(spec).items() if k != "dir"}:
            raise SweepError(f"{sweep_dir} holds another sweep than the one given (its record, {state.path}, "
                             f"differs); resume it with its own: raysim tune --resume {sweep_dir}")
        state.spec = dataclasses.replace(state.spec, dir=str(sweep_dir))
    elif (sweep_dir / STATE_FILE).exists() or (sweep_dir / "tune").exists():
        raise SweepError(f"{sweep_dir} already holds a sweep; continue it with --resume {sweep_dir} "
                         f"or choose another directory")
    else:
        state = new_state(dataclasses.replace(spec, dir=str(sweep_dir)), sweep_dir)
    try:
        spec.trials_dir(sweep_dir).mkdir(parents=True, exist_ok=True)
        state.save()
        write_atomically(sweep_dir / "sweep.yaml", spec_to_yaml(state.spec))
    except OSError as exc:
        raise SweepError(f"cannot write sweep directory {sweep_dir} ({exc.strerror})") from None
    return state


def new_state(spec: SweepSpec, sweep_dir: Path) -> SweepState:
    """The record of a sweep about to start: random and grid sweeps draw all their trials now."""
    drawn = spec.search.get("name", "random") == "random"
    prefix = secrets.token_hex(3)[:5]  # Tune's trial ids look so too: 519b1_00000
    trials = [TrialRecord(name=f"{prefix}_{i:05d}", values=values) for i, values in enumerate(draw_trials(spec))] \
        if drawn else []
    return SweepState(sweep_dir, spec, trials, drawn)
