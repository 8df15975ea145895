"""``raysim tune`` and ``raysim run --seeds``: every Ray Tune trial is one whole raysim run.

A trial reserves its driver and workers with a placement group (bundle 0 for the driver, one bundle per worker), so
concurrent trials share a cluster without oversubscribing it; requests the cluster can never satisfy are refused up
front, since Tune would otherwise leave such trials pending for ever. Trials report every round with
``ray.tune.report`` (ASHA stops poor ones early, counting rounds) and write ordinary raysim run directories inside
the sweep directory, so ``raysim report`` and TensorBoard work on them as on any run.

Sweep directory layout::

    SWEEP_DIR/sweep.yaml          the resolved sweep (what --resume reads back)
    SWEEP_DIR/trials/<trial>/     one raysim run directory per trial (seeds: seed-<n>/)
    SWEEP_DIR/tune/               Ray Tune's experiment state (Tuner.restore)
    SWEEP_DIR/results.csv, .md    every trial: searched values, best metric, rounds run, status
    SWEEP_DIR/best.yaml           the best trial's config, ready for ``raysim run``
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import io
import json
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml

from raysim.config import ExperimentConfig, load_config, to_yaml
from raysim.dirlock import DirLock
from raysim.errors import UserError

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
SCHEDULERS = ("fifo", "asha", "hyperband", "median")
# each scheduler's keys besides name (ASHA's may stay in a file run with another scheduler: ignored there)
SCHEDULER_KEYS = ("grace_period", "reduction_factor", "min_samples_required")
SEARCHERS = ("random", "optuna")
# what every run's metrics.jsonl holds (numeric), besides algorithm extras such as FAPD's k, UNIDEAL's p and loss_<part>
RUN_METRICS = ("acc_mean", "acc_global", "loss", "bytes_up", "bytes_down", "bytes_up_total", "bytes_down_total",
               "wall_s", "wall_s_total", "k", "p")
# top-level keys of a sweep file; an override whose first segment is one of these sets the sweep, not the experiment
SWEEP_KEYS = ("base", "metric", "mode", "num_samples", "scheduler", "search", "max_concurrent", "dir", "fixed",
              "space")


class SweepError(UserError):
    """A sweep file or a sweep override is wrong."""


@dataclass
class SweepSpec:
    """A resolved sweep: which experiment, what to search, how to schedule; saved as ``sweep.yaml``."""

    base: Optional[str]  # experiment config (absolute path); None: the built-in defaults
    space: dict[str, dict[str, list]] = field(default_factory=dict)  # dotted key -> {distribution: args}
    fixed: list[str] = field(default_factory=list)  # dotted overrides applied to every trial
    metric: str = "acc_mean"
    mode: str = "max"
    num_samples: int = 1
    scheduler: dict[str, Any] = field(default_factory=lambda: {"name": "fifo"})
    search: dict[str, Any] = field(default_factory=lambda: {"name": "random"})  # random (and grid) | optuna (TPE)
    max_concurrent: Optional[int] = None
    dir: Optional[str] = None
    naming: str = "trial"  # "trial": trials/<trial_id>; "seed": seed-<n> (raysim run --seeds)

    def trials_dir(self, sweep_dir: Path) -> Path:
        """Seeds sit right under their parent (PARENT/seed-3); sweep trials under SWEEP_DIR/trials/."""
        return sweep_dir if self.naming == "seed" else sweep_dir / "trials"

    def total_trials(self) -> int:
        grids = [len(d["grid"]) for d in self.space.values() if "grid" in d]
        return self.num_samples * math.prod(grids) if grids else self.num_samples


# ---------------------------------------------------------------------------------------------- reading sweeps


def load_sweep(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SweepSpec:
    """Read a sweep file; ``overrides`` whose first segment is a sweep key set the sweep, the rest the experiment."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SweepError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file must be a mapping of keys")
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise SweepError(f"sweep key '{unknown[0]}' is unknown (known: {', '.join(SWEEP_KEYS)})")
    if "base" not in raw:
        raise SweepError(f"{path}: sweep key 'base' (the experiment config to start from) is missing")
    experiment_overrides = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SweepError(f"override '{item}' must look like dotted.key=value")
        head = key.split(".")[0]
        if head in ("space", "fixed", "base"):
            raise SweepError(f"override '{item}': change '{head}' in the sweep file")
        if head in SWEEP_KEYS:
            _set_dotted(raw, key, yaml.safe_load(value))
        else:
            experiment_overrides.append(item)
    base = (path.parent / str(raw["base"])).resolve()
    if not base.is_file():
        raise SweepError(f"sweep key 'base': experiment config not found: {base}")
    space = flatten_space(raw.get("space") or {})
    fixed = [f"{k}={json.dumps(v)}" for k, v in _flatten(raw.get("fixed") or {}, "fixed").items()]
    for item in experiment_overrides:  # a command-line value fixes a searched key
        space.pop(item.partition("=")[0], None)
    scheduler = raw.get("scheduler", "fifo")
    scheduler = {"name": scheduler} if isinstance(scheduler, str) else dict(scheduler)
    search = raw.get("search", "random")
    search = {"name": search} if isinstance(search, str) else dict(search)
    spec = SweepSpec(base=str(base), space=space, fixed=fixed + experiment_overrides,
                     metric=raw.get("metric", "acc_mean"), mode=raw.get("mode", "max"),
                     num_samples=raw.get("num_samples", 1), scheduler=scheduler, search=search,
                     max_concurrent=raw.get("max_concurrent"), dir=raw.get("dir"))
    check_spec(spec)
    return spec


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        node = tree.get(part)
        if not isinstance(node, dict):
            node = {"name": node} if part in ("scheduler", "search") and isinstance(node, str) else {}
            tree[part] = node
        tree = node
    tree[parts[-1]] = value


