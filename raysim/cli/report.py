"""``raysim report``: tables, tests and plots from run directories, or a run's t-SNE."""

from __future__ import annotations

import argparse
from pathlib import Path

from raysim.errors import UserError


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

