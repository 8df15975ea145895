"""One seed's run in the process that calls it: what a seed set without Ray runs for each seed, in the command's own
process (``inprocess``) or in one of its pool's (``seedpool``)."""

from __future__ import annotations

from typing import Callable

from raysim.errors import UserError
from raysim.tune.trials import TrialSetup

# what one seed's run ended as: done, failed (its cause in error.txt), stopped (Ctrl-C: checkpointed, unfinished),
# or already ended before (a kill the set never recorded: counted as done, nothing run)
DONE, FAILED, STOPPED, ENDED_BEFORE = "done", "failed", "stopped", "ended before"


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