def _flatten(tree: dict, where: str, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        raise SweepError(f"sweep key '{where}' must be a mapping of dotted config keys")
    out: dict[str, Any] = {}
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, where, full + "."))
        else:
            out[full] = value
    return out


def flatten_space(tree: dict, prefix: str = "") -> dict[str, dict[str, list]]:
    """``{train: {lr: {loguniform: [a, b]}}}`` or ``{train.lr: {loguniform: [a, b]}}`` -> ``{"train.lr": {...}}``."""
    if not isinstance(tree, dict):
        raise SweepError("sweep key 'space' must map dotted config keys to distributions")
    out: dict[str, dict[str, list]] = {}
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in DISTRIBUTIONS:
            kind, args = next(iter(value.items()))
            _check_distribution(full, kind, args)
            out[full] = {kind: list(args)}
        elif isinstance(value, dict) and value and not (set(value) & set(DISTRIBUTIONS)):
            out.update(flatten_space(value, full + "."))
        else:
            raise SweepError(f"sweep key 'space.{full}': give one distribution, e.g. {{choice: [a, b]}} "
                             f"(one of {', '.join(DISTRIBUTIONS)})")
    return out


def _check_distribution(key: str, kind: str, args: Any) -> None:
    where = f"sweep key 'space.{key}'"
    if not isinstance(args, list) or not args:
        raise SweepError(f"{where}: {kind} needs a non-empty list")
    if kind in ("uniform", "loguniform", "randint"):
        if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
            raise SweepError(f"{where}: {kind} needs [low, high]")
        if not args[0] < args[1]:
            raise SweepError(f"{where}: {kind} needs low < high, got {args}")
        if kind == "loguniform" and args[0] <= 0:
            raise SweepError(f"{where}: loguniform needs low > 0, got {args[0]}")
        if kind == "randint" and not all(isinstance(a, int) for a in args):
            raise SweepError(f"{where}: randint needs integers [low, high) , got {args}")


def check_spec(spec: SweepSpec) -> None:
    if not isinstance(spec.metric, str) or not (spec.metric in RUN_METRICS or spec.metric.startswith("loss_")):
        raise SweepError(f"sweep key 'metric': any numeric metric of metrics.jsonl ({', '.join(RUN_METRICS)}, "
                         f"loss_<part>), got {spec.metric!r}")
    if spec.mode not in ("max", "min"):
        raise SweepError(f"sweep key 'mode': must be max or min, got {spec.mode!r}")
    if not isinstance(spec.num_samples, int) or spec.num_samples < 1:
        raise SweepError(f"sweep key 'num_samples': must be an integer >= 1, got {spec.num_samples!r}")
    if spec.scheduler.get("name") not in SCHEDULERS:
        raise SweepError(f"sweep key 'scheduler.name': must be one of {', '.join(SCHEDULERS)}, "
                         f"got {spec.scheduler.get('name')!r}")
    # a scheduler's keys may stay in a file run with another scheduler (they are ignored there)
    extra = sorted(set(spec.scheduler) - {"name", *SCHEDULER_KEYS})
    if extra:
        raise SweepError(f"sweep key 'scheduler.{extra[0]}' is unknown (known: name, {', '.join(SCHEDULER_KEYS)})")
    for key, low in (("grace_period", 1), ("reduction_factor", 2), ("min_samples_required", 1)):
        value = spec.scheduler.get(key, low)
        if not isinstance(value, int) or value < low:
            raise SweepError(f"sweep key 'scheduler.{key}': must be an integer >= {low}, got {value!r}")
    search = spec.search.get("name") if isinstance(spec.search, dict) else None
    if search not in SEARCHERS:
        raise SweepError(f"sweep key 'search.name': must be one of {', '.join(SEARCHERS)}, got {search!r}")
    extra = sorted(set(spec.search) - {"name", "seed", "startup_trials"})
    if extra:
        raise SweepError(f"sweep key 'search.{extra[0]}' is unknown (known: name, seed, startup_trials)")
    if search == "optuna":
        grids = [k for k, d in spec.space.items() if "grid" in d]
        if grids:
            raise SweepError(f"sweep key 'space.{grids[0]}': Optuna samples, it does not enumerate grids; use "
                             f"choice instead of grid (or search.name=random)")
    if spec.max_concurrent is not None and (not isinstance(spec.max_concurrent, int) or spec.max_concurrent < 1):
        raise SweepError(f"sweep key 'max_concurrent': must be an integer >= 1, got {spec.max_concurrent!r}")


def spec_to_yaml(spec: SweepSpec) -> str:
    return yaml.safe_dump(dataclasses.asdict(spec), sort_keys=False)


