"""``raysim run | tune | report``: parse arguments, dispatch, turn user errors into one line and exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import raysim.interrupts as interrupts
from raysim.errors import RunStopped, UserError, find_user_error
from raysim.tables import DEFAULT_COLUMNS, counted

if TYPE_CHECKING:
    from raysim.tune import SweepResult

EXIT_USER_ERROR = 2
EXIT_STOPPED = 3
EXIT_TRIALS_FAILED = 1  # a sweep or seed set ran to its end, but some trials failed
EXIT_INTERRUPTED = interrupts.EXIT_INTERRUPTED  # Ctrl-C
EXIT_TERMINATED = interrupts.EXIT_TERMINATED  # SIGTERM (a scheduler preempting the job)
_LAUNCHED = time.perf_counter()  # when the command started (the summary's wall time counts start-up)
_RUN_DIR: list[Path] = []  # the run directory of the current `raysim run`, for the resume hint


def _parser() -> argparse.ArgumentParser:
    from raysim import __version__

    p = argparse.ArgumentParser(prog="raysim", description="Ray-based federated learning simulation.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES["raysim"])
    p.add_argument("--version", action="version", version=f"raysim {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment", formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Run one experiment: raysim run CONFIG.yaml [dotted.key=value ...]",
                         epilog=_EXAMPLES["run"])
    run.add_argument("config", nargs="?", help="experiment YAML (default: built-in defaults; optional with --resume)")
    run.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. rounds=5 train.lr=0.1")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    run.add_argument("--quiet", action="store_true", help="no per-round lines")
    run.add_argument("--seeds", metavar="SEEDS",
                     help="run the config once per seed (0-9, 0,3,5 or 0-4,10), in parallel where resources allow, "
                          "each in PARENT/seed-<n> (PARENT = log.dir or runs/<config>-seeds-<time>); "
                          "with --resume PARENT, continue such a set")

    tune = sub.add_parser("tune", help="hyperparameter sweep with Ray Tune", epilog=_EXAMPLES["tune"],
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          description="Run a sweep: raysim tune SWEEP.yaml [dotted.key=value ...]. Overrides of "
                                      "sweep keys (num_samples=4, scheduler.name=asha, metric=acc_global, dir=...) "
                                      "set the sweep; all others set every trial's experiment config.")
    tune.add_argument("sweep", nargs="?", help="sweep YAML (optional with --resume)")
    tune.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    tune.add_argument("--resume", metavar="SWEEP_DIR", help="continue an interrupted sweep")
    tune.add_argument("--quiet", action="store_true", help="no per-round lines, only trials done and best so far")

    report = sub.add_parser("report", help="tables, significance tests and plots from run directories",
                            epilog=_EXAMPLES["report"], formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Summarise runs: raysim report RUN_DIR... [--out DIR]. Run directories may "
                                        "be nested in sweep or seed directories.")
    report.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run directories or folders that hold them")
    report.add_argument("--out", metavar="DIR", help="where to write (default: RUN_DIR/report for one RUN_DIR, "
                                                     "else ./report)")
    report.add_argument("--metric", default="acc_mean", metavar="KEY",
                        help="any numeric metrics.jsonl key to compare: acc_mean (default), acc_global, acc_weighted, "
                             "loss, bytes_up_total, k, p ...")
    report.add_argument("--mode", default="auto", choices=("auto", "max", "min"),
                        help="whether the metric's best is its maximum or its minimum (auto: min for loss*, bytes* "
                             "and wall_s*, max for the rest)")
    report.add_argument("--target", type=float, default=0.5,
                        help="value of the metric for the rounds / MB / seconds-to-target columns (default 0.5)")
    report.add_argument("--columns", default=",".join(DEFAULT_COLUMNS), metavar="PREFIXES",
                        help="comma-separated config-key prefixes that make the table's columns (settings); other "
                             f"varying keys make its rows (methods). Default: {','.join(DEFAULT_COLUMNS)}")
    report.add_argument("--no-plots", action="store_true", help="tables only")
    report.add_argument("--layout", default="auto", choices=("auto", "name", "keys"),
                        help="name: methods as rows and settings as columns, read from config names "
                             "'<setting>-<method>' (the seeds' tables); keys: columns from the keys that vary; "
                             "auto: name when every run is named that way")
    report.add_argument("--tsne", metavar="RUN_DIR", help="export RUN_DIR's test-set features (last checkpoint) and "
                                                         "draw their t-SNE (features.npz, tsne.csv, tsne.png)")
    report.add_argument("--tsne-max", type=int, default=2000, metavar="N",
                        help="t-SNE at most N test samples, a class-stratified subset (default 2000)")

    config = sub.add_parser("config", help="show a resolved config, or every config key with its help",
                            epilog=_EXAMPLES["config"], formatter_class=argparse.RawDescriptionHelpFormatter)
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the resolved YAML of CONFIG plus overrides",
                                 description="Print the resolved YAML of CONFIG plus overrides: every key filled in.",
                                 epilog=_EXAMPLES["config show"], formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("config", nargs="?", help="experiment YAML (default: the built-in defaults)")
    show.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    keys = config_sub.add_parser("keys", help="every key: type, default and help",
                                 description="Every config key with its type, default and one-line help.",
                                 epilog=_EXAMPLES["config keys"], formatter_class=argparse.RawDescriptionHelpFormatter)
    keys.add_argument("--algorithm", metavar="NAME", help="list this algorithm's algorithm.* keys (default fedavg)")
    keys.add_argument("--model", metavar="NAME", action="append", default=[],
                      help="add the model.<NAME>.* section a plugin model declares")
    keys.add_argument("--dataset", metavar="NAME", help="add the data.<NAME>.* section a plugin dataset declares")
    keys.add_argument("--plugins", metavar="MODULES", default="", help="comma-separated plugin modules to import")

    data = sub.add_parser("data", help="look at a federation before running it", epilog=_EXAMPLES["data"],
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    data_sub = data.add_subparsers(dest="data_command", required=True)
    data_show = data_sub.add_parser("show", help="label counts per client and a clients x classes heat map (PNG)",
                                    description="Build CONFIG's federation as a run would (no Ray) and show what each "
                                                "client holds: label counts per client, and a heat map PNG.",
                                    epilog=_EXAMPLES["data"], formatter_class=argparse.RawDescriptionHelpFormatter)
    data_show.add_argument("config", nargs="?", help="experiment YAML or a shipped experiment's name")
    data_show.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    data_show.add_argument("--out", metavar="PNG", help="the heat map's file (default: ./<name>-partition.png)")
    data_show.add_argument("--clients", type=int, default=50, metavar="N",
                           help="print the first N clients (default 50; the heat map shows up to 200)")

    lister = sub.add_parser("list", help="the registered algorithms, models or datasets (plugins included), or the "
                                         "shipped experiments",
                            epilog=_EXAMPLES["list"], formatter_class=argparse.RawDescriptionHelpFormatter)
    lister.add_argument("kind", nargs="?", choices=LIST_KINDS,
                        help="what to list (none: a summary of each with its count)")
    lister.add_argument("pattern", nargs="?", metavar="PATTERN",
                        help="only names containing PATTERN (or matching a glob such as 'fapd/*moon*')")
    lister.add_argument("--all", action="store_true", help="experiments: also the base files others extend")
    lister.add_argument("--plugins", metavar="MODULES", default="", help="comma-separated plugin modules to import")
    return p


LIST_KINDS = ("algorithms", "models", "datasets", "experiments")

_EXAMPLES = {
    "raysim": """examples:
  raysim run experiments/smoke.yaml                       a FedAvg run in under a minute
  raysim run experiments/default.yaml rounds=20 train.lr=0.1
  raysim config keys --algorithm unideal                  every key, its type, default and help
  raysim list algorithms                                  what algorithm.name accepts
  raysim tune experiments/sweeps/smoke-lr.yaml            a Ray Tune sweep
  raysim report runs/a runs/b --out runs/report           tables, t-tests and plots
  python -m raysim ...                                    the same command""",
    "run": """examples:
  raysim run experiments/smoke.yaml
  raysim run experiments/default.yaml rounds=20 train.lr=0.1 log.dir=runs/mine
  raysim run --resume runs/mine                    continue after a crash, Ctrl-C or SIGTERM
  raysim run experiments/smoke.yaml --seeds 0-4    five seeds, results.md with mean +- std
  raysim run experiments/default.yaml engine.address=auto engine.num_workers=16   on a running cluster""",
    "tune": """examples:
  raysim tune experiments/sweeps/smoke-lr.yaml dir=runs/sweeps/smoke-lr
  raysim tune experiments/sweeps/smoke-lr.yaml num_samples=8 search.name=optuna scheduler.name=hyperband
  raysim tune --resume runs/sweeps/smoke-lr""",
    "report": """examples:
  raysim report runs/smoke-best runs/smoke-local --out runs/smoke-report --target 0.6
  raysim report runs/sweeps/smoke-lr --metric acc_global
  raysim report runs/sweeps/smoke-lr --metric loss          lower is better for loss, bytes and seconds""",
    "config": """examples:
  raysim config show experiments/smoke.yaml rounds=3      the resolved YAML, every key filled in
  raysim config keys                                      common keys (and FedAvg's)
  raysim config keys --algorithm fapd                     plus algorithm.* of FAPD
  raysim config keys --plugins my_models --model tiny     plus a plugin model's model.tiny.* keys""",
    "config show": """examples:
  raysim config show experiments/smoke.yaml               the smoke experiment, every key filled in
  raysim config show smoke rounds=3 train.lr=0.2          a shipped experiment by name, with overrides
  raysim config show algorithm.name=fedprox               the defaults with FedProx (and its algorithm.mu)
  raysim config show runs/mine/config.yaml > mine.yaml    a run's config, to edit and run again""",
    "config keys": """examples:
  raysim config keys                                      common keys (and FedAvg's)
  raysim config keys --algorithm fedprox                  plus FedProx's algorithm.* keys
  raysim config keys | grep '^data\\.'                     only the data.* keys
  raysim config keys --plugins resmlp --model resmlp      plus a plugin model's model.resmlp.* keys""",
    "data": """examples:
  raysim data show smoke                                  the smoke experiment's Dirichlet(0.5) split
  raysim data show smoke data.partition=pathological data.classes_per_client=2
  raysim data show smoke data.partition=shard --out shards.png""",
    "list": """examples:
  raysim list algorithms
  raysim list                                      a summary: how many of each, and a few names
  raysim list experiments                          the shipped configs (raysim run NAME), tagged with what they need
  raysim list experiments fapd/cifar10             only the names containing fapd/cifar10
  raysim list models --plugins my_models""",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # overrides after an option (`run CONFIG --seeds 0-4 rounds=3`): argparse leaves them over
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    with interrupts.handled():  # Ctrl-C and SIGTERM: finish the round, checkpoint, one line, exit 130 / 143
        try:
            if args.command == "run":
                return _cmd_seeds(args) if _is_seeds(args) else _cmd_run(args)
            if args.command == "tune":
                return _cmd_tune(args)
            if args.command == "report":
                return _cmd_report(args)
            if args.command == "config":
                return _cmd_config(args)
            if args.command == "list":
                return _cmd_list(args)
            if args.command == "data":
                return _cmd_data(args)
        except KeyboardInterrupt as exc:  # a second signal, SIGTERM's grace period over, or nothing to stop gently
            print(f"raysim: {_interrupted()}{_resume_hint(exc, say_round=True)}", file=sys.stderr)
            return interrupts.exit_status()
        except BaseException as exc:  # noqa: BLE001 - anything that is not the user's to fix is re-raised
            found = find_user_error(exc)
            if isinstance(found, UserError):
                print(f"raysim: error: {found}", file=sys.stderr)
                return EXIT_USER_ERROR
            if isinstance(found, RunStopped):
                print(f"raysim: stopped: {found}{_resume_hint(found)}", file=sys.stderr)
                return EXIT_STOPPED
            raise
    return 0


def _interrupted() -> str:
    how = "stopped by SIGTERM" if interrupts.terminated() else "interrupted"
    return f"{how}: {interrupts.abandoned()}" if interrupts.abandoned() else how


def _resume_hint(exc: Optional[BaseException], say_round: bool = False) -> str:
    """"; resume with: ..." for the run, seed set or sweep that ``exc`` stopped (None: the run of this `raysim run`),
    as far as it is known; ``say_round``: also which round a run's checkpoint holds (a RunStopped message says so
    itself)."""
    command = getattr(exc, "resume_command", None)  # set by a sweep or seed set
    if command:
        return f"; resume with: {command}"
    run_dir = getattr(exc, "run_dir", None) or (_RUN_DIR[0] if _RUN_DIR else None)
    if run_dir is None:
        return ""
    from raysim.engine.state import has_checkpoint, read_checkpoint

    if not has_checkpoint(Path(run_dir)):
        return "; no round was checkpointed: start the run again"
    done = ""
    if say_round:
        with contextlib.suppress(UserError):
            done = f"round {int(read_checkpoint(Path(run_dir))['round'])} is checkpointed; "
    return f"; {done}resume with: raysim run --resume {run_dir}"


def entry() -> int:
    """The ``raysim`` command: ``main()``, then a faster exit. With torch loaded, the interpreter's final garbage
    collection walks every torch object for ~0.7 s; frozen objects are skipped (atexit handlers still run)."""
    code = main()
    gc.freeze()
    return code


def _split_config_and_overrides(args: argparse.Namespace) -> tuple[Optional[str], list[str]]:
    """argparse can't tell CONFIG from an override when CONFIG is omitted (``--resume DIR rounds=8``)."""
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).exists():
        overrides.insert(0, config)
        config = None
    return config, overrides


