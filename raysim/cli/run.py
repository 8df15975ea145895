"""``raysim run``: one run, or one config over several seeds (``--seeds``)."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import raysim.interrupts as interrupts
from raysim.cli.common import _LAUNCHED, _RUN_DIR, _resume_hint, _split_config_and_overrides, check_resume_overrides
from raysim.cli.tune import _sweep_outcome
from raysim.errors import UserError
from raysim.tables import counted


def _cmd_run(args: argparse.Namespace) -> int:
    config, overrides = _split_config_and_overrides(args)
    # the first line, before anything slow (the engine's modules, the config's algorithm, which imports torch, and
    # Ray, which takes seconds to start)
    print(f"raysim: {'resuming ' + args.resume if args.resume else 'starting ' + (config or 'the built-in defaults')}"
          f"{' with ' + ' '.join(overrides) if overrides else ''}", flush=True)
    # the whole config is checked before the engine is imported (raysim.engine.runner imports torch: seconds), so a
    # typo fails at once (benchmarks/cli_latency.py --only errors)
    from raysim.config import load_config
    from raysim.engine.resume_config import load_resume_config
    from raysim.preflight import check, load_checked

    if args.resume:
        run_dir = Path(args.resume)
        check_resume_overrides("run", overrides, run_dir)
        overrides.append(f"log.dir={run_dir}")
        cfg = load_config(config, overrides) if config else load_resume_config(run_dir, overrides)
    else:  # without CONFIG.yaml: the defaults plus the overrides (every wrong one named at once)
        cfg = load_checked(config, overrides)

    given = [o for o in overrides if not (args.resume and o == f"log.dir={args.resume}")]
    check(cfg, ["raysim", "run", *(["--resume", args.resume] if args.resume else []), *([config] if config else []),
                *given], data=not args.resume)
    if args.overwrite:
        _start_over(cfg, args)

    from raysim.engine.backend import starts_local_ray
    from raysim.engine.runner import already_complete, run_experiment
    from raysim.console import LiveRound, ProgressLine, describe_mode, privacy_delta, summary_table
    from raysim.runlog import read_metrics

    if args.resume:
        done = already_complete(run_dir, cfg)
        if done is not None:
            print(summary_table(read_metrics(run_dir / "metrics.jsonl"), run_dir, cfg=cfg))
            print(f"raysim: {run_dir} is already complete ({counted(done, 'round')} run, rounds={cfg.rounds}); "
                  f"nothing to run. "
                  f"To continue it, add rounds=N with N > {done}: raysim run --resume {run_dir} rounds={2 * done}",
                  file=sys.stderr)
            return 0

    from raysim.tracking import RunTracker

    tracker = RunTracker(cfg)  # a tracking extra that is not installed: one line, before anything starts
    line = ProgressLine(cfg.rounds, delta=privacy_delta(cfg))
    live = LiveRound(cfg.rounds) if (not args.quiet and cfg.log.progress and sys.stderr.isatty()) else None

    resumed_after = [0]
    controls: list = []

    def on_first_round(m: dict) -> None:
        if cfg.engine.vectorize == "auto" and controls and not args.quiet:
            n, why = controls[0].vectorize_choice()
            print(f"raysim: engine.vectorize=auto: {'one client at a time' if n == 1 else f'{n} clients per stack'} "
                  f"({why})", flush=True)

    def on_start(info: dict) -> None:
        run_dir, start_round = info["run_dir"], info["start_round"]
        controls[:] = [info["control"]]
        tracker.start(run_dir, start_round)
        line.start(start_round)
        if live is not None:
            live.start(info["control"])
        _RUN_DIR[:] = [run_dir]
        resumed_after[0] = start_round
        what = f"resuming {run_dir} after round {start_round}" if start_round else f"run directory {run_dir}"
        mode = describe_mode(cfg)  # the asynchronous mode, the simulated clock, privacy
        print(f"raysim: {cfg.name}: {cfg.algorithm.name} on {cfg.data.name}, {cfg.clients.num} clients, "
              f"{mode + ', ' if mode else ''}{_where(cfg)}; {what}", flush=True)

    def on_round(m: dict) -> None:
        tracker.log(m)
        if not args.quiet and cfg.log.progress:
            if live is not None:
                if m["round"] >= cfg.rounds:
                    live.stop()  # before Ray shuts down
                live.clear()
            print(line.format(m), flush=True)
        if m["round"] == resumed_after[0] + 1:
            on_first_round(m)
        if m.get("skipped"):
            print(f"raysim: warning: round {m['round']}: dropped non-finite updates of clients {m['skipped']}",
                  file=sys.stderr, flush=True)

    if starts_local_ray(cfg.engine):
        instead = ("engine.backend=auto with engine.num_workers=1" if cfg.engine.backend == "ray"
                   else "engine.num_workers=1")
        print(f"raysim: starting a local Ray for {_where(cfg)}: its start costs about 5 s before round 1 here "
              f"({instead} runs in this process, with the same numbers)", flush=True)
    status = "FAILED"
    try:
        run_dir, _, stopped = run_experiment(cfg, resume=bool(args.resume), on_round=on_round, on_start=on_start,
                                             handle_signals=True)
        status = "KILLED" if stopped else "FINISHED"
    finally:
        if live is not None:
            live.stop()
        tracker.close(status)
    print(summary_table(read_metrics(run_dir / "metrics.jsonl"), run_dir, elapsed=time.perf_counter() - _LAUNCHED,
                        resumed_after=resumed_after[0], cfg=cfg))
    if stopped:
        how = "stopped by SIGTERM" if interrupts.terminated() else "interrupted"
        print(f"raysim: {how}{_resume_hint(None, say_round=True)}", file=sys.stderr)
        return interrupts.exit_status()
    return 0


def _start_over(cfg: Any, args: argparse.Namespace) -> None:
    """``--overwrite``: empty ``log.dir`` of the run it holds, so that this run starts there afresh. Refused for a
    resume, for a folder that is not one run's directory (no ``config.yaml``, or a seed set's or sweep's), and while
    another process holds the directory's lock."""
    from raysim.dirlock import LOCK_NAME, DirLock

    if args.resume:
        raise UserError("--overwrite starts a run over and --resume continues one: give one of them")
    if not cfg.log.dir:
        raise UserError("--overwrite starts over the run in log.dir, and log.dir is not set (without it, every run "
                        "gets a new directory): add log.dir=DIR")
    run_dir = Path(cfg.log.dir)
    entries = sorted(p for p in run_dir.iterdir() if p.name != LOCK_NAME) if run_dir.is_dir() else []
    if not entries:
        return
    if not (run_dir / "config.yaml").is_file() or (run_dir / "sweep.yaml").exists():
        raise UserError(f"config key 'log.dir': --overwrite removes only a run directory, and {run_dir} is not one "
                        f"(no config.yaml{', a seed set or sweep' if (run_dir / 'sweep.yaml').exists() else ''}); "
                        f"choose another log.dir or empty it yourself")
    with DirLock(run_dir):  # refused at once while another raysim process runs there
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    print(f"raysim: --overwrite: removed the run in {run_dir}", file=sys.stderr, flush=True)