def spec_from_yaml(path: Path) -> SweepSpec:
    if not path.is_file():
        raise SweepError(f"{path.parent} is not a sweep directory (no {path.name})")
    return SweepSpec(**yaml.safe_load(path.read_text()))


# ---------------------------------------------------------------------------------------------- validating


def candidate_overrides(spec: SweepSpec) -> list[list[str]]:
    """Trial overrides that together touch every searched value (and both ends of every range)."""
    values = {}
    for key, dist in spec.space.items():
        kind, args = next(iter(dist.items()))
        values[key] = [args[0], args[1] - 1] if kind == "randint" else args  # randint's high is exclusive
    first = {key: vals[0] for key, vals in values.items()}
    out = [[_override(k, v) for k, v in first.items()]]
    for key, vals in values.items():
        for value in vals[1:]:
            out.append([_override(k, value if k == key else v) for k, v in first.items()])
    return out


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML: strings stay strings, lists stay lists


def validate_sweep(spec: SweepSpec) -> ExperimentConfig:
    """Load every candidate config (bad keys and values fail here, naming the key), check the metric exists.

    Returns the first candidate's config; resources are checked by :func:`check_cluster` once Ray is up.
    """
    from raysim.registry import get_algorithm

    configs = []
    for trial in candidate_overrides(spec):
        try:
            configs.append(load_config(spec.base, spec.fixed + trial))
        except UserError as exc:
            raise type(exc)(f"{exc} (with {' '.join(trial) or 'the base config'})") from None
    if spec.metric == "acc_global":
        for cfg in configs:
            if not get_algorithm(cfg.algorithm.name)(cfg).has_global_model:
                raise SweepError(f"sweep key 'metric': {cfg.algorithm.name} has no global model, so no acc_global; "
                                 f"use metric: acc_mean")
    if spec.scheduler["name"] in ("asha", "median"):
        rounds = min(cfg.rounds for cfg in configs)
        if spec.scheduler.get("grace_period", 1) > rounds:
            raise SweepError(f"sweep key 'scheduler.grace_period': {spec.scheduler['grace_period']} rounds, but "
                             f"trials run only {rounds}")
    return configs[0]


def check_cluster(spec: SweepSpec) -> None:
    """Refuse, before Tune starts, any trial that could never be placed (Tune would wait for it for ever)."""
    from raysim.engine.resources import check_resources

    for trial in candidate_overrides(spec):
        check_resources(load_config(spec.base, spec.fixed + trial).engine)


def trial_bundles(engine: Any) -> list[dict[str, float]]:
    """Bundle 0: the driver's CPUs, held by the Tune trial's actor (the driver itself runs on the launch node:
    ``raysim.engine.placement``); then one bundle per worker.

    With ``driver_cpus = 0`` the head bundle is empty and Tune leaves it out of the group; the trial's actor then
    sits, using nothing, in the first worker's bundle (the runner/driver place workers in the group's last bundles).
    """
    head = {"CPU": float(engine.driver_cpus)} if engine.driver_cpus else {}
    worker = {"CPU": float(engine.cpus_per_worker)}
    if engine.gpus_per_worker:
        worker["GPU"] = float(engine.gpus_per_worker)
    return [head] + [dict(worker) for _ in range(engine.num_workers)]


# ---------------------------------------------------------------------------------------------- trials


@dataclass(frozen=True)
class TrialSetup:
    """What every trial needs besides its sampled values; shipped to the trial with the trainable."""

    base: Optional[str]
    fixed: tuple[str, ...]
    trials_dir: str
    cwd: str
    naming: str
    launch_node: str = ""  # Ray node id where the sweep was started: trials' run directories live there

    def run_dir(self, values: dict, trial_id: str) -> Path:
        name = f"seed-{values['seed']}" if self.naming == "seed" else trial_id
        return Path(self.trials_dir) / name

    def config(self, values: dict, run_dir: Optional[Path] = None) -> ExperimentConfig:
        extra = [_override(k, v) for k, v in values.items()]
        if run_dir is not None:
            extra += [f"log.dir={run_dir}", "log.progress=false"]
        return load_config(self.base, list(self.fixed) + extra)


ERROR_FILE = "error.txt"  # in a failed trial's run directory: its one-line cause, for the console and the table


def run_trial(values: dict, setup: TrialSetup) -> None:
    """The Tune trainable: one raysim run whose workers use the trial's placement group, reporting every round.

    The trial's actor may run on any node; the run itself (run directory, driver) runs on the node where the sweep
    was started (``raysim.engine.placement``), and this relays its rounds to Tune.
    """
    import ray
    from ray import tune

    from raysim.engine.placement import trial_host

    with trial_host(setup.launch_node) as stream:
        for row in stream(run_trial_on_launch_node, values, setup, tune.get_context().get_trial_id(),
                          ray.util.get_current_placement_group()):
            tune.report(row)