def _cmd_run(args: argparse.Namespace) -> int:
    config, overrides = _split_config_and_overrides(args)
    # the first line, before anything slow (the engine's modules, the config's algorithm, which imports torch, and
    # Ray, which takes seconds to start)
    print(f"raysim: {'resuming ' + args.resume if args.resume else 'starting ' + (config or 'the built-in defaults')}"
          f"{' with ' + ' '.join(overrides) if overrides else ''}", flush=True)
    from raysim.config import load_config
    from raysim.engine.backend import starts_local_ray
    from raysim.engine.runner import already_complete, load_resume_config, run_experiment
    from raysim.runlog import LiveRound, ProgressLine, read_metrics, summary_table

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

    if args.resume:
        done = already_complete(run_dir, cfg)
        if done is not None:
            print(summary_table(read_metrics(run_dir / "metrics.jsonl"), run_dir))
            print(f"raysim: {run_dir} is already complete ({counted(done, 'round')} run, rounds={cfg.rounds}); "
                  f"nothing to run. "
                  f"To continue it, add rounds=N with N > {done}: raysim run --resume {run_dir} rounds={2 * done}",
                  file=sys.stderr)
            return 0

    from raysim.tracking import RunTracker

    tracker = RunTracker(cfg)  # a tracking extra that is not installed: one line, before anything starts
    line = ProgressLine(cfg.rounds)
    live = LiveRound(cfg.rounds) if (not args.quiet and cfg.log.progress and sys.stderr.isatty()) else None

    resumed_after = [0]
    controls: list = []

    def on_first_round(m: dict) -> None:
        if cfg.engine.vectorize == "auto" and controls and not args.quiet:
            n, why = controls[0].vectorize_choice()
            print(f"raysim: engine.vectorize=auto: {'one client at a time' if n == 1 else f'{n} clients per cohort'} "
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
        where = _where(cfg)
        print(f"raysim: {cfg.name}: {cfg.algorithm.name} on {cfg.data.name}, {cfg.clients.num} clients, "
              f"{where}; {what}", flush=True)

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
                        resumed_after=resumed_after[0]))
    if stopped:
        how = "stopped by SIGTERM" if interrupts.terminated() else "interrupted"
        print(f"raysim: {how}{_resume_hint(None, say_round=True)}", file=sys.stderr)
        return interrupts.exit_status()
    return 0


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
    from raysim.tune import parse_seeds, run_seeds

    config, overrides = _split_config_and_overrides(args)
    if args.resume:
        check_resume_overrides("seeds", overrides, Path(args.resume))
        result = run_seeds(None, overrides, [], resume_dir=Path(args.resume), quiet=args.quiet)
    else:  # without CONFIG.yaml: the defaults plus the overrides, as for a single run
        from raysim.preflight import check, load_checked

        check(load_checked(config, [o for o in overrides if not o.startswith("seed=")], warn=False),
              ["raysim", "run", *([config] if config else []), "--seeds", args.seeds, *overrides])
        result = run_seeds(config, overrides, parse_seeds(args.seeds), quiet=args.quiet)
    return _sweep_outcome(result, "raysim run --resume", "seeds")


