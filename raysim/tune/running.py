"""Running a sweep: the sweep directory and its lock, Ray Tune's Tuner (new or restored), schedulers, searchers."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from raysim.config import ExperimentConfig
from raysim.dirlock import DirLock
import raysim.interrupts as interrupts
from raysim.errors import RunStopped, UserError
from raysim.tables import counted
from raysim.tune.progress import _progress_callback, _Progress
from raysim.tune.results import SweepResult, _quiet_tune_logs, collect_trials, finish_sweep, trial_error, \
    trial_run_dir, write_atomically
from raysim.tune.spec import SweepError, SweepSpec, default_sweep_dir, spec_to_yaml
from raysim.tune.trials import ERROR_FILE, TrialSetup, _param_space, _trial_resources, run_trial
from raysim.tune.validate import candidate_configs, check_cluster, validate_sweep


LOST_TRIAL_RESTARTS = 5  # Tune restarts a trial lost with its node or process at most this many times


@contextlib.contextmanager
def _tune_env() -> Iterator[None]:
    """raysim writes each trial's TensorBoard events itself; Tune's own TensorBoard logger would duplicate them.
    Ctrl-C reaches raysim's handler (``raysim.interrupts``), which stops Tune as Tune's own would, and SIGTERM too."""
    keys = ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "RAY_AIR_NEW_OUTPUT", "TUNE_DISABLE_SIGINT_HANDLER")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
    # a seed set whose runs would be in-process (engine.backend inline, or auto resolving to it) runs them in turn
    # in this process; a sweep always runs on Ray Tune, its trials each on Ray
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
            resume = _check_sweep_dir(spec, sweep_dir, resume)
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
            return _run_sweep_locked(spec, candidates, sweep_dir, resume, quiet, out, callbacks)
        except UserError:  # refused before Tune started (the cluster can never place a trial): leave nothing
            if created and not (sweep_dir / "tune").exists():
                shutil.rmtree(sweep_dir, ignore_errors=True)
            raise
        except (KeyboardInterrupt, RunStopped) as exc:  # the command's one line names the way back
            exc.resume_command = f"{spec.names.resume_command} {sweep_dir}"  # type: ignore[attr-defined]
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
        if not spec.names.keeps_run_dirs:
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


TUNER_DIGEST = "tuner.pkl.sha256"  # in the sweep directory: the sha256 of the tuner.pkl Tune wrote for raysim


def _tuner_digest(tune_dir: Path) -> Optional[str]:
    import hashlib

    try:
        with open(tune_dir / "tuner.pkl", "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


def _record_tuner_digest(tune_dir: Path) -> None:
    """Record the sha256 of the ``tuner.pkl`` that Tune has just written (it writes it, synchronously, when a Tuner
    is made or restored): ``--resume`` unpickles only that file."""
    from raysim.tune.results import write_atomically

    digest = _tuner_digest(tune_dir)
    if digest is not None:
        write_atomically(tune_dir.parent / TUNER_DIGEST, digest + "\n")


def _tune_state_restorable(tune_dir: Path) -> bool:
    """Whether ``Tuner.restore`` can read ``tune_dir``. Tune writes its state files in place, so a kill can tear
    one: a torn newest experiment state is removed (the one before it, and the trials' run directories, which hold
    the truth about each trial, are enough to go on). ``tuner.pkl`` is a pickle that ``Tuner.restore`` unpickles
    (code could run from it), so it is never unpickled here and is restored only when it is the file Tune wrote for
    raysim (its sha256, recorded then, matches): one that does not match is refused; without a record (killed while
    the Tuner was made, or a sweep older than the record) nothing is known to have run, and the sweep starts again."""
    recorded_file = tune_dir.parent / TUNER_DIGEST
    digest = _tuner_digest(tune_dir)
    if digest is None or not recorded_file.is_file():
        return False
    if recorded_file.read_text().strip() != digest:
        raise SweepError(f"{tune_dir / 'tuner.pkl'} does not match the sha256 raysim recorded when Ray Tune wrote it "
                         f"({recorded_file}): it changed since, and is not read (a pickle can run code); restore it, "
                         f"or remove {tune_dir} to start the sweep again (finished seeds keep their runs)")
    for state in sorted(tune_dir.glob("experiment_state-*.json"), reverse=True):
        try:
            json.loads(state.read_text())
            return True
        except (OSError, ValueError):
            state.unlink(missing_ok=True)
    return False


def _run_sweep_locked(spec: SweepSpec, candidates: list[ExperimentConfig], sweep_dir: Path, resume: bool,
                      quiet: bool, out: Callable[[str], None], user_callbacks: Sequence[Any] = ()) -> "SweepResult":
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
    progress = _Progress(spec, total, first.rounds, quiet, done=done,
                         run_dir=lambda trial: trial_run_dir(spec, sweep_dir, trial.trial_id, trial.config))
    with ray_session(first.engine, first.plugins):
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

            callbacks = [_progress_callback(progress), CSVLoggerCallback(), JsonLoggerCallback(),
                         *tune_callbacks(first, sweep_dir), *user_callbacks]
            (sweep_dir / TUNER_DIGEST).unlink(missing_ok=True)  # Tune rewrites tuner.pkl in place next
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
                                              callbacks=callbacks,
                                              failure_config=tune.FailureConfig(max_failures=LOST_TRIAL_RESTARTS)))
            _record_tuner_digest(tune_dir)  # the tuner.pkl the Tuner just wrote is the one --resume may read
            # Tuner.restore keeps the original run config; the progress callback has to be re-attached
            if resume:
                tuner._local_tuner.get_run_config().callbacks = callbacks  # noqa: SLF001 - no public setter
            with _one_line_trial_errors(), _stops_on_signals(), _restarts_only_lost_trials(spec, sweep_dir), \
                    _stops_when_tune_cannot_save(tune_dir) as unsaved:
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


class TuneStateUnwritable(RunStopped):
    """Ray Tune could not save its state (a full disk under the sweep directory): the sweep stopped (exit 3)."""


# Tune's reports that saving its state failed: it logs them and goes on
_TUNE_SAVE_FAILED = ("Last sync command failed", "Saving experiment state to storage",
                     "Experiment state snapshotting failed")


@contextlib.contextmanager
def _stops_when_tune_cannot_save(tune_dir: Path) -> Iterator[list[str]]:
    """Stop the sweep when Tune cannot save its state; yields the causes found (empty: none).

    Tune writes its experiment state and its searcher's state to a staging directory, then copies them to
    ``tune_dir`` in the background; a failed copy (a full disk) is only logged, with a traceback, and Tune runs on
    while the record ``--resume`` reads falls behind. Here such a report stops Tune as Ctrl-C does (its trials keep
    their checkpoints) and replaces Tune's traceback with raysim's one line, after ``fit()``."""
    import logging
    import signal

    found: list[str] = []

    def caught(record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_TUNE_SAVE_FAILED):
            return True
        if not found:
            found.append(_save_failure(record))
            stop = signal.getsignal(signal.SIGUSR1)  # Tune's own interrupt while its loop runs (see above)
            if callable(stop):
                stop(signal.SIGUSR1, None)
        return False

    logs = [logging.getLogger(name) for name in ("ray.train._internal.syncer", "ray.tune.execution.experiment_state",
                                                 "ray.tune.tune")]
    for log in logs:
        log.addFilter(caught)
    try:
        yield found
    finally:
        for log in logs:
            log.removeFilter(caught)


def _save_failure(record: Any) -> str:
    """The cause in a report of a failed save: the OSError's text (from the exception, or the traceback's last
    line, which is all that "Last sync command failed" carries)."""
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__cause__ or exc.__context__
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    lines = [line.strip() for line in record.getMessage().splitlines() if line.strip()]
    return lines[-1] if lines else "an error Tune logged"


@contextlib.contextmanager
def _restarts_only_lost_trials(spec: SweepSpec, sweep_dir: Path) -> Iterator[None]:
    """Tune restarts a failed trial (``FailureConfig.max_failures``) whatever failed; raysim restarts only trials
    lost with a node or a process (the trial's actor, its relay, its driver), which continue from their run
    directory's checkpoint. A trial that failed for its own reasons (a NaN, a bad value, an exception in a hook)
    left its cause in ``error.txt`` before failing (``raysim.tune.trials``) and is not restarted. Tune has no
    setting for that, so while ``fit()`` runs its one decision, ``Trial.should_recover``, also asks that."""
    from ray.tune.experiment import Trial

    restart = Trial.should_recover

    def should_recover(trial: Any) -> bool:
        own = trial_error(trial_run_dir(spec, sweep_dir, trial.trial_id, trial.config)) is not None
        return not own and restart(trial)

    Trial.should_recover = should_recover  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trial.should_recover = restart  # type: ignore[method-assign]


@contextlib.contextmanager
def _stops_on_signals() -> Iterator[None]:
    """While ``fit()`` runs, the first Ctrl-C or SIGTERM stops Tune as its own Ctrl-C handler does: its trials stop
    (each keeps its run directory's last checkpoint), it saves its state, and ``fit()`` returns with them
    unfinished. Tune installs that handler for SIGUSR1 once its loop starts; until then a signal ends at once."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop_tune() -> bool:
        handler = signal.getsignal(signal.SIGUSR1)
        if not callable(handler):
            return False  # Tune's loop has not started: nothing runs yet that could stop gently
        handler(signal.SIGUSR1, None)
        return True

    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # not a handler left by an earlier fit()
    try:
        with interrupts.graceful(stop_tune, "stopping Ray Tune's trials"):
            yield
    finally:
        signal.signal(signal.SIGUSR1, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _one_line_trial_errors() -> Iterator[None]:
    """Tune logs each failed trial's whole traceback; raysim prints its one-line cause (the traceback stays in the
    trial's ``error.txt`` under the Tune directory)."""
    import logging

    def drop(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TUNE_LINES_RAYSIM_SAYS)

    logs = [logging.getLogger(name) for name in ("ray.tune.execution.tune_controller", "ray.tune.tune")]
    for log in logs:
        log.addFilter(drop)
    try:
        yield
    finally:
        for log in logs:
            log.removeFilter(drop)


# Tune's lines that raysim replaces with its own: a failed trial's traceback (its one-line cause instead), and on
# Ctrl-C or SIGTERM Tune's notices and its Tuner.restore hint (raysim prints its `--resume` command)
_TUNE_LINES_RAYSIM_SAYS = ("Trial task failed", "Stop signal received", "Experiment has been interrupted",
                           "Trials did not complete")


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
    """Tune's own random/grid generator (None), or seeded by ``search.seed`` when given. Optuna: TPE through
    Tune's OptunaSearch adapter; Tune saves its state with the experiment, so ``--resume`` continues the same
    study."""
    search = spec.search if isinstance(spec.search, dict) else {"name": "random"}
    if search.get("name", "random") == "random":
        if search.get("seed") is None:
            return None
        from ray.tune.search.basic_variant import BasicVariantGenerator

        return BasicVariantGenerator(random_state=int(search["seed"]))  # the same trials on every rerun
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=search.get("seed"),
                                         n_startup_trials=int(search.get("startup_trials", 5)))
    return OptunaSearch(sampler=sampler)