def run_trial_on_launch_node(values: dict, setup: TrialSetup, trial_id: str, placement_group: Any, *,
                             report: Callable[[dict], None], on_start: Callable[[dict], None],
                             stopped: Callable[[], bool]) -> None:
    """A trial's raysim run, on the node that holds the sweep directory; ``report`` sends a row to Tune.

    A trial restarted by ``Tuner.restore`` (after Ctrl-C or a kill) or by Tune on another node finds its run
    directory's checkpoint and continues from it; one whose run had already ended (killed before Tune recorded it)
    reports its last round again and runs nothing. A failure leaves its one-line cause in ``error.txt`` and is
    raised to Tune.
    """
    from raysim.engine.placement import TrialStopped
    from raysim.engine.runner import run_experiment
    from raysim.runlog import read_metrics

    with contextlib.suppress(OSError):
        os.chdir(setup.cwd)  # relative paths in configs mean the user's cwd
    run_dir = setup.run_dir(values, trial_id)
    try:
        cfg = setup.config(values, run_dir)
        resume = (run_dir / "checkpoint" / "server.pt").is_file()
        if not resume and run_dir.exists():
            shutil.rmtree(run_dir)  # an earlier attempt that never completed a round
        (run_dir / ERROR_FILE).unlink(missing_ok=True)
        done = _checkpointed_round(run_dir) if resume else 0
        rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["round"] <= done]
        last: dict[str, float] = {}

        def carry(m: dict) -> dict:
            row = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v)}
            last.update(row)  # every metric carried over rounds without it (eval.every > 1): schedulers always see it
            return dict(last)

        for m in rows:  # what the rounds already run measured, so the first report after a resume has the metric
            carry(m)
        if rows and done >= cfg.rounds:  # the run ended before the sweep was killed: report it, run nothing
            report(carry(rows[-1]))
            return
        run_experiment(cfg, resume=resume, on_round=lambda m: report(carry(m)), on_start=on_start,
                       placement_group=placement_group)
    except BaseException as exc:
        if not (isinstance(exc, TrialStopped) or stopped()):  # Tune ending a trial (a scheduler stopped or paused
            _record_error(run_dir, exc)  # it) is not a failure, whatever error ending its driver caused
        raise


def _record_error(run_dir: Path, exc: BaseException) -> None:
    with contextlib.suppress(OSError):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ERROR_FILE).write_text(one_line_cause(exc) + "\n")


def _checkpointed_round(run_dir: Path) -> int:
    from raysim.engine.state import read_checkpoint

    try:
        return int(read_checkpoint(run_dir)["round"])
    except (UserError, OSError):
        return 0  # run_experiment reports the damage


def one_line_cause(exc: BaseException) -> str:
    """The innermost cause of an error raised through Ray, as one line: ``RuntimeError: what went wrong``."""
    from raysim.errors import find_user_error

    found = find_user_error(exc)
    if found is not None:
        return str(found).splitlines()[0] if str(found) else type(found).__name__
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)  # RayTaskError keeps the original exception here
        if isinstance(cause, BaseException):
            exc = cause
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            break
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _trial_resources(values: dict, setup: TrialSetup) -> Any:
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory(trial_bundles(setup.config(values).engine), strategy="PACK")


def _param_space(spec: SweepSpec) -> dict[str, Any]:
    from ray import tune

    make = {"choice": tune.choice, "grid": tune.grid_search, "uniform": lambda a: tune.uniform(*a),
            "loguniform": lambda a: tune.loguniform(*a), "randint": lambda a: tune.randint(*a)}
    return {key: make[kind](args) for key, dist in spec.space.items() for kind, args in dist.items()}


# ---------------------------------------------------------------------------------------------- progress


class _Progress:
    """Console lines a person can follow: each trial's rounds, and trials done out of total with the best so far."""

    def __init__(self, spec: SweepSpec, total: int, rounds: int, quiet: bool, done: tuple[str, ...] = (),
                 run_dir: Optional[Callable[[Any], Path]] = None):
        self.spec, self.total, self.rounds, self.quiet = spec, total, rounds, quiet
        self.done = set(done)  # trial ids that ended (a resumed sweep starts with those ended before)
        self.run_dir = run_dir
        self.best: Optional[tuple[float, str]] = None
        self.per_trial: dict[str, float] = {}  # each trial's best so far (seeds: their mean is the news)
        self.start = time.monotonic()

    def label(self, trial: Any) -> str:
        if self.spec.naming == "seed":
            return f"seed {trial.config.get('seed')}"
        values = " ".join(f"{k}={_fmt(v)}" for k, v in trial.config.items())
        return f"trial {trial.trial_id}" + (f" ({values})" if values else "")

    def result(self, trial: Any, result: dict) -> None:
        value = result.get(self.spec.metric)
        if value is not None and (self.best is None or _better(value, self.best[0], self.spec.mode)):
            self.best = (value, self.label(trial))
        old = self.per_trial.get(trial.trial_id)
        if value is not None and (old is None or _better(value, old, self.spec.mode)):
            self.per_trial[trial.trial_id] = value
        if not self.quiet:
            from raysim.runlog import format_round

            if "loss" in result and "bytes_up" in result:
                line = format_round({k: result.get(k) for k in (
                    "round", "acc_mean", "acc_global", "loss", "k", "bytes_up", "bytes_down", "wall_s")
                    if k in result}, self.rounds)
                print(f"[{self.label(trial)}] {line}", flush=True)

    def started(self, trial: Any) -> None:
        if not self.quiet:
            print(f"raysim: started {self.label(trial)}", flush=True)

    def finished(self, trial: Any, failed: bool) -> None:
        if trial.trial_id in self.done and not failed:
            return  # ended before a kill that Tune's state missed: counted, and re-reported without running
        self.done.add(trial.trial_id)
        best = (f"; best {self.spec.metric} {self.best[0]:.4f} ({self.best[1]})" if self.best else "")
        if self.spec.naming == "seed" and self.per_trial:
            import numpy as np

            values = list(self.per_trial.values())
            sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            best = (f"; best {self.spec.metric} so far {np.mean(values):.4f} ± {sd:.4f} over {len(values)} "
                    f"seed{'s' if len(values) > 1 else ''}")
        last = (getattr(trial, "last_result", None) or {}).get("round")
        what = ("failed" if failed else f"stopped early after round {last}" if last and last < self.rounds
                else "finished")
        if failed:
            cause = trial_error(self.run_dir(trial)) if self.run_dir else None
            what = f"failed: {cause or 'see ' + str(getattr(trial, 'error_file', None) or 'Tune error file')}"
        print(f"raysim: {len(self.done)}/{self.total} {'seeds' if self.spec.naming == 'seed' else 'trials'} done "
              f"({self.label(trial)} {what}, {time.monotonic() - self.start:.0f}s elapsed){best}", flush=True)


