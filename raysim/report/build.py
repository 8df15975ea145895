"""``make_report``: find, group and score the runs, then write the tables, the plots and report.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from raysim.errors import UserError
from raysim.report.grouping import _group_runs
from raysim.report.markdown import _write_markdown
from raysim.report.model import ALPHA, Group, Report, hashable, ignored, metric_direction, metric_mode
from raysim.report.plots import _plottable, write_plots, write_target_plot
from raysim.report.runs import find_runs, load_run
from raysim.report.scoring import (_warn_missing_metric, _write_comm_csv, _write_summary_csv, _write_table_csv,
                                   check_metric, score)
from raysim.report_stats import write_extra_csvs
from raysim.runlog import warn_stderr
from raysim.tables import DEFAULT_COLUMNS


def make_report(paths: Sequence[str | Path], out: Path, *, metric: str = "acc_mean", target: float = 0.5,
                columns: Sequence[str] = DEFAULT_COLUMNS, alpha: float = ALPHA, plots: bool = True,
                layout: str = "auto", mode: str = "auto", announce: bool = False) -> Report:
    """Find, group and score the runs; write report.md, table.csv, summary.csv, final_table.csv, comm.csv, clients.csv
    (when runs have client_metrics.jsonl) and the PNG plots.

    ``metric`` is any numeric key of ``metrics.jsonl``; ``mode`` says whether its best is the maximum or the minimum
    (``auto``: the metric's direction, ``raysim.report.model.metric_direction``: the lowest for losses, traffic,
    seconds, ε and an attack's success). ``layout`` says how methods (rows) and settings (columns) are found: see the
    docstring of ``raysim.report``. ``announce``: say on stderr what a searched folder held."""
    if mode not in ("auto", "max", "min"):
        raise UserError(f"--mode must be auto, max or min, got {mode!r}")
    unknown = mode == "auto" and metric_direction(metric) is None
    mode = metric_mode(metric) if mode == "auto" else mode
    found: list[str] = []
    runs = [load_run(p) for p in find_runs(paths, found=found)]
    runs = [r for r in runs if r.rows]
    if not runs:
        raise UserError("no run has completed a round (every metrics.jsonl is empty)")
    check_metric(runs, metric)
    if announce:
        for line in found:
            print(f"raysim: report: {line}", file=sys.stderr)
    groups, layout = _group_runs(runs, columns, layout)
    score(groups, metric, alpha, mode)
    _warn_missing_metric(groups, metric)
    notes = group_warnings(groups)
    if unknown:  # a plugin's metric: say which way its best was taken
        notes.append(f"--metric {metric}: raysim does not know whether more or less is better; its best is taken as "
                     f"the highest (--mode min for the lowest)")
    for note in notes:
        warn_stderr(note)
    methods = sorted(dict.fromkeys(g.method for g in groups))
    settings = list(dict.fromkeys(g.setting for g in sorted(groups, key=lambda g: g.setting)))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {out} ({exc.strerror})") from None
    report = Report(groups=groups, methods=methods, settings=settings, metric=metric, target=target, files={},
                    layout=layout, mode=mode, notes=notes)
    report.files["table.csv"] = _write_table_csv(report, out / "table.csv")
    report.files["summary.csv"] = _write_summary_csv(report, out / "summary.csv", alpha)
    report.files["comm.csv"] = _write_comm_csv(report, out / "comm.csv")
    report.files.update(write_extra_csvs(report, out))
    if plots and _plottable(report):
        report.files.update(write_plots(report, out))
        report.files.update(write_target_plot(report, out))
    report.files["report.md"] = _write_markdown(report, out / "report.md", alpha)
    return report


def group_warnings(groups: list[Group]) -> list[str]:
    """What would mislead in a group's mean ± std: runs that share a seed (they differ only in keys the report
    ignores, such as ``engine.*``, so their spread is not a spread over seeds), and runs of different lengths."""
    notes = []
    for g in groups:
        seeds = [hashable(r.seed) for r in g.runs]
        shared = sorted({json.loads(s) for s in seeds if seeds.count(s) > 1}, key=str)
        where = f"{g.method} on {g.setting}" if g.setting else g.method
        if shared:
            differ = sorted({k for r in g.runs for k in r.config
                             if ignored(k) and k not in ("seed", "name") and not k.startswith("log.")
                             and len({hashable(o.config.get(k)) for o in g.runs}) > 1})
            how = f" and differ only in {', '.join(differ)}" if differ else ""
            notes.append(f"{where}: {len(g.runs)} runs share seed {', '.join(map(str, shared))}{how}: its n and "
                         f"± are not over independent seeds (run other seeds, or report fewer runs)")
        lengths = sorted({r.config.get("rounds") for r in g.runs if r.config.get("rounds") is not None})
        if len(lengths) > 1:
            notes.append(f"{where}: its runs ran different numbers of rounds ({', '.join(map(str, lengths))}); "
                         f"rounds do not split a method, but its best and final values come from runs of "
                         f"different lengths")
    return notes

