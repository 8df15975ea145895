"""A seed set whose runs are in-process (``raysim run --seeds`` when they resolve to ``engine.backend=inline``):
no Ray and no Tune. With ``engine.backend=inline`` set, each seed runs in this process, one after another (your own
frames in every error, ``breakpoint()`` in a hook works); with ``auto`` (in-process on one machine), as many seeds
run at once as the machine's cores hold: in this process and in helper processes, each running seed after seed
(``raysim.tune.seedpool``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from raysim.tables import counted
from raysim.tune.results import seed_trials
from raysim.tune.spec import SweepSpec
from raysim.tune.seedrun import DONE, ENDED_BEFORE, FAILED, STOPPED, run_one_seed
from raysim.tune.trials import TrialSetup


PROCESS_GIB = 1.0  # memory a seed's process is counted at (torch and raysim ~0.4 GiB, the data and model besides)


def seeds_at_once(engine: Any, seeds: int) -> int:
    """How many seeds run at once: one per ``engine.cpus_per_worker`` cores this process may use, at most one per
    seed and one per :data:`PROCESS_GIB` of available memory; one (in this very process) when
    ``engine.backend=inline`` is set."""
    if engine.backend == "inline":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    memory = _available_gib() / PROCESS_GIB
    return max(1, min(seeds, int(cores // engine.cpus_per_worker), int(memory) if memory < seeds else seeds))


def _available_gib() -> float:
    """The memory the kernel says is available (``MemAvailable``); unknown: no limit."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024**2
    except (OSError, ValueError):
        pass
    return float("inf")


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
    where = "in this process" if at_once == 1 else f"{at_once} at once (this process and {at_once - 1} more)"
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
            run_seed_pool(setup, todo, at_once, first.rounds, tell)
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
