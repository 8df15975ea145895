"""``raysim tune``: a sweep on Ray Tune, and how a sweep or seed set ends (its table, failures, resume hint)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import raysim.interrupts as interrupts
from raysim.cli.common import EXIT_TRIALS_FAILED, check_resume_overrides
from raysim.errors import UserError
from raysim.tables import counted

if TYPE_CHECKING:
    from raysim.tune import SweepResult


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
    compare = f"compare: tensorboard --logdir {d}; " if any(d.rglob("events.out.tfevents.*")) else ""  # log.tensorboard
    print(f"raysim: table {d / 'results.md'} (csv: results.csv); {best}{compare}summarise: raysim report {d}")
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