def _progress_callback(progress: _Progress) -> Any:
    from ray.tune import Callback

    class ProgressCallback(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            progress.started(trial)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            progress.result(trial, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            progress.finished(trial, failed=False)

        def on_trial_error(self, iteration, trials, trial, **info):
            progress.finished(trial, failed=True)

    return ProgressCallback()


def _better(a: float, b: float, mode: str) -> bool:
    return a > b if mode == "max" else a < b


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# ---------------------------------------------------------------------------------------------- running


@contextlib.contextmanager
def _tune_env() -> Iterator[None]:
    """raysim writes each trial's TensorBoard events itself; Tune's own TensorBoard logger would duplicate them."""
    saved = {k: os.environ.get(k) for k in ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "RAY_AIR_NEW_OUTPUT")}
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_sweep(spec: SweepSpec, *, sweep_dir: Optional[Path] = None, resume: bool = False, quiet: bool = False,
              out: Callable[[str], None] = print) -> "SweepResult":
    """Run (or resume) a sweep to the end and write its table, best config and HParams; returns the table.

    The sweep directory is locked while this runs (``raysim.dirlock``): a second sweep into it, or a ``--resume``
    of it while it runs, is refused; a lock left by a killed sweep is gone with its process."""
    first = validate_sweep(spec)
    sweep_dir = Path(sweep_dir or spec.dir or default_sweep_dir(spec)).resolve()
    key = "log.dir" if spec.naming == "seed" else "dir"
    if resume and not sweep_dir.is_dir():
        raise SweepError(f"{sweep_dir} holds no sweep to resume (no such directory)")
    created = not sweep_dir.exists()
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SweepError(f"cannot create sweep directory {sweep_dir} ({exc.strerror})") from None
    # claimed before it is checked: of two sweeps started together into one directory, one runs, one is refused
    with DirLock(sweep_dir, key=key):
        try:
            resume = _check_sweep_dir(spec, sweep_dir, resume)
        except BaseException:
            if created:
                shutil.rmtree(sweep_dir, ignore_errors=True)
            raise
        try:
            return _run_sweep_locked(spec, first, sweep_dir, resume, quiet, out)
        except UserError:  # refused before Tune started (the cluster can never place a trial): leave nothing
            if created and not (sweep_dir / "tune").exists():
                shutil.rmtree(sweep_dir, ignore_errors=True)
            raise


def _check_sweep_dir(spec: SweepSpec, sweep_dir: Path, resume: bool) -> bool:
    """Check (and prepare) the sweep directory; returns whether Tune's state is to be restored."""
    tune_dir = sweep_dir / "tune"
    if resume and not _tune_state_restorable(tune_dir):
        if not (sweep_dir / "sweep.yaml").is_file():
            raise SweepError(f"{sweep_dir} holds no sweep to resume (no Tune state in {tune_dir})")
        # killed before Tune saved any state: no trial is on record, so the sweep starts again from sweep.yaml.
        # Seeds keep their run directories (seed-<n> names the same run again: a done one is not rerun); sweep
        # trials get new ids, so their directories from the lost attempt go.
        shutil.rmtree(tune_dir, ignore_errors=True)
        if spec.naming != "seed":
            shutil.rmtree(spec.trials_dir(sweep_dir), ignore_errors=True)
        resume = False
    elif not resume and tune_dir.exists():
        raise SweepError(f"{sweep_dir} already holds a sweep; continue it with --resume {sweep_dir} "
                         f"or choose another directory")
    try:
        spec.trials_dir(sweep_dir).mkdir(parents=True, exist_ok=True)
        write_atomically(sweep_dir / "sweep.yaml", spec_to_yaml(dataclasses.replace(spec, dir=str(sweep_dir))))
    except OSError as exc:
        raise SweepError(f"cannot write sweep directory {sweep_dir} ({exc.strerror})") from None
    return resume


def _tune_state_restorable(tune_dir: Path) -> bool:
    """Whether ``Tuner.restore`` can read ``tune_dir``. Tune writes its state files in place, so a kill can tear
    one: a torn newest experiment state is removed (the one before it, and the trials' run directories, which hold
    the truth about each trial, are enough to go on); a torn or missing ``tuner.pkl`` means nothing ever ran."""
    import pickle

    try:
        pickle.loads((tune_dir / "tuner.pkl").read_bytes())
    except Exception:  # noqa: BLE001 - missing, torn, or from another version: not restorable
        return False
    for state in sorted(tune_dir.glob("experiment_state-*.json"), reverse=True):
        try:
            json.loads(state.read_text())
            return True
        except (OSError, ValueError):
            state.unlink(missing_ok=True)
    return False


def _run_sweep_locked(spec: SweepSpec, first: ExperimentConfig, sweep_dir: Path, resume: bool, quiet: bool,
                      out: Callable[[str], None]) -> "SweepResult":
    import ray
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from raysim.engine.placement import this_node
    from raysim.engine.resources import ray_session

    tune_dir = sweep_dir / "tune"
    spec = dataclasses.replace(spec, dir=str(sweep_dir))

    total = spec.total_trials()
    done = tuple(r["trial_id"] for r in collect_trials(spec, sweep_dir)
                 if r["status"] in ("done", "stopped")) if resume else ()  # errored trials run again
    progress = _Progress(spec, total, first.rounds, quiet, done=done,
                         run_dir=lambda trial: trial_run_dir(spec, sweep_dir, trial.trial_id, trial.config))
    with ray_session(first.engine, first.plugins):
        check_cluster(spec)
        setup = TrialSetup(base=spec.base, fixed=tuple(spec.fixed), trials_dir=str(spec.trials_dir(sweep_dir)),
                           cwd=os.getcwd(), naming=spec.naming, launch_node=this_node())
        trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup),
                                        functools.partial(_trial_resources, setup=setup))
        cpus = ray.cluster_resources().get("CPU", 0)
        what = f"{total} seeds" if spec.naming == "seed" else f"sweep of {total} trials"
        out(f"raysim: {'resuming' if resume else 'starting'} {what} ({first.algorithm.name} on {first.data.name}, "
            f"{first.rounds} rounds each, {spec.scheduler['name']}) on {cpus:g} CPUs; directory {sweep_dir}")
        with _tune_env():
            callbacks = [_progress_callback(progress), CSVLoggerCallback(), JsonLoggerCallback()]
            if resume:
                with _quiet_tune_logs():  # trials that never reported have no result.json: Tune warns of that
                    tuner = tune.Tuner.restore(str(tune_dir), trainable, resume_unfinished=True,
                                               resume_errored=True)
            else:
                tuner = tune.Tuner(
                    trainable, param_space=_param_space(spec),
                    tune_config=tune.TuneConfig(metric=spec.metric, mode=spec.mode, num_samples=spec.num_samples,
                                                scheduler=_scheduler(spec, first.rounds),
                                                search_alg=_searcher(spec),
                                                max_concurrent_trials=spec.max_concurrent,
                                                trial_dirname_creator=lambda trial: trial.trial_id),
                    run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir), verbose=0,
                                              callbacks=callbacks))
            # Tuner.restore keeps the original run config; the progress callback has to be re-attached
            if resume:
                tuner._local_tuner.get_run_config().callbacks = callbacks  # noqa: SLF001 - no public setter
            with _one_line_trial_errors():
                tuner.fit()
    return finish_sweep(spec, sweep_dir)


