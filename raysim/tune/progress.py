"""Console progress of a sweep: each trial's rounds, and trials done out of total with the best so far."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

from raysim.tune.results import trial_error
from raysim.tune.spec import SweepSpec
from raysim.tune.state import trial_identity


class _Progress:
    """Console lines a person can follow: each trial's rounds, and trials done out of total with the best so far."""

    def __init__(self, spec: SweepSpec, total: int, rounds: int, quiet: bool, done: tuple[str, ...] = (),
                 run_dir: Optional[Callable[[Any], Path]] = None):
        self.spec, self.total, self.rounds, self.quiet = spec, total, rounds, quiet
        self.done = set(done)  # names of the trials that ended (a resumed sweep starts with those ended before)
        self.run_dir = run_dir
        self.best: Optional[tuple[float, str]] = None
        self.per_trial: dict[str, float] = {}  # each trial's best so far (seeds: their mean is the news)
        self.start = time.monotonic()

    def label(self, trial: Any) -> str:
        return self.spec.names.label(*trial_identity(trial))

    def result(self, trial: Any, result: dict) -> None:
        value = result.get(self.spec.metric)
        if value is not None and (self.best is None or _better(value, self.best[0], self.spec.mode)):
            self.best = (value, self.label(trial))
        name = trial_identity(trial)[0]
        old = self.per_trial.get(name)
        if value is not None and (old is None or _better(value, old, self.spec.mode)):
            self.per_trial[name] = value
        if not self.quiet:
            from raysim.runlog import format_round

            if "wall_s" in result and ("loss" in result or "nonprivate/loss" in result):  # a round's metrics
                line = format_round({k: result.get(k) for k in (
                    "round", "acc_mean", "acc_global", "loss", "k", "p", "p_epochs", "attack/asr", "epsilon",
                    "privacy/delta", "dpsgd/epsilon_max", "bytes_up", "bytes_down", "wall_s", "sim_time_s",
                    "round_sim_s", "nonprivate/loss", "nonprivate/bytes_up", "nonprivate/bytes_down")
                    if k in result}, self.rounds)
                print(f"[{self.label(trial)}] {line}", flush=True)

    def started(self, trial: Any) -> None:
        if not self.quiet:
            print(f"raysim: started {self.label(trial)}", flush=True)

    def restarted(self, trial: Any) -> None:
        """Tune restarts a trial lost with its node or process; it continues from its checkpoint."""
        print(f"raysim: {self.label(trial)} was lost with its node or process; Tune restarts it from its "
              f"checkpoint", flush=True)

    def finished(self, trial: Any, failed: bool) -> None:
        name = trial_identity(trial)[0]
        if name in self.done and not failed:
            return  # ended before a kill that the sweep's record missed: counted, and re-reported without running
        self.done.add(name)
        # seeds: a mean over the seeds that ended, never one still running (its best so far is no result yet)
        ended = {t: v for t, v in self.per_trial.items() if t in self.done}
        best = self.spec.names.progress_best(self.spec.metric, self.best, ended)
        last = (getattr(trial, "last_result", None) or {}).get("round")
        what = ("failed" if failed else f"stopped early after round {last}" if last and last < self.rounds
                else "finished")
        if failed:
            cause = trial_error(self.run_dir(trial)) if self.run_dir else None
            what = f"failed: {cause or 'see ' + str(getattr(trial, 'error_file', None) or 'Tune error file')}"
        print(f"raysim: {len(self.done)}/{self.total} {self.spec.names.noun}s done "
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

        def on_trial_recover(self, iteration, trials, trial, **info):
            progress.restarted(trial)

    return ProgressCallback()


def _better(a: float, b: float, mode: str) -> bool:
    return a > b if mode == "max" else a < b
