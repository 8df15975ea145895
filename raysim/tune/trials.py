"""One trial: the Tune trainable, which relays the rounds of one whole raysim run run on the launch node."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from raysim.config import ExperimentConfig, load_config
from raysim.dirlock import DirLock
from raysim.errors import UserError
from raysim.interrupts import quiet_exit_on_sigterm  # noqa: F401 - re-exported: each trial's process installs it
from raysim.tune.naming import naming
from raysim.tune.spec import SweepSpec
from raysim.tune.state import TRIAL_KEY, split_trial_config
from raysim.tune.validate import _override


@dataclass(frozen=True)
class TrialSetup:
    """What every trial needs besides its sampled values; shipped to the trial with the trainable."""

    base: Optional[str]
    fixed: tuple[str, ...]
    trials_dir: str
    cwd: str
    naming: str  # the naming strategy's name (see naming.py)
    launch_node: str = ""  # Ray node id where the sweep was started: trials' run directories live there

    def run_dir(self, values: dict, trial_id: str) -> Path:
        return Path(self.trials_dir) / naming(self.naming).run_dir_name(trial_id, values)

    def config(self, values: dict, run_dir: Optional[Path] = None) -> ExperimentConfig:
        extra = [_override(k, v) for k, v in values.items() if k != TRIAL_KEY]
        if run_dir is not None:
            extra += [f"log.dir={run_dir}", "log.progress=false"]
        return load_config(self.base, list(self.fixed) + extra)


ERROR_FILE = "error.txt"  # in a failed trial's run directory: its one-line cause, for the console and the table
LOST_ATTEMPT_WAIT_S = 60.0  # how long a restarted trial waits for its lost attempt to let go of its run directory
# seconds Tune waits for a finished trial's thread to end before it reuses the trial's process for the next trial
# (Tune's default, 2 s, would fail the next trial on a loaded machine, where ending a run's thread can take longer)
TRIAL_THREAD_END_S = "60"


def runs_in_trial_process(engine: Any) -> bool:
    """Whether a trial's run needs nothing of Ray beyond the trial's own process: one worker, on the CPU, with no
    object-store budget, and ``engine.backend`` not pinned to ``ray``. Such a run goes through the in-process
    executor in the trial's process (no ClientWorker to start, no object-store traffic), on the CPU that the
    trial's placement group reserves for its one worker (``raysim.engine.placement.run_bundles``)."""
    return (engine.backend != "ray" and engine.num_workers == 1 and not engine.gpus_per_worker
            and engine.state_memory_gb is None)


def run_trial(values: dict, setup: TrialSetup) -> None:
    """The Tune trainable: one raysim run, reporting every round.

    The trial's actor may run on any node; the run itself (run directory, driver) runs on the node where the sweep
    was started (``raysim.engine.placement``), and this relays its rounds to Tune. A trial that Tune placed on that
    node runs it in its own process: no relay process to start (a few seconds each); and a run that needs one CPU
    worker (:func:`runs_in_trial_process`) runs whole there, on the in-process executor, with no worker process
    either. Tune reuses the process for the next trial (``reuse_actors``): torch, raysim and the built datasets
    (``raysim.data.memo``) stay loaded, and a reused process computes what a fresh one does.
    """
    import ray
    from ray import tune

    from raysim.engine.placement import this_node, trial_host

    quiet_exit_on_sigterm()
    os.environ["TUNE_FUNCTION_THREAD_TIMEOUT_S"] = TRIAL_THREAD_END_S  # read by Tune in this process, on reuse
    trial_id, values = split_trial_config(values, tune.get_context().get_trial_id())  # raysim's name for the trial
    group = ray.util.get_current_placement_group()
    if not setup.launch_node or this_node() == setup.launch_node:
        run_trial_on_launch_node(values, setup, trial_id, group, report=tune.report, on_start=lambda info: None,
                                 stopped=lambda: False, own_process=True)
        return
    with trial_host(setup.launch_node) as stream:
        for row in stream(run_trial_on_launch_node, values, setup, trial_id, group):
            tune.report(row)