# what a resume may change: what the run is (its length) and how it runs, never what it computes (the single run's
# rule, raysim.engine.runner, stated here for the one-line answer that every kind of resume gives)
RESUMABLE = ("rounds", "eval.every", "eval.chunk", "engine.*", "log.*")


def check_resume_overrides(kind: str, overrides: Sequence[str], target: Path) -> None:
    """``--resume`` of a run (``kind="run"``), a seed set (``"seeds"``) or a sweep (``"sweep"``) with overrides: the
    same rule for all three, answered in one line before anything starts. A run applies the keys of ``RESUMABLE``
    and refuses the rest; a seed set or sweep resumes its runs with the config they started with, so it refuses
    every override, naming the command that applies it to one of its runs."""
    given = [o for o in overrides if "=" in o and not o.startswith("log.dir=")]
    if not given:
        return
    keys = [o.split("=", 1)[0] for o in given]
    if kind == "run":
        bad = [o for o, k in zip(given, keys)
               if not (k in ("rounds", "eval.every", "eval.chunk") or k.startswith(("engine.", "log.")))]
        if bad:
            raise UserError(f"--resume {target}: {' '.join(bad)} would change what the run computes, so a resume "
                            f"refuses it; a resume may change {', '.join(RESUMABLE)} (start a new run for the rest)")
        return
    what = "seed set" if kind == "seeds" else "sweep"
    one = next(iter(sorted(target.glob("seed-*" if kind == "seeds" else "trials/*"))), None)
    example = one if one is not None else target / ("seed-0" if kind == "seeds" else "trials/<trial>")
    raise UserError(f"--resume {target}: a {what} resumes its runs with the config they started with, so it "
                    f"applies no override ({' '.join(given)}); resume one of its runs alone to change "
                    f"{', '.join(RESUMABLE)}: raysim run --resume {example} {' '.join(given)}")


