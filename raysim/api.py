"""The Python API: ``raysim.run``, ``raysim.tune``, ``raysim.report``, ``raysim.load_run`` and ``raysim.warm_workers``.

Each verb does what the command of the same name does and returns an object instead of printing. A run on the
in-process executor (``engine.backend=inline``, or ``auto`` with one worker) starts no Ray; otherwise Ray is started
on the first call (or an already running session is used: ``ray.init(...)`` of your own, a notebook's earlier call)
and is left running, so a notebook pays Ray's start-up (seconds) once; ``ray.shutdown()`` ends it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence, Union

from raysim.config import ExperimentConfig, load_config
from raysim.tables import counted

if TYPE_CHECKING:
    import pandas

ConfigLike = Union[str, Path, dict, ExperimentConfig, None]


@dataclass
class RunResult:
    """One run directory: where it is, its per-round metrics and its resolved config."""

    run_dir: Path
    metrics: "pandas.DataFrame"  # one row per round: what metrics.jsonl holds
    config: ExperimentConfig
    stopped: bool = False  # True when interrupted (Ctrl-C / kernel interrupt) before its last round

    def __repr__(self) -> str:
        last = self.metrics.iloc[-1].to_dict() if len(self.metrics) else {}
        acc = f", acc_mean={last['acc_mean']:.4f}" if last.get("acc_mean") is not None else ""
        return (f"RunResult(run_dir={str(self.run_dir)!r}, rounds={len(self.metrics)}/{self.config.rounds}"
                f"{acc}{', stopped' if self.stopped else ''})")


@dataclass
class TuneResult:
    """A sweep directory: one row per trial (best first), the best trial and its config."""

    sweep_dir: Path
    trials: "pandas.DataFrame"
    best: Optional[dict]
    best_config: Optional[Path]


def _config(config: ConfigLike, overrides: Sequence[str]) -> ExperimentConfig:
    """A path, a nested dict, a config object or None (the defaults), with dotted overrides on top."""
    overrides = list(overrides)
    if config is None or isinstance(config, (str, Path)):
        return load_config(config, overrides)
    if isinstance(config, ExperimentConfig):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(OmegaConf.structured(config))
    if not isinstance(config, dict):
        from omegaconf import DictConfig, OmegaConf

        if not isinstance(config, DictConfig):
            raise TypeError(f"config must be a path, a dict or an ExperimentConfig, not {type(config).__name__}")
        config = OmegaConf.to_container(config)
    return load_config(None, overrides, base=config)


def _ensure_ray(cfg: ExperimentConfig) -> None:
    """Start (or join) Ray once per process and keep it: later calls reuse the session. The first call's
    ``plugins`` travel with the session; a later run's new plugins must be importable on the workers (installed,
    on PYTHONPATH, or shipped by your own ``ray.init(runtime_env={"py_modules": [...]})``). A run on the in-process
    executor (``engine.backend`` inline, or auto resolving to it) starts no Ray."""
    from raysim.engine.backend import choose_backend

    if choose_backend(cfg.engine) == "inline":
        return
    import ray

    from raysim.engine.resources import start_ray

    if not ray.is_initialized():
        start_ray(cfg.engine, cfg.plugins)


@contextlib.contextmanager
def warm_workers() -> Iterator[None]:
    """Runs on Ray inside this block reuse the Ray worker processes of the run before (with the same
    ``engine.cpus_per_worker`` and ``engine.gpus_per_worker``) instead of starting new ones, each of which imports
    torch (seconds); the numbers are those of fresh workers. Kept workers hold their CPUs while idle: a sweep
    (``raysim.tune``) or a run of another shape ends them first, your own Ray tasks do not, so leave the block
    (which ends them) before scheduling your own work on this Ray."""
    from raysim.engine.pool import warm_workers as keep

    with keep():
        yield


def _frame(rows: list[dict]) -> "pandas.DataFrame":
    import pandas as pd

    return pd.DataFrame(rows)


def run(config: ConfigLike = None, *overrides: str, progress: Optional[bool] = None,
        resume: Union[str, Path, None] = None) -> RunResult:
    """Run one experiment, like ``raysim run``; returns its :class:`RunResult`.

    ``config`` is a YAML path (or a shipped experiment's name: ``"smoke"``), a nested dict
    (``{"rounds": 3, "train": {"lr": 0.1}}``), an :class:`ExperimentConfig` or None (the defaults); ``overrides`` are
    dotted ``key=value`` strings applied on top. ``progress``: a progress bar of rounds with the latest accuracy and
    loss (``tqdm.auto``: a widget in Jupyter, a text bar in a terminal); None (the default) shows it in a notebook or
    on a terminal (unless ``log.progress`` is false) and not when output goes to a file, True always, False never.
    ``resume=RUN_DIR`` continues an interrupted run (``config`` may then be None: the run's own config is used). A
    bad config raises :class:`raysim.UserError`. ``log.mlflow`` / ``log.wandb`` track the run there too.
    """
    from raysim.engine.runner import load_resume_config, run_experiment
    from raysim.runlog import read_metrics
    from raysim.tracking import RunTracker

    overrides = list(overrides)
    if resume is not None:
        overrides.append(f"log.dir={resume}")
        cfg = _config(config, overrides) if config is not None else load_resume_config(Path(resume), overrides)
    else:
        cfg = _config(config, overrides)
    if resume is not None:
        from raysim.engine.runner import already_complete

        done = already_complete(Path(resume), cfg)
        if done is not None:  # nothing to run: the run as it is, without starting Ray
            import warnings

            warnings.warn(f"{resume} is already complete ({counted(done, 'round')} run, rounds={cfg.rounds}); add "
                          f"rounds=N with N > {done} to continue it", stacklevel=2)
            return load_run(resume)
    tracker = RunTracker(cfg)
    bar = _ProgressBar(cfg) if (cfg.log.progress and _interactive() if progress is None else progress) else None

    def on_start(info: dict) -> None:
        tracker.start(info["run_dir"], info["start_round"])
        if bar is not None:
            bar.start(info["run_dir"], info["start_round"])

    def on_round(m: dict) -> None:
        tracker.log(m)
        if bar is not None:
            bar.update(m)

    _ensure_ray(cfg)
    status = "FAILED"
    try:
        run_dir, _, stopped = run_experiment(cfg, resume=resume is not None, on_round=on_round, on_start=on_start,
                                             handle_signals=True)
        status = "KILLED" if stopped else "FINISHED"
    finally:
        if bar is not None:
            bar.close()
        tracker.close(status)
    if resume is not None:
        cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=str(run_dir)))
    elif cfg.log.dir is None:
        cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=str(run_dir)))
    return RunResult(run_dir=Path(run_dir), metrics=_frame(read_metrics(Path(run_dir) / "metrics.jsonl")),
                     config=cfg, stopped=stopped)


def _interactive() -> bool:
    """A notebook (an IPython kernel) or a terminal: where a progress bar is read, not logged."""
    import sys

    return "ipykernel" in sys.modules or sys.stderr.isatty()


class _ProgressBar:
    """Rounds done of ``rounds``, with the latest accuracy and loss, through ``tqdm.auto`` (a notebook widget, else
    a text bar on stderr)."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        self.bar: Any = None

    def start(self, run_dir: Path, start_round: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.cfg.rounds, initial=start_round, unit="round", dynamic_ncols=True,
                        desc=f"{self.cfg.name} ({self.cfg.algorithm.name} on {self.cfg.data.name})")
        self.bar.write(f"raysim: run directory {run_dir}"
                       + (f", resuming after round {start_round}" if start_round else ""))

    def update(self, m: dict) -> None:
        if self.bar is None:
            return
        shown = {k: f"{m[k]:.4f}" for k in ("acc_mean", "acc_global", "loss") if isinstance(m.get(k), float)}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def load_run(run_dir: Union[str, Path]) -> RunResult:
    """Read a run directory written by ``raysim run`` (or a sweep's trial) back into a :class:`RunResult`."""
    import yaml

    from raysim.errors import UserError
    from raysim.runlog import read_metrics

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} is not a raysim run directory (no config.yaml)")
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    if isinstance(saved, dict):
        from raysim.engine.resume_config import check_named_plugins

        check_named_plugins(run_dir, saved)  # a plugin the run directory names is imported only if its checkpoint
    cfg = load_config(None, (), base=saved)  # records it
    rows = read_metrics(run_dir / "metrics.jsonl")
    return RunResult(run_dir=run_dir, metrics=_frame(rows), config=cfg,
                     stopped=bool(rows) and rows[-1]["round"] < cfg.rounds)


def tune(sweep: Union[str, Path, None] = None, *overrides: str, resume: Union[str, Path, None] = None,
         progress: bool = False, callbacks: Sequence[Any] = ()) -> TuneResult:
    """Run a sweep, like ``raysim tune SWEEP.yaml key=value ...``; ``resume=SWEEP_DIR`` continues one.

    ``callbacks``: Ray Tune callbacks of your own (``ray.tune.Callback`` / ``LoggerCallback`` instances, such as
    ``ray.air.integrations.mlflow.MLflowLoggerCallback``), passed to the Tuner beside raysim's."""
    from raysim.errors import UserError
    from raysim.tune import load_sweep, run_sweep, spec_from_yaml

    out = print if progress else (lambda _line: None)
    if resume is not None:
        sweep_dir = Path(resume)
        spec = spec_from_yaml(sweep_dir / "sweep.yaml")
        first = load_config(spec.base, spec.fixed)
        _ensure_ray(first)
        result = run_sweep(spec, sweep_dir=sweep_dir, resume=True, quiet=not progress, out=out, callbacks=callbacks)
    else:
        if sweep is None:
            raise UserError("raysim.tune needs a sweep YAML (or resume=SWEEP_DIR)")
        spec = load_sweep(sweep, list(overrides))
        _ensure_ray(load_config(spec.base, spec.fixed))
        result = run_sweep(spec, quiet=not progress, out=out, callbacks=callbacks)
    best_yaml = result.sweep_dir / "best.yaml"
    return TuneResult(sweep_dir=result.sweep_dir, trials=_frame(result.rows), best=result.best,
                      best_config=best_yaml if best_yaml.is_file() else None)


def report(*runs: Union[str, Path], out: Union[str, Path, None] = None, metric: str = "acc_mean",
           target: float = 0.5, columns: Optional[Sequence[str]] = None, plots: bool = True,
           mode: str = "auto") -> Any:
    """Tables, t-tests (paired or Welch's, Holm-corrected) and plots over run directories (or folders holding them),
    like ``raysim report``.

    Returns the report object; its ``files`` maps each written file (``report.md``, ``table.csv`` ...) to its path.
    """
    from raysim.report import DEFAULT_COLUMNS, make_report

    if not runs:
        raise TypeError("raysim.report needs at least one run directory")
    out_dir = Path(out) if out else (Path(runs[0]) / "report" if len(runs) == 1 else Path("report"))
    return make_report(list(runs), out_dir, metric=metric, target=target,
                       columns=tuple(columns) if columns else DEFAULT_COLUMNS, plots=plots, mode=mode)