def run_trial_on_launch_node(values: dict, setup: TrialSetup, trial_id: str, placement_group: Any, *,
                             report: Callable[[dict], None], on_start: Callable[[dict], None],
                             stopped: Callable[[], bool], own_process: bool = False) -> None:
    """A trial's raysim run, on the node that holds the sweep directory; ``report`` sends a row to Tune.
    ``own_process``: this is the trial's own process (not a relay's host), where a one-worker run runs whole.

    A trial run again by a resumed sweep (after Ctrl-C or a kill) or by Tune on another node finds its run
    directory's checkpoint and continues from it; one whose run had already ended (killed before Tune recorded it)
    reports its last round again and runs nothing. A failure leaves its one-line cause in ``error.txt`` and is
    raised to Tune.
    """
    from raysim.engine.placement import TrialStopped
    from raysim.engine.runner import run_experiment
    from raysim.engine.state import has_checkpoint
    from raysim.runlog import read_metrics

    with contextlib.suppress(OSError):
        os.chdir(setup.cwd)  # relative paths in configs mean the user's cwd
    run_dir = setup.run_dir(values, trial_id)
    try:
        cfg = setup.config(values, run_dir)
        if run_dir.is_dir():  # a trial restarted after its node was lost may find the lost attempt's processes still
            # ending (Ray ends them once it notices their owner is gone): wait for them to let go of the directory
            DirLock(run_dir).acquire(LOST_ATTEMPT_WAIT_S).release()
        resume = has_checkpoint(run_dir)
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
        in_process = own_process and runs_in_trial_process(cfg.engine)
        run_experiment(cfg, resume=resume, on_round=lambda m: report(carry(m)), on_start=on_start,
                       placement_group=None if in_process else placement_group, in_process=in_process)
    except BaseException as exc:
        # Tune ending a trial (a scheduler stopped or paused it) is not a failure, whatever error ending its driver
        # caused: through the relay it is TrialStopped; in the trial's own thread Tune raises SystemExit(0)
        ended_by_tune = isinstance(exc, TrialStopped) or stopped() or (isinstance(exc, SystemExit)
                                                                        and exc.code in (None, 0))
        if not (ended_by_tune or lost_with_a_process(exc)):
            _record_error(run_dir, exc)  # its own failure: the sweep shows this cause, and Tune does not restart it
        raise


def lost_with_a_process(exc: BaseException) -> bool:
    """Whether a run failed because Ray lost one of its processes or their node (its driver, the relay, an object
    they held), not for its own reasons: Tune restarts such a trial, which continues from its checkpoint."""
    from ray.exceptions import (LocalRayletDiedError, NodeDiedError, ObjectLostError, RayActorError,
                                WorkerCrashedError)

    from raysim.errors import find_user_error

    if find_user_error(exc) is not None:
        return False
    lost = (RayActorError, WorkerCrashedError, ObjectLostError, NodeDiedError, LocalRayletDiedError)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, lost):
            return True
        cause = getattr(exc, "cause", None)  # RayTaskError keeps the original exception here
        exc = cause if isinstance(cause, BaseException) else exc.__cause__
    return False


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


def trial_bundles(engine: Any) -> list[dict[str, float]]:
    """The bundles a trial reserves: its run's (``raysim.engine.placement.run_bundles``: the driver's, then one per
    worker; a run in the trial's own process computes on its one worker's bundle)."""
    from raysim.engine.placement import run_bundles  # here: Ray is not imported by the seed sets that need none

    return run_bundles(engine)


def _trial_resources(values: dict, setup: TrialSetup) -> Any:
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory(trial_bundles(setup.config(values).engine), strategy="PACK")


def _param_space(spec: SweepSpec) -> dict[str, Any]:
    from ray import tune

    make = {"choice": tune.choice, "grid": tune.grid_search, "uniform": lambda a: tune.uniform(*a),
            "loguniform": lambda a: tune.loguniform(*a), "randint": lambda a: tune.randint(*a)}
    return {key: make[kind](args) for key, dist in spec.space.items() for kind, args in dist.items()}
