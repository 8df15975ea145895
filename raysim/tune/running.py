"""Running a sweep: the sweep directory's lock, then a Ray Tune Tuner over raysim's trials. The directory and
raysim's record of the sweep (``sweepdir``, ``state``), Tune's guards (``guards``) and the scheduler and searcher
(``search``) are modules of their own. A resume builds a new Tuner from raysim's record, never ``Tuner.restore``
(which unpickles Tune's files)."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from raysim.config import ExperimentConfig
from raysim.dirlock import DirLock
import raysim.interrupts as interrupts
from raysim.errors import RunStopped, UserError
from raysim.tables import counted
from raysim.tune.progress import _progress_callback, _Progress
from raysim.tune.results import SweepResult, collect_trials, finish_sweep, trial_run_dir
from raysim.tune.spec import SweepError, SweepSpec, default_sweep_dir
from raysim.tune.guards import (TuneStateUnwritable, _one_line_trial_errors, _restarts_only_lost_trials,
                                _no_callback_census, _stops_on_signals, _stops_when_tune_cannot_save,
                                _trials_start_warm, _tune_env)
from raysim.tune.search import _scheduler, recorded_search
from raysim.tune.state import SweepState, state_callback, trial_identity
from raysim.tune.sweepdir import _check_sweep_dir
from raysim.tune.trials import ERROR_FILE, TrialSetup, _param_space, _trial_resources, run_trial, runs_in_trial_process
from raysim.tune.validate import candidate_configs, check_cluster, validate_sweep

LOST_TRIAL_RESTARTS = 5  # Tune restarts a trial lost with its node or process at most this many times
TRIAL_PRELOAD = ("ray.tune", "raysim.tune.trials", "raysim.engine.driver")  # what a trial's process imports


def run_sweep(spec: SweepSpec, *, sweep_dir: Optional[Path] = None, resume: bool = False, quiet: bool = False,
              out: Callable[[str], None] = print, callbacks: Sequence[Any] = ()) -> "SweepResult":
    """Run (or resume) a sweep to the end and write its table, best config and HParams; returns the table.

    The sweep directory is locked while this runs (``raysim.dirlock``): a second sweep into it, or a ``--resume``
    of it while it runs, is refused; a lock left by a killed sweep is gone with its process. ``callbacks``: Ray Tune
    callbacks of your own, beside raysim's (``log.mlflow`` / ``log.wandb`` add Tune's MLflow and W&B loggers). The
    first Ctrl-C or SIGTERM stops the trials (each keeps its checkpoint) and returns the table with them
    unfinished."""
    from raysim.engine.backend import choose_backend
    from raysim.tracking import check_tracking

    candidates = candidate_configs(spec)  # loaded once: validated here, their resources checked once Ray is up
    first = validate_sweep(spec, candidates)
    check_tracking(first)  # a tracking extra that is not installed: one line, before anything is written
    # a seed set whose runs would be in-process (engine.backend inline, or auto resolving to it) runs them without
    # Ray or Tune, in this process (and helpers: raysim.tune.inprocess); a sweep always runs on Ray Tune
    in_process = spec.naming == "seed" and choose_backend(first.engine) == "inline"
    if spec.naming != "seed" and first.engine.backend == "inline":
        raise SweepError("config key 'engine.backend': a sweep runs its trials on Ray Tune; engine.backend=inline is "
                         "for single runs and seed sets (use auto or ray)")
    sweep_dir = Path(sweep_dir or spec.dir or default_sweep_dir(spec)).resolve()
    key = spec.names.dir_key
    if resume and not sweep_dir.is_dir():
        raise SweepError(f"{sweep_dir} holds no sweep to resume (no such directory)")
    created = not sweep_dir.exists()
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SweepError(f"cannot create sweep directory {sweep_dir} ({exc.strerror})") from None
    # claimed before it is checked: of two sweeps started together into one directory, one runs, one is refused;
    # Ctrl-C and SIGTERM stop the sweep gracefully (raysim.interrupts), called from the command or not
    with DirLock(sweep_dir, key=key), interrupts.handled():
        try:
            if in_process and not resume and (sweep_dir / "sweep.yaml").is_file():
                raise SweepError(f"{sweep_dir} already holds a seed set; continue it with --resume {sweep_dir} "
                                 f"or choose another directory")
            state = _check_sweep_dir(spec, sweep_dir, resume)
        except BaseException:
            if created:
                shutil.rmtree(sweep_dir, ignore_errors=True)
            raise
        if in_process:
            from raysim.tune.inprocess import run_seeds_in_process

            if callbacks:
                raise SweepError("callbacks are Ray Tune callbacks, and this seed set runs in this process "
                                 "(engine.backend inline); set engine.backend=ray to run it on Tune")
            try:
                run_seeds_in_process(spec, first, sweep_dir, quiet=quiet, out=out)
            except KeyboardInterrupt as exc:
                exc.resume_command = f"{spec.names.resume_command} {sweep_dir}"  # type: ignore[attr-defined]
                raise
            return finish_sweep(spec, sweep_dir)
        try:
            return _run_sweep_locked(spec, candidates, sweep_dir, state, resume, quiet, out, callbacks)
        except UserError:  # refused before Tune started (the cluster can never place a trial): leave nothing
            if created and not (sweep_dir / "tune").exists():
                shutil.rmtree(sweep_dir, ignore_errors=True)
            raise
        except (KeyboardInterrupt, RunStopped) as exc:  # the command's one line names the way back
            exc.resume_command = f"{spec.names.resume_command} {sweep_dir}"  # type: ignore[attr-defined]
            raise


def _run_sweep_locked(spec: SweepSpec, candidates: list[ExperimentConfig], sweep_dir: Path, state: SweepState,
                      resume: bool, quiet: bool, out: Callable[[str], None],
                      user_callbacks: Sequence[Any] = ()) -> "SweepResult":
    import ray
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from raysim.engine.placement import this_node
    from raysim.engine.resources import ray_session

    first = candidates[0]
    tune_dir = sweep_dir / "tune"
    spec = dataclasses.replace(spec, dir=str(sweep_dir))

    total = spec.total_trials()
    rows = collect_trials(spec, sweep_dir) if resume else []
    done = tuple(r["trial_id"] for r in rows if r["status"] in ("done", "stopped"))
    for row in rows:  # errored trials run again: their causes go, so that a restart after a lost node is not
        if row["status"].startswith("error"):  # taken for their own failure (_restarts_only_lost_trials)
            (Path(row["run_dir"]) / ERROR_FILE).unlink(missing_ok=True)
    to_run, new = state.to_run(), state.new_left()
    if not (to_run or new):  # every trial ended: the tables again, without Ray or Tune
        return finish_sweep(spec, sweep_dir)
    progress = _Progress(spec, total, first.rounds, quiet, done=done,
                         run_dir=lambda trial: trial_run_dir(spec, sweep_dir, *trial_identity(trial)))
    # a private local Ray's worker processes import what a trial needs while Tune starts: the trial processes that
    # take them start warm, where their runs run (raysim.tune.trials.run_trial; not worth it for trials whose runs
    # all go to worker processes of their own, which would import Tune for nothing)
    in_trials = any(runs_in_trial_process(cfg.engine) for cfg in candidates)
    with ray_session(first.engine, first.plugins, preload=TRIAL_PRELOAD if in_trials else ()):
        check_cluster(spec, candidates)
        setup = TrialSetup(base=spec.base, fixed=tuple(spec.fixed), trials_dir=str(spec.trials_dir(sweep_dir)),
                           cwd=os.getcwd(), naming=spec.naming, launch_node=this_node())
        trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup),
                                        functools.partial(_trial_resources, setup=setup))
        cpus = ray.cluster_resources().get("CPU", 0)
        what = spec.names.what(total)
        out(f"raysim: {'resuming' if resume else 'starting'} {what} ({first.algorithm.name} on {first.data.name}, "
            f"{counted(first.rounds, 'round')} each, {spec.scheduler['name']}) on {cpus:g} CPUs; directory {sweep_dir}")
        with _tune_env():
            from raysim.tracking import tune_callbacks

            callbacks = [state_callback(state), _progress_callback(progress), CSVLoggerCallback(),
                         JsonLoggerCallback(), *tune_callbacks(first, sweep_dir), *user_callbacks]
            tuner = tune.Tuner(
                trainable, param_space=_param_space(spec) if new else {},
                tune_config=tune.TuneConfig(metric=spec.metric, mode=spec.mode, num_samples=len(to_run) + new,
                                            scheduler=_scheduler(spec, first.rounds),
                                            search_alg=recorded_search(spec, state, to_run, new),
                                            max_concurrent_trials=spec.max_concurrent,
                                            # a trial's process runs the next trial of its shape: torch, raysim
                                            # and built datasets stay loaded (raysim.tune.trials.run_trial)
                                            reuse_actors=True,
                                            trial_dirname_creator=lambda trial: trial.trial_id),
                run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir), verbose=0, callbacks=callbacks,
                                          failure_config=tune.FailureConfig(max_failures=LOST_TRIAL_RESTARTS)))
            _release_warm_workers()  # Tune's trials need the CPUs that a run's kept workers hold (warm_workers)
            with _one_line_trial_errors(), _stops_on_signals(), _restarts_only_lost_trials(spec, sweep_dir), \
                    _trials_start_warm(), _no_callback_census(), _stops_when_tune_cannot_save(tune_dir) as unsaved:
                try:
                    tuner.fit()
                except OSError as exc:  # Tune's own state, written in its staging directory first, raises
                    unsaved.append(exc.strerror or str(exc))
                except Exception:  # noqa: BLE001 - after a failed save, Tune fails to read back what it never wrote
                    if not unsaved:
                        raise
            if unsaved:
                raise TuneStateUnwritable(f"cannot write Ray Tune's state in {tune_dir}: {unsaved[0]}; the sweep "
                                          f"stopped (its trials keep their last checkpoints; free some space, then "
                                          f"resume)")
    return finish_sweep(spec, sweep_dir)


def _release_warm_workers() -> None:
    """End the workers that runs before kept (``raysim.engine.pool.warm_workers``); none can be kept unless the pool
    was imported, and a sweep's own process has no use for torch, which importing it would load (seconds)."""
    import sys

    pool = sys.modules.get("raysim.engine.pool")
    if pool is not None:
        pool.release_warm_workers()
