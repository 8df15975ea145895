"""A seed set run in this process, one seed after another, with no Ray and no Tune (``raysim run --seeds`` when
the runs resolve to ``engine.backend=inline``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from raysim.errors import UserError
from raysim.tables import counted
from raysim.tune.results import seed_trials
from raysim.tune.spec import SweepSpec


def run_seeds_in_process(spec: SweepSpec, first: Any, sweep_dir: Path, *, quiet: bool,
                         out: Callable[[str], None]) -> None:
    """Each seed's run in turn, in this process (``engine.backend`` inline): no Ray, no Tune.

    The same directory layout and resume rules as a seed set on Tune: a done seed is not run again, one with a
    checkpoint continues from it, a failed one records its one-line cause in ``error.txt`` (its traceback goes to
    stderr, with your own frames) and the set goes on; Ctrl-C finishes the round, checkpoints and stops the set."""
    import shutil
    import sys
    import traceback
    from types import SimpleNamespace

    from raysim.engine.runner import run_experiment
    from raysim.engine.state import has_checkpoint
    from raysim.errors import RunStopped
    from raysim.tracking import RunTracker
    from raysim.tune.progress import _Progress
    from raysim.tune.trials import ERROR_FILE, TrialSetup, _checkpointed_round, _record_error

    seeds = list(spec.space["seed"]["grid"])
    done = tuple(t["trial_id"] for t in seed_trials(spec, sweep_dir) if t["status"] == "TERMINATED")
    progress = _Progress(spec, len(seeds), first.rounds, quiet, done=done,
                         run_dir=lambda trial: spec.trials_dir(sweep_dir) / trial.trial_id)
    setup = TrialSetup(base=spec.base, fixed=tuple(spec.fixed), trials_dir=str(spec.trials_dir(sweep_dir)),
                       cwd=str(Path.cwd()), naming=spec.naming)
    out(f"raysim: {'resuming' if done else 'starting'} {spec.names.what(len(seeds))} ({first.algorithm.name} on "
        f"{first.data.name}, {counted(first.rounds, 'round')} each) in this process; directory {sweep_dir}")
    for seed in seeds:
        trial = SimpleNamespace(trial_id=f"seed-{seed}", config={"seed": seed}, last_result={})
        if trial.trial_id in done:
            continue
        run_dir = setup.run_dir({"seed": seed}, trial.trial_id)
        try:
            cfg = setup.config({"seed": seed}, run_dir)
            resume = has_checkpoint(run_dir)
            if resume and _checkpointed_round(run_dir) >= cfg.rounds:
                progress.finished(trial, failed=False)  # ended before a kill that the set never recorded
                continue
            if not resume and run_dir.exists():
                shutil.rmtree(run_dir)  # an earlier attempt that never completed a round
            (run_dir / ERROR_FILE).unlink(missing_ok=True)
            progress.started(trial)
            tracker = RunTracker(cfg)

            def on_round(m: dict, trial: Any = trial, tracker: RunTracker = tracker) -> None:
                trial.last_result = m
                tracker.log(m)
                progress.result(trial, m)

            status = "FAILED"
            try:
                _, _, stopped = run_experiment(
                    cfg, resume=resume, on_round=on_round, handle_signals=True,
                    on_start=lambda info, tracker=tracker: tracker.start(info["run_dir"], info["start_round"]))
                status = "KILLED" if stopped else "FINISHED"
            finally:
                tracker.close(status)
        except KeyboardInterrupt:
            return  # a second Ctrl-C: the set stops at once; the table shows what is unfinished
        except (UserError, RunStopped) as exc:
            _record_error(run_dir, exc)
            progress.finished(trial, failed=True)
            continue
        except Exception as exc:  # noqa: BLE001 - a bug in a hook: its traceback now, and the set goes on
            traceback.print_exc(file=sys.stderr)
            _record_error(run_dir, exc)
            progress.finished(trial, failed=True)
            continue
        if stopped:
            return  # Ctrl-C: this seed checkpointed; the others are unfinished
        progress.finished(trial, failed=False)