def _where(cfg: Any) -> str:
    """Where a run's clients train, and why when the config left ``engine.num_workers`` to raysim."""
    from raysim.engine.backend import choose_backend

    n = cfg.engine.num_workers
    where = "in this process" if choose_backend(cfg.engine) == "inline" else f"{n} worker{'s' if n > 1 else ''} on Ray"
    reason = getattr(cfg.engine, "workers_chosen", None)
    return f"{where} (engine.num_workers unset: {reason})" if reason else where


def _is_seeds(args: argparse.Namespace) -> bool:
    return bool(args.seeds) or bool(args.resume and (Path(args.resume) / "sweep.yaml").is_file())


def _cmd_seeds(args: argparse.Namespace) -> int:
    config, overrides = _split_config_and_overrides(args)
    if args.overwrite:
        raise UserError("--overwrite starts one run over; to start a seed set over, remove its directory")
    if args.resume:
        from raysim.tune import run_seeds

        check_resume_overrides("seeds", overrides, Path(args.resume))
        result = run_seeds(None, overrides, [], resume_dir=Path(args.resume), quiet=args.quiet)
    else:  # without CONFIG.yaml: the defaults plus the overrides, as for a single run (checked before Ray's import)
        from raysim.preflight import check, load_checked

        check(load_checked(config, [o for o in overrides if not o.startswith("seed=")], warn=False),
              ["raysim", "run", *([config] if config else []), "--seeds", args.seeds, *overrides])
        from raysim.tune import parse_seeds, run_seeds

        result = run_seeds(config, overrides, parse_seeds(args.seeds), quiet=args.quiet)
    return _sweep_outcome(result, "raysim run --resume", "seeds")