def _cmd_tune(args: argparse.Namespace) -> int:
    from raysim.tune import load_sweep, run_sweep, spec_from_yaml

    if args.resume:
        sweep_dir = Path(args.resume)
        check_resume_overrides("sweep", [*([args.sweep] if args.sweep else []), *args.overrides], sweep_dir)
        spec = spec_from_yaml(sweep_dir / "sweep.yaml")
        result = run_sweep(spec, sweep_dir=sweep_dir, resume=True, quiet=args.quiet)
    else:
        if args.sweep is None:
            raise UserError("raysim tune needs a SWEEP.yaml (or --resume SWEEP_DIR)")
        result = run_sweep(load_sweep(args.sweep, args.overrides), quiet=args.quiet)
    return _sweep_outcome(result, "raysim tune --resume", "trials")


def _sweep_outcome(result: "SweepResult", resume_cmd: str, what: str) -> int:
    """Print the table; exit 0 when every trial ended normally (done, or stopped early by ASHA), 1 when some failed
    (each one's cause is in the table and printed here), 130 with a resume hint when some never finished."""
    print(result.table_md)
    d = result.sweep_dir
    best = f"best config {d / 'best.yaml'}; " if result.best else ""
    print(f"raysim: table {d / 'results.md'} (csv: results.csv); {best}"
          f"compare: tensorboard --logdir {d}; summarise: raysim report {d}")
    unfinished = [r for r in result.rows if r["status"] == "unfinished"]
    failed = [r for r in result.rows if r["status"].startswith("error")]
    for r in failed:
        cause = r["status"].partition(": ")[2] or f"see Ray Tune's error file under {d / 'tune'}"
        print(f"raysim: {what[:-1]} {r['trial']} failed: {cause}", file=sys.stderr)
    if failed:
        print(f"raysim: {counted(len(failed), what[:-1])} failed; `{resume_cmd} {d}` runs "
              f"{'it' if len(failed) == 1 else 'them'} again", file=sys.stderr)
    if unfinished:
        how = "stopped by SIGTERM: " if interrupts.terminated() else ""
        print(f"raysim: {how}{counted(len(unfinished), what[:-1])} unfinished; resume with: {resume_cmd} {d}",
              file=sys.stderr)
        return interrupts.exit_status()
    return EXIT_TRIALS_FAILED if failed else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from raysim.report import format_console, make_report

    if args.tsne:
        from raysim.features import tsne

        out = Path(args.out) if args.out else Path(args.tsne) / "report"
        files = tsne(Path(args.tsne), out, max_points=args.tsne_max)
        print(f"t-SNE of {args.tsne}'s test features: {', '.join(str(f) for f in files.values())}")
        if not args.runs:
            return 0
    if not args.runs:
        raise UserError("report needs RUN_DIR... (run directories or folders that hold them), or --tsne RUN_DIR")
    out = Path(args.out) if args.out else (Path(args.runs[0]) / "report" if len(args.runs) == 1 else Path("report"))
    columns = tuple(c.strip() for c in args.columns.split(",") if c.strip())
    report = make_report(args.runs, out, metric=args.metric, target=args.target, columns=columns,
                         plots=not args.no_plots, layout=args.layout, mode=args.mode, announce=True)
    print(format_console(report, out))
    return 0


