"""A seed set whose runs are in-process (``raysim run --seeds`` when they resolve to ``engine.backend=inline``):
no Ray and no Tune. With ``engine.backend=inline`` set, each seed runs in this process, one after another (your own
frames in every error, ``breakpoint()`` in a hook works); with ``auto`` (in-process on one machine), as many seeds
run at once as the machine's cores hold, each in a process of its own that runs seed after seed
(``raysim.tune.seedpool``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from raysim.errors import UserError
from raysim.tables import counted
from raysim.tune.results import seed_trials
from raysim.tune.spec import SweepSpec
from raysim.tune.trials import TrialSetup

# what one seed's run ended as: done, failed (its cause in error.txt), stopped (Ctrl-C: checkpointed, unfinished),
# or already ended before (a kill the set never recorded: counted as done, nothing run)
DONE, FAILED, STOPPED, ENDED_BEFORE = "done", "failed", "stopped", "ended before"


def seeds_at_once(engine: Any, seeds: int) -> int:
    """How many seeds run at once: one per ``engine.cpus_per_worker`` cores this process may use, at most one per
    seed; one (in this very process) when ``engine.backend=inline`` is set."""
    if engine.backend == "inline":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(seeds, int(cores // engine.cpus_per_worker)))


def run_seeds_in_process(spec: SweepSpec, first: Any, sweep_dir: Path, *, quiet: bool,
                         out: Callable[[str], None]) -> None:
    """Each seed's run without Ray or Tune: in this process, or in as many processes as there are cores.

    The same directory layout and resume rules as a seed set on Tune: a done seed is not run again, one with a
    checkpoint continues from it, a failed one records its one-line cause in ``error.txt`` (its traceback goes to
    stderr, with your own frames) and the set goes on; Ctrl-C finishes the rounds in flight, checkpoints them and
    stops the set."""
    from types import SimpleNamespace

    from raysim.tune.progress import _Progress

    seeds = list(spec.space["seed"]["grid"])
    done = tuple(t["trial_id"] for t in seed_trials(spec, sweep_dir) if t["status"] == "TERMINATED")
    progress = _Progress(spec, len(seeds), first.rounds, quiet, done=done,
                         run_dir=lambda trial: spec.trials_dir(sweep_dir) / trial.trial_id)
    setup = TrialSetup(base=spec.base, fixed=tuple(spec.fixed), trials_dir=str(spec.trials_dir(sweep_dir)),
                       cwd=str(Path.cwd()), naming=spec.naming)
    todo = [seed for seed in seeds if f"seed-{seed}" not in done]
    at_once = seeds_at_once(first.engine, len(todo))
    where = "in this process" if at_once == 1 else f"{at_once} at once, each in a process of its own"
    out(f"raysim: {'resuming' if done else 'starting'} {spec.names.what(len(seeds))} ({first.algorithm.name} on "
        f"{first.data.name}, {counted(first.rounds, 'round')} each) {where}; directory {sweep_dir}")
    trials = {seed: SimpleNamespace(trial_id=f"seed-{seed}", config={"seed": seed}, last_result={}) for seed in todo}

    def tell(seed: int, event: str, row: dict) -> None:
        trial = trials[seed]
        if event == "started":
            progress.started(trial)
        elif event == "result":
            trial.last_result = row
            progress.result(trial, row)
        elif event in (DONE, ENDED_BEFORE, FAILED):
            progress.finished(trial, failed=event == FAILED)

    if at_once > 1:
        from raysim.tune.seedpool import run_seed_pool

        try:
            run_seed_pool(setup, todo, at_once, tell)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C, or SIGTERM's grace period over: the table shows what is unfinished
        return
    for seed in todo:
        try:
            outcome = run_one_seed(setup, seed, lambda event, row, seed=seed: tell(seed, event, row),
                                   handle_signals=True)
        except KeyboardInterrupt:
            return  # a second Ctrl-C: the set stops at once; the table shows what is unfinished
        if outcome == STOPPED:
            return  # Ctrl-C: this seed checkpointed; the others are unfinished


def run_one_seed(setup: TrialSetup, seed: int, tell: Callable[[str, dict], None], *, handle_signals: bool,
                 on_start: Callable[[dict], None] = lambda info: None) -> str:
    """One seed's run in this process; ``tell(event, row)`` hears "started", each round's "result" and how it ended
    (:data:`DONE`, :data:`FAILED`, :data:`STOPPED` or :data:`ENDED_BEFORE`), which is also returned. A failure
    leaves its one-line cause in ``error.txt`` (and a bug's traceback on stderr); a KeyboardInterrupt (a second
    Ctrl-C) is raised. ``handle_signals``: Ctrl-C and SIGTERM finish the round and stop the run (this process's
    main thread); ``on_start``: told the run's control (``raysim.engine.runner.RunControl``) as it starts."""
    import shutil
    import sys
    import traceback

    from raysim.engine.runner import run_experiment
    from raysim.engine.state import has_checkpoint
    from raysim.errors import RunStopped
    from raysim.tracking import RunTracker
    from raysim.tune.trials import ERROR_FILE, _checkpointed_round, _record_error

    run_dir = setup.run_dir({"seed": seed}, f"seed-{seed}")
    outcome = FAILED
    try:
        cfg = setup.config({"seed": seed}, run_dir)
        resume = has_checkpoint(run_dir)
        if resume and _checkpointed_round(run_dir) >= cfg.rounds:
            tell(ENDED_BEFORE, {})  # ended before a kill that the set never recorded
            return ENDED_BEFORE
        if not resume and run_dir.exists():
            shutil.rmtree(run_dir)  # an earlier attempt that never completed a round
        (run_dir / ERROR_FILE).unlink(missing_ok=True)
        tell("started", {})
        tracker = RunTracker(cfg)

        def on_round(m: dict) -> None:
            tracker.log(m)
            tell("result", m)

        def started(info: dict) -> None:
            tracker.start(info["run_dir"], info["start_round"])
            on_start(info)

        status = "FAILED"
        try:
            _, rows, stopped = run_experiment(cfg, resume=resume, on_round=on_round, handle_signals=handle_signals,
                                              on_start=started, in_process=True)
            stopped = stopped or not rows or rows[-1]["round"] < cfg.rounds  # asked to stop through on_start's control
            status = "KILLED" if stopped else "FINISHED"
        finally:
            tracker.close(status)
        outcome = STOPPED if stopped else DONE
    except KeyboardInterrupt:
        raise
    except (UserError, RunStopped) as exc:
        _record_error(run_dir, exc)
    except Exception as exc:  # noqa: BLE001 - a bug in a hook: its traceback now, and the set goes on
        traceback.print_exc(file=sys.stderr)
        _record_error(run_dir, exc)
    if outcome != STOPPED:
        tell(outcome, {})
    return outcome
