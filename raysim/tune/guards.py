"""How raysim keeps Ray Tune in line while a sweep runs: its environment, signals stopping the trials, trials
restarted only when lost, a state Tune cannot save stopping the sweep, and trial errors as raysim's one line."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import raysim.interrupts as interrupts
from raysim.errors import RunStopped
from raysim.tune.results import trial_error, trial_run_dir
from raysim.tune.spec import SweepSpec
from raysim.tune.state import trial_identity


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


@contextlib.contextmanager
def _trials_start_warm() -> Iterator[None]:
    """Tune gives every trial's actor a runtime environment of its own (``PL_DISABLE_FORK=1``, for PyTorch
    Lightning), and Ray never hands a worker process that it prestarted to an actor with a runtime environment of its
    own: every trial's process started cold, importing torch (measured: 3.2 s for an actor with that variable, 0.3 s
    for one without, which got a prestarted process). raysim trains no Lightning model, so while ``fit()`` runs, the
    variable is left out; the ones Tune passes on from this process's environment (cloud credentials) still are.
    A private local Ray's prestarted processes have imported torch, raysim and Tune by then
    (``raysim.tune.running.TRIAL_PRELOAD``)."""
    from ray.tune.execution import class_cache

    saved = dict(class_cache.DEFAULT_ENV_VARS)
    class_cache.DEFAULT_ENV_VARS.clear()
    try:
        yield
    finally:
        class_cache.DEFAULT_ENV_VARS.update(saved)


@contextlib.contextmanager
def _no_callback_census() -> Iterator[None]:
    """Ray Tune records which kinds of callbacks a sweep uses, for Ray's usage statistics, by importing the MLflow,
    W&B, Comet and Aim integrations to compare classes: with MLflow installed, 1.3 s of every sweep's start (cProfile
    of a sweep of 8 tiny trials), for a count nobody reads locally. While ``fit()`` starts, the census is skipped."""
    from ray.air._internal import usage

    census = usage.tag_callbacks
    usage.tag_callbacks = lambda callbacks: False
    try:
        yield
    finally:
        usage.tag_callbacks = census


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
        own = trial_error(trial_run_dir(spec, sweep_dir, *trial_identity(trial))) is not None
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