@contextlib.contextmanager
def _one_line_trial_errors() -> Iterator[None]:
    """Tune logs each failed trial's whole traceback; raysim prints its one-line cause (the traceback stays in the
    trial's ``error.txt`` under the Tune directory)."""
    import logging

    def drop(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Trial task failed")

    log = logging.getLogger("ray.tune.execution.tune_controller")
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def _scheduler(spec: SweepSpec, rounds: int) -> Any:
    """Trial schedulers count rounds: ASHA and HyperBand stop weak trials at rungs, median stopping stops a trial
    whose best so far is below the median of the others' running averages at the same round."""
    name, opts = spec.scheduler["name"], spec.scheduler
    if name == "fifo":
        return None
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler, MedianStoppingRule

    if name == "hyperband":
        return HyperBandScheduler(time_attr="round", max_t=rounds, reduction_factor=opts.get("reduction_factor", 2))
    if name == "median":
        return MedianStoppingRule(time_attr="round", grace_period=opts.get("grace_period", 1),
                                  min_samples_required=opts.get("min_samples_required", 3))
    return ASHAScheduler(time_attr="round", max_t=rounds, grace_period=opts.get("grace_period", 1),
                         reduction_factor=opts.get("reduction_factor", 2))


def _searcher(spec: SweepSpec) -> Any:
    """None: Tune's own random/grid generator. Optuna: TPE through Tune's OptunaSearch adapter; Tune saves its
    state with the experiment, so ``--resume`` continues the same study."""
    search = spec.search if isinstance(spec.search, dict) else {"name": "random"}
    if search.get("name", "random") == "random":
        return None
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=search.get("seed"),
                                         n_startup_trials=int(search.get("startup_trials", 5)))
    return OptunaSearch(sampler=sampler)


