"""``raysim run | tune | report``: parse arguments, dispatch, turn user errors into one line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from raysim.errors import RunStopped, UserError, find_user_error

EXIT_USER_ERROR = 2
EXIT_STOPPED = 3
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raysim", description="Ray-based federated learning simulation.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment",
                         description="Run one experiment: raysim run CONFIG.yaml [dotted.key=value ...]")
    run.add_argument("config", nargs="?", help="experiment YAML (optional with --resume)")
    run.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. rounds=5 train.lr=0.1")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    run.add_argument("--quiet", action="store_true", help="no per-round lines")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _cmd_run(args)
    except KeyboardInterrupt:
        print("raysim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - anything that is not the user's to fix is re-raised
        found = find_user_error(exc)
        if isinstance(found, UserError):
            print(f"raysim: error: {found}", file=sys.stderr)
            return EXIT_USER_ERROR
        if isinstance(found, RunStopped):
            print(f"raysim: stopped: {found}", file=sys.stderr)
            return EXIT_STOPPED
        raise
    return 0


def _split_config_and_overrides(args: argparse.Namespace) -> tuple[Optional[str], list[str]]:
    """argparse can't tell CONFIG from an override when CONFIG is omitted (``--resume DIR rounds=8``)."""
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).exists():
        overrides.insert(0, config)
        config = None
    return config, overrides


def _cmd_run(args: argparse.Namespace) -> int:
    from raysim.config import load_config
    from raysim.engine.runner import load_resume_config, run_experiment
    from raysim.runlog import format_round, read_metrics, summary_table

    config, overrides = _split_config_and_overrides(args)
    if args.resume:
        run_dir = Path(args.resume)
        overrides.append(f"log.dir={run_dir}")
        cfg = load_config(config, overrides) if config else load_resume_config(run_dir, overrides)
    else:
        if config is None:
            raise UserError("raysim run needs a CONFIG.yaml (or --resume RUN_DIR)")
        cfg = load_config(config, overrides)

    def on_start(run_dir: Path, start_round: int) -> None:
        what = f"resuming {run_dir} after round {start_round}" if start_round else f"run directory {run_dir}"
        print(f"raysim: {cfg.name}: {cfg.algorithm.name} on {cfg.data.name}, {cfg.clients.num} clients, "
              f"{cfg.engine.num_workers} workers; {what}", flush=True)

    def on_round(m: dict) -> None:
        if not args.quiet and cfg.log.progress:
            print(format_round(m, cfg.rounds), flush=True)
        if m.get("skipped"):
            print(f"raysim: warning: round {m['round']}: dropped non-finite updates of clients {m['skipped']}",
                  file=sys.stderr, flush=True)

    run_dir, _, stopped = run_experiment(cfg, resume=bool(args.resume), on_round=on_round, on_start=on_start,
                                         handle_sigint=True)
    print(summary_table(read_metrics(run_dir / "metrics.jsonl"), run_dir))
    if stopped:
        print(f"raysim: interrupted; resume with: raysim run --resume {run_dir}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
