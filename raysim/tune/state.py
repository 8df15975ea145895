"""raysim's own record of a sweep, ``SWEEP_DIR/sweep-state.json``: the only sweep state ``--resume`` reads.

Ray Tune keeps its state as pickles (``tuner.pkl``, the searcher's state) and as JSON whose trial fields are
cloudpickled (``experiment_state-*.json``): restoring a Tuner from them runs whatever code they hold, and a digest
kept beside them stops nobody who can write the directory. So raysim records what it needs as plain JSON, read
with ``json`` and checked field by field against the sweep, and a resume builds a fresh Tuner from it
(``raysim.tune.running``); Tune's own files under ``tune/`` are written by Tune and never read by raysim.

The record: the sweep (as in ``sweep.yaml``, which must agree with it), and every trial with its name (its run
directory's), its sampled values, its status and the last value of the sweep's metric that Tune was told. Random
and grid sweeps draw every trial when they start (``drawn``), so a resume runs exactly the trials that were drawn;
an Optuna sweep records each trial as Optuna suggests it, before the trial starts, and a resume tells a new study
the trials that ended. The file is replaced atomically (fsync, rename) by the sweep's own process alone, so a kill
leaves the last whole record.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from raysim.fsutil import atomic_write_text
from raysim.tune.spec import SweepError, SweepSpec, spec_from_dict

STATE_FILE = "sweep-state.json"
STATE_VERSION = 1
TRIAL_KEY = "raysim_trial"  # in a Tune trial's config: the name of the raysim trial (its run directory) it runs
# pending: not ended (not started, or running when the sweep stopped); ended: Tune terminated it (done, or stopped
# by a scheduler); paused: a scheduler paused it (HyperBand); error: it failed. A resume runs every trial that has
# not ended. (Only endings are saved: a start would rewrite the record once more per trial.)
STATUSES = ("pending", "ended", "paused", "error")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # one path component: a trial's run directory is named so
_MAX_STATE_BYTES = 64 << 20


@dataclass
class TrialRecord:
    name: str  # the trial's name in the tables and its run directory's (trials/<name>; seeds: seed-<n>)
    values: dict[str, Any]  # the sampled value of every searched key
    status: str = "pending"
    value: Optional[float] = None  # the last value of the sweep's metric that Tune was told (Optuna is told it)


class SweepState:
    """The record of one sweep; every change is saved before the sweep goes on."""

    def __init__(self, sweep_dir: Path, spec: SweepSpec, trials: list[TrialRecord], drawn: bool):
        self.sweep_dir, self.spec, self.trials, self.drawn = Path(sweep_dir), spec, trials, drawn

    @property
    def path(self) -> Path:
        return self.sweep_dir / STATE_FILE

    def save(self) -> None:
        """The whole record, replaced atomically: compact JSON, one trial a line (a 10,000-seed set is ~1 MB)."""
        head = {"version": STATE_VERSION, "sweep": dataclasses.asdict(self.spec), "drawn": self.drawn}
        trials = ",\n".join(json.dumps(dataclasses.asdict(t), allow_nan=False) for t in self.trials)
        text = json.dumps(head, allow_nan=False)[:-1] + ', "trials": [\n' + trials + "\n]}\n"
        atomic_write_text(self.path, text, fsync=True)

    def find(self, name: str) -> Optional[TrialRecord]:
        return next((t for t in self.trials if t.name == name), None)

    def add(self, name: str, values: dict[str, Any]) -> TrialRecord:
        """Record a trial that a searcher has just suggested, before it starts."""
        record = TrialRecord(name=name, values={k: values[k] for k in self.spec.space})
        self.trials.append(record)
        self.save()
        return record

    def mark(self, name: str, status: str, value: Optional[float] = None) -> None:
        record = self.find(name)
        if record is None:
            return
        value = value if value is not None else record.value
        if (record.status, record.value) != (status, value):
            record.status, record.value = status, value
            self.save()

    def to_run(self) -> list[TrialRecord]:
        """The recorded trials a resume runs (again): every one that has not ended. Those whose run had ended
        before a kill report their last round again and run nothing (``raysim.tune.trials``)."""
        return [t for t in self.trials if t.status != "ended"]

    def new_left(self) -> int:
        """Trials not yet suggested (Optuna's): the sweep's total less those recorded."""
        return 0 if self.drawn else max(0, self.spec.total_trials() - len(self.trials))


def trial_identity(trial: Any) -> tuple[str, dict[str, Any]]:
    """A Tune trial's raysim name and its sampled values (its config without ``TRIAL_KEY``); a trial without one
    (a seed run in this process) is named by its id."""
    return split_trial_config(dict(getattr(trial, "config", None) or {}), str(trial.trial_id))


def split_trial_config(config: dict[str, Any], default: str) -> tuple[str, dict[str, Any]]:
    values = {k: v for k, v in config.items() if k != TRIAL_KEY}
    return str(config.get(TRIAL_KEY) or default), values


def read_state(sweep_dir: Path) -> SweepState:
    """The sweep's record, verified: one line (exit 2) for a missing, damaged or edited one. Nothing in it is
    executed: it is JSON, and every field is checked against the sweep it records."""
    path = sweep_dir / STATE_FILE
    if not path.is_file():
        raise SweepError(_no_state(sweep_dir))

    def refuse(why: str) -> SweepError:
        return SweepError(f"{path} is damaged: {why}; restore it, or start the sweep again in another directory "
                          f"(each trial's run directory can still be resumed alone with raysim run --resume)")

    try:
        if path.stat().st_size > _MAX_STATE_BYTES:
            raise refuse(f"larger than {_MAX_STATE_BYTES >> 20} MB")
        raw = json.loads(path.read_bytes().decode("utf-8"), parse_constant=_no_constant)
    except (OSError, ValueError, RecursionError) as exc:
        raise refuse(f"not JSON ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
        raise refuse(f"not a version-{STATE_VERSION} sweep record")
    if set(raw) != {"version", "sweep", "drawn", "trials"} or not isinstance(raw["drawn"], bool) \
            or not isinstance(raw["trials"], list):
        raise refuse("its keys are not version, sweep, drawn and trials")
    spec = spec_from_dict(raw["sweep"], str(path))
    trials = [_trial(item, spec, refuse) for item in raw["trials"]]
    names = [t.name for t in trials]
    if len(set(names)) != len(names):
        raise refuse("a trial is recorded twice")
    total = spec.total_trials()
    if len(trials) > total or (raw["drawn"] and len(trials) != total):
        raise refuse(f"it records {len(trials)} trials of a sweep of {total}")
    return SweepState(sweep_dir, spec, trials, raw["drawn"])


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _trial(item: Any, spec: SweepSpec, refuse: Any) -> TrialRecord:
    if not isinstance(item, dict) or set(item) != {f.name for f in dataclasses.fields(TrialRecord)}:
        raise refuse("a trial is not a record of name, values, status and value")
    name, values, status, value = item["name"], item["values"], item["status"], item["value"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise refuse(f"trial name {str(name)[:80]!r} is not a plain directory name")
    if status not in STATUSES:
        raise refuse(f"trial {name}'s status {str(status)[:40]!r} is not one of {', '.join(STATUSES)}")
    if value is not None and not _is_number(value):
        raise refuse(f"trial {name}'s metric value {str(value)[:40]!r} is not a finite number")
    if not isinstance(values, dict) or set(values) != set(spec.space):
        raise refuse(f"trial {name}'s values are not one per searched key ({', '.join(spec.space)})")
    for key, dist in spec.space.items():
        if not value_fits(dist, values[key]):
            raise refuse(f"trial {name}'s {key}={str(values[key])[:40]} is not a value of {dist}")
    return TrialRecord(name=name, values=values, status=status, value=value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def value_fits(dist: dict[str, list], value: Any) -> bool:
    """Whether ``value`` can be a draw of the distribution ``dist`` (``{kind: args}`` of a sweep's space)."""
    kind, args = next(iter(dist.items()))
    if kind in ("choice", "grid"):
        return any(type(value) is type(arg) and value == arg for arg in args) or \
            (_is_number(value) and any(_is_number(a) and value == a for a in args))
    if kind == "randint":
        return isinstance(value, int) and not isinstance(value, bool) and args[0] <= value < args[1]
    return _is_number(value) and args[0] <= value <= args[1]


def _no_state(sweep_dir: Path) -> str:
    tune_dir = sweep_dir / "tune"
    if tune_dir.is_dir() and any(tune_dir.iterdir()):
        return (f"{sweep_dir} holds no raysim sweep record ({STATE_FILE}), only Ray Tune's state under {tune_dir}, "
                f"which raysim does not read: Tune keeps it as pickles, and restoring them could run code (a sweep "
                f"made before raysim kept its own record, or not by raysim); start the sweep again in another "
                f"directory (each trial's run directory can still be resumed alone with raysim run --resume)")
    if (sweep_dir / "sweep.yaml").is_file():
        return (f"{sweep_dir} holds a sweep.yaml but no raysim sweep record ({STATE_FILE}), which a sweep writes "
                f"before sweep.yaml: it was not made by this raysim; start the sweep again in another directory")
    return f"{sweep_dir} is not a sweep directory (no {STATE_FILE}): nothing to resume"


def resume_spec(sweep_dir: Path) -> SweepSpec:
    """The sweep that ``--resume SWEEP_DIR`` continues: the one recorded in its state, verified, which
    ``sweep.yaml`` (the copy for people) must agree with. Read before any config is loaded, so before any plugin
    that the sweep names is imported."""
    import yaml

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SweepError(f"{sweep_dir} holds no sweep to resume (no such directory)")
    state = read_state(sweep_dir)
    path = sweep_dir / "sweep.yaml"
    if path.is_file():
        try:
            copy = yaml.safe_load(path.read_text())
        except (OSError, ValueError, yaml.YAMLError):
            copy = None
        recorded = dataclasses.asdict(state.spec)
        if not isinstance(copy, dict) or {k: v for k, v in copy.items() if k != "dir"} != \
                {k: v for k, v in recorded.items() if k != "dir"}:
            differ = sorted(k for k in recorded if k != "dir" and (not isinstance(copy, dict)
                                                                    or copy.get(k) != recorded[k]))
            raise SweepError(f"{path} differs from the sweep recorded in {state.path} (in "
                             f"{', '.join(differ) or 'its keys'}): it was changed since the sweep started, and a "
                             f"resume runs the recorded sweep only; restore it (or remove it: the record is enough)")
    return state.spec


def spec_from_yaml(path: Path) -> SweepSpec:
    """The sweep of ``--resume`` (``path`` is its ``sweep.yaml``): :func:`resume_spec` of its directory."""
    return resume_spec(Path(path).parent)


def state_callback(state: SweepState) -> Any:
    """A Tune callback that keeps the record's statuses: each trial's end or failure is saved as it happens, and
    a scheduler's pause when ``fit()`` ends."""
    from ray.tune import Callback

    metric = state.spec.metric

    def last_value(trial: Any) -> Optional[float]:
        value = (getattr(trial, "last_result", None) or {}).get(metric)
        return float(value) if _is_number(value) else None

    class StateCallback(Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            state.mark(trial_identity(trial)[0], "ended", last_value(trial))

        def on_trial_error(self, iteration, trials, trial, **info):
            state.mark(trial_identity(trial)[0], "error", last_value(trial))

        def on_experiment_end(self, trials, **info):
            for trial in trials:
                if trial.status == "PAUSED":
                    state.mark(trial_identity(trial)[0], "paused", last_value(trial))

    return StateCallback()