def default_sweep_dir(spec: SweepSpec) -> Path:
    stem = Path(spec.base).stem if spec.base else "defaults"
    kind = "seeds" if spec.naming == "seed" else "sweep"
    return Path("runs") / f"{stem}-{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


# ---------------------------------------------------------------------------------------------- results


@dataclass
class SweepResult:
    sweep_dir: Path
    rows: list[dict]  # one per trial, best first
    best: Optional[dict]
    table_md: str


def collect_trials(spec: SweepSpec, sweep_dir: Path) -> list[dict]:
    """One row per trial from Tune's experiment state and the trial's run directory, best first."""
    from raysim.runlog import read_metrics

    trials = _tune_trials(sweep_dir / "tune")
    rows = []
    for trial in trials:
        values = {k: trial["config"].get(k) for k in spec.space}
        run_dir = trial_run_dir(spec, sweep_dir, trial["trial_id"], trial["config"])
        metrics = read_metrics(run_dir / "metrics.jsonl")
        scored = [m for m in metrics if m.get(spec.metric) is not None]
        best = (max if spec.mode == "max" else min)(scored, key=lambda m: m[spec.metric]) if scored else None
        rounds = _total_rounds(run_dir)
        ran = metrics[-1]["round"] if metrics else 0
        cause = trial_error(run_dir)
        if trial["status"] == "ERROR" or (cause and trial["status"] != "TERMINATED"):
            status = f"error: {cause}" if cause else "error"
        elif rounds is not None and ran >= rounds:
            status = "done"
        elif trial["status"] in ("TERMINATED", "PAUSED"):
            status = "stopped"  # by the scheduler (ASHA, median stopping; HyperBand pauses the trials it drops)
        else:
            status = "unfinished"  # the sweep was interrupted; --resume continues it
        rows.append({"trial": run_dir.name if spec.naming == "seed" else trial["trial_id"],
                     "trial_id": trial["trial_id"], **values,
                     f"best_{spec.metric}": best[spec.metric] if best else None,
                     "best_round": best["round"] if best else None,
                     "rounds": f"{ran}/{rounds if rounds is not None else '?'}", "status": status,
                     "run_dir": str(run_dir)})
    key = f"best_{spec.metric}"
    sign = -1 if spec.mode == "max" else 1
    if spec.naming == "seed":
        rows.sort(key=lambda r: r.get("seed", 0))
    else:
        rows.sort(key=lambda r: (r[key] is None, sign * (r[key] or 0.0), r["trial"]))
    return rows


def trial_run_dir(spec: SweepSpec, sweep_dir: Path, trial_id: str, config: dict) -> Path:
    return spec.trials_dir(sweep_dir) / (f"seed-{config.get('seed')}" if spec.naming == "seed" else trial_id)


def trial_error(run_dir: Path) -> Optional[str]:
    """A failed trial's one-line cause (``error.txt`` in its run directory), or None."""
    try:
        text = (run_dir / ERROR_FILE).read_text().strip()
    except OSError:
        return None
    return text.splitlines()[0] if text else None


def _tune_trials(tune_dir: Path) -> list[dict]:
    """Trial id, status and sampled values of every trial Tune knows of (its experiment state is the record)."""
    if not tune_dir.is_dir():
        return []
    from ray.tune import ExperimentAnalysis

    with _quiet_tune_logs():
        analysis = ExperimentAnalysis(str(tune_dir))
    return [{"trial_id": t.trial_id, "status": t.status, "config": dict(t.config)} for t in analysis.trials]


@contextlib.contextmanager
def _quiet_tune_logs() -> Iterator[None]:
    import logging

    log = logging.getLogger("ray.tune")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _total_rounds(run_dir: Path) -> Optional[int]:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    return int((yaml.safe_load(path.read_text()) or {}).get("rounds", 0)) or None


def finish_sweep(spec: SweepSpec, sweep_dir: Path) -> SweepResult:
    """Write results.csv, results.md, best.yaml and each trial's HParams."""
    rows = collect_trials(spec, sweep_dir)
    columns = ["trial", *spec.space, f"best_{spec.metric}", "best_round", "rounds", "status", "run_dir"]
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in columns})
    write_atomically(sweep_dir / "results.csv", buf.getvalue())
    md_columns = [c for c in columns if c != "run_dir"]
    table = markdown_table(md_columns, [[_fmt(row[c]) if c in spec.space else _cell(row[c]) for c in md_columns]
                                        for row in rows])
    scored = [r[f"best_{spec.metric}"] for r in rows if r[f"best_{spec.metric}"] is not None]
    # seeds repeat one config: their summary is a mean, and no seed is "the best config"
    best = None if spec.naming == "seed" else next((r for r in rows if r[f"best_{spec.metric}"] is not None), None)
    kind = "Seeds" if spec.naming == "seed" else "Sweep"
    header = [f"# {kind} {sweep_dir.name}", "",
              f"Base config: `{spec.base or 'built-in defaults'}`; metric: best `{spec.metric}` over rounds "
              f"({spec.mode}); scheduler: {spec.scheduler['name']}; {len(rows)} {kind.lower()}; run directories in "
              f"`{'seed-<n>' if spec.naming == 'seed' else 'trials/<trial>'}/`.", ""]
    if best:
        header += [f"Best: trial `{best['trial']}` with {spec.metric} {best[f'best_{spec.metric}']:.4f} "
                   f"(round {best['best_round']}); config in `best.yaml`.", ""]
    elif spec.naming == "seed" and scored:
        sd = statistics.stdev(scored) if len(scored) > 1 else 0.0
        header += [f"Best {spec.metric}: {statistics.fmean(scored):.4f} ± {sd:.4f} (mean ± std over "
                   f"{len(scored)} seeds).", ""]
    write_atomically(sweep_dir / "results.md", "\n".join(header + [table]) + "\n")
    if best:
        write_best_config(spec, best, sweep_dir / "best.yaml")
    for row in rows:
        write_hparams(Path(row["run_dir"]), {k: row[k] for k in spec.space},
                      {f"hparams/best_{spec.metric}": row[f"best_{spec.metric}"]})
    return SweepResult(sweep_dir=sweep_dir, rows=rows, best=best, table_md=table)