def _plugins(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def _cmd_config(args: argparse.Namespace) -> int:
    from raysim.config import load_config, to_yaml

    if args.config_command == "show":
        config, overrides = _split_config_and_overrides(args)
        print(to_yaml(load_config(config, overrides)), end="")
        return 0
    from raysim.schema import config_keys, format_keys

    print(format_keys(config_keys(args.algorithm, tuple(args.model), args.dataset, _plugins(args.plugins))))
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from raysim.config import load_config
    from raysim.data.show import show

    if args.clients < 1:
        raise UserError("--clients must be >= 1")
    config, overrides = _split_config_and_overrides(args)
    cfg = load_config(config, overrides)
    table, png = show(cfg, Path(args.out) if args.out else None, clients=args.clients)
    print(table)
    print(f"raysim: heat map of label counts per client: {png}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from raysim.catalog import describe_experiments, matches
    from raysim.registry import describe, import_plugins

    import_plugins(list(_plugins(args.plugins)))
    if args.kind is None:
        print(_list_summary())
        return 0
    if args.kind == "experiments":
        rows = describe_experiments(args.pattern, bases=args.all)
    else:
        rows = [(n, d) for n, d in describe(args.kind[:-1]) if matches(n, args.pattern)]
    if not rows:
        raise UserError(f"no {args.kind} match {args.pattern!r}; `raysim list {args.kind}` lists them all")
    print(_two_columns(rows))
    return 0


def _list_summary() -> str:
    """``raysim list``: each kind with its count, a few names, and the command that lists it."""
    from raysim.catalog import TAG_CPU, TAG_GPU, TAG_ROOT, describe_experiments
    from raysim.registry import describe

    lines = []
    for kind in LIST_KINDS[:3]:
        found = [n for n, _ in describe(kind[:-1])]
        lines.append(f"{kind:<12} {len(found):>3}  {', '.join(found[:6])}{', ...' if len(found) > 6 else ''}  "
                     f"(raysim list {kind})")
    rows = describe_experiments()
    runs = [d for n, d in rows if not n.startswith("sweeps/")]
    count = {tag: sum(tag in d.split("]", 1)[0] for d in runs) for tag in (TAG_CPU, TAG_ROOT, TAG_GPU)}
    lines.append(f"{'experiments':<12} {len(runs):>3}  {count[TAG_CPU]} with embedded data on CPU, "
                 f"{count[TAG_ROOT]} needing data.root, {count[TAG_GPU]} needing a GPU; {len(rows) - len(runs)} "
                 f"sweeps  (raysim list experiments [PATTERN])")
    return "\n".join(lines)


def _two_columns(rows: list[tuple[str, str]]) -> str:
    """Names, and their descriptions wrapped to the terminal's width under a hanging indent (never cut)."""
    import shutil
    import textwrap

    width = max(len(name) for name, _ in rows)
    text_width = max(40, shutil.get_terminal_size((120, 24)).columns - width - 2)
    lines = []
    for name, doc in rows:
        wrapped = textwrap.wrap(doc, text_width) or [""]
        lines.append(f"{name:<{width}}  {wrapped[0]}")
        lines.extend(" " * (width + 2) + more for more in wrapped[1:])
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(entry())