def write_best_config(spec: SweepSpec, best: dict, path: Path) -> None:
    """The best trial's resolved config with its run directory cleared, so ``raysim run best.yaml`` starts afresh."""
    cfg = load_config(Path(best["run_dir"]) / "config.yaml")
    cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=None))
    values = ", ".join(f"{k}={_fmt(best[k])}" for k in spec.space)
    write_atomically(path, f"# best trial {best['trial']} of sweep {path.parent}: {spec.metric} "
                    f"{best[f'best_{spec.metric}']:.4f} at round {best['best_round']}\n"
                    f"# searched: {values}\n"
                    f"# rerun over seeds: raysim run {path} --seeds 0-4\n" + to_yaml(cfg))


def write_atomically(path: Path, text: str) -> None:
    """A kill while the table is written leaves the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_hparams(run_dir: Path, hparams: dict, metrics: dict) -> None:
    """TensorBoard HParams for one trial, in its run directory: ``tensorboard --logdir SWEEP_DIR`` compares trials.

    Besides the given summary metrics, the run's own ``acc/mean`` / ``acc/global`` curves are listed as metrics.
    A rewrite (after --resume) replaces the earlier HParams file.
    """
    if not run_dir.is_dir() or not hparams:
        return
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    for old in run_dir.glob("events.out.tfevents.*.hparams"):
        old.unlink()
    clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in hparams.items()
             if v is not None}
    values = {k: float(v) for k, v in metrics.items() if v is not None}
    names = {**values, "acc/mean": 0.0, "acc/global": 0.0}
    exp, ssi, sei = hparams_summary(clean, names)
    writer = SummaryWriter(str(run_dir), filename_suffix=".hparams")
    try:
        fw = writer._get_file_writer()  # noqa: SLF001 - the documented add_hparams() would open a sub-run
        for summary in (exp, ssi, sei):
            fw.add_summary(summary)
        for key, value in values.items():
            writer.add_scalar(key, value, 0)
    finally:
        writer.close()


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    rows = [[c.replace("|", "\\|") for c in r] for r in rows]  # an error message may hold a '|'
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3g}"
    return str(value)


# ---------------------------------------------------------------------------------------------- seeds


def parse_seeds(text: str) -> list[int]:
    """``0-9``, ``0,3,5`` or a mix (``0-4,10``) -> sorted distinct seeds."""
    seeds: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                seeds.update(range(a, b + 1))
            else:
                seeds.add(int(part))
        except ValueError:
            raise UserError(f"--seeds {text!r}: write seeds as 0-9, 0,3,5 or 0-4,10") from None
    if not seeds or min(seeds) < 0:
        raise UserError(f"--seeds {text!r}: give at least one seed >= 0")
    return sorted(seeds)


def seeds_spec(config: Optional[str | Path], overrides: list[str], seeds: list[int]) -> SweepSpec:
    """One config (None: the defaults) over several seeds, as a grid sweep whose trials are named seed-<n>."""
    if config is not None and not Path(config).is_file():
        raise UserError(f"config file not found: {config}")
    fixed = [o for o in overrides if not o.startswith("seed=")]
    base_cfg = load_config(config, fixed)
    spec = SweepSpec(base=str(Path(config).resolve()) if config else None, space={"seed": {"grid": list(seeds)}},
                     fixed=fixed, metric="acc_mean", naming="seed", dir=base_cfg.log.dir)
    check_spec(spec)
    return spec


def run_seeds(config: Optional[str | Path], overrides: list[str], seeds: list[int], *,
              resume_dir: Optional[Path] = None,
              quiet: bool = False, out: Callable[[str], None] = print) -> SweepResult:
    """``raysim run CONFIG --seeds 0-9``: each seed's run in PARENT/seed-<n>, in parallel where it fits."""
    if resume_dir is not None:
        spec = spec_from_yaml(Path(resume_dir) / "sweep.yaml")
        return run_sweep(spec, sweep_dir=Path(resume_dir), resume=True, quiet=quiet, out=out)
    spec = seeds_spec(config, overrides, seeds)
    return run_sweep(spec, quiet=quiet, out=out)
