"""Each group's best and final metric over its seeds, the column tests, the traffic and time to a target, and the
CSV tables (table.csv, summary.csv, comm.csv)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from raysim.errors import UserError
from raysim.report.model import ALPHA, MB, Group, Report, Run, hashable
from raysim.report.runs import _finite
from raysim.report_stats import format_value
from raysim.runlog import human_bytes, warn_stderr
from raysim.tables import csv_number as _num


def score(groups: list[Group], metric: str, alpha: float = ALPHA, mode: str = "max") -> None:
    """Mean ± std of each group's best (the maximum, or the minimum for ``mode="min"``) and final metric; each
    column's best tested against the others (paired on shared seeds, else Welch; Holm-corrected: see
    ``raysim.report_stats``)."""
    from raysim.report_stats import column_tests, final_value, mean_std

    for g in groups:
        bests = [(run.seed, run.best(metric, mode)) for run in g.runs]
        g.values = [v for _, v in bests if v is not None]
        seeds = [s for s, v in bests if v is not None]
        g.by_seed = dict(zip(seeds, g.values)) if len(set(map(hashable, seeds))) == len(seeds) else {}
        if g.values:
            g.mean = float(np.mean(g.values))
            g.std = float(np.std(g.values, ddof=1)) if len(g.values) > 1 else 0.0
        g.final_values = [v for v in (final_value(run.rows, metric) for run in g.runs) if v is not None]
        g.final_mean, g.final_std = mean_std(g.final_values)
    for setting in dict.fromkeys(g.setting for g in groups):
        column = [g for g in groups if g.setting == setting and g.mean is not None]
        if not column:
            continue
        best = (max if mode == "max" else min)(column, key=lambda g: g.mean)
        best.is_best = True
        column_tests(best, [g for g in column if g is not best], alpha, mode)



def numeric_metrics(runs: Sequence[Run]) -> list[str]:
    """The numeric keys the runs' ``metrics.jsonl`` rows hold (what ``--metric`` accepts)."""
    keys = {k for run in runs for r in run.rows for k, v in r.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return sorted(keys)


# what an algorithm lacks when it logs no acc_global (the usual surprise): it keeps no global model
_NO_METRIC_WHY = {"acc_global": "it keeps no global model to evaluate"}


def check_metric(runs: Sequence[Run], metric: str) -> None:
    """``--metric`` must be a numeric metric some run logged; else one line naming what the runs have (and why)."""
    if any(isinstance(r.get(metric), (int, float)) for run in runs for r in run.rows):
        return
    algorithms = sorted({str(run.config.get("algorithm.name")) for run in runs})
    why = _NO_METRIC_WHY.get(metric)
    reason = f" ({', '.join(algorithms)}: {why})" if why else ""
    raise UserError(f"--metric {metric}: none of the {len(runs)} runs logged it{reason}; their metrics: "
                    f"{', '.join(numeric_metrics(runs))}")


def _warn_missing_metric(groups: list[Group], metric: str) -> None:
    """Methods whose runs never logged the metric get '-' cells: say which, and why when it is known."""
    missing = sorted({g.method for g in groups if g.mean is None})
    if missing:
        why = _NO_METRIC_WHY.get(metric, "their runs never logged it")
        warn_stderr(f"--metric {metric}: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no "
                    f"{metric} ({why}); {'its' if len(missing) == 1 else 'their'} cells are '-' and "
                    f"{'it is' if len(missing) == 1 else 'they are'} left out of the plots")


def _cell(g: Optional[Group], markdown: bool = True, percent: bool = True) -> str:
    if g is None or g.mean is None:
        return "-"
    mean, std = format_value(g.mean, percent), format_value(g.std or 0.0, percent)
    text = f"{mean} ± {std}" if len(g.values) > 1 else f"{mean} (n=1)"
    if markdown and g.is_best:
        text = f"**{text}**"
    if g.beaten:
        text += "*"
    return text


def _find(report: Report, method: str, setting: str) -> Optional[Group]:
    return next((g for g in report.groups if g.method == method and g.setting == setting), None)


def main_table_rows(report: Report, markdown: bool = True) -> list[list[str]]:
    return [[m] + [_cell(_find(report, m, s), markdown, report.percent) for s in report.settings]
            for m in report.methods]


def _write_table_csv(report: Report, path: Path) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method"] + report.settings)
        w.writerows(main_table_rows(report, markdown=False))
    return path


def _write_summary_csv(report: Report, path: Path, alpha: float) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "setting", "metric", "n", "mean", "std", "best_in_setting", "p_vs_best",
                    f"beaten_at_p<{alpha:g}", "test", "p_holm", "final_mean", "final_std", "values", "run_dirs"])
        for g in sorted(report.groups, key=lambda g: (g.setting, g.method)):
            w.writerow([g.method, g.setting, report.metric, len(g.values), _num(g.mean), _num(g.std), g.is_best,
                        _num(g.p_vs_best), g.beaten, g.test, _num(g.p_adjusted), _num(g.final_mean),
                        _num(g.final_std), " ".join(f"{v:.6g}" for v in g.values),
                        " ".join(str(r.path) for r in g.runs)])
    return path


def _over(reduce: Callable, rows: list[dict], key: str) -> float:
    """``reduce`` of ``key`` over the rows that hold it (NaN when none does: a report flagged them dropped)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(reduce(values)) if values else math.nan


def comm_stats(g: Group, metric: str, target: float, mode: str = "max") -> dict[str, Any]:
    """Per-round traffic and time, and what it took to reach ``target`` (over the seeds that reached it)."""
    rows = [r for run in g.runs for r in run.rows]
    reached = [t for t in (run.to_target(metric, target, mode) for run in g.runs) if t is not None]

    def ms(values: list[float]) -> tuple[Optional[float], Optional[float]]:
        if not values:
            return None, None
        return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0

    return {
        "method": g.method, "setting": g.setting, "runs": len(g.runs),
        "bytes_up_per_round": _over(np.mean, rows, "bytes_up"),
        "bytes_down_per_round": _over(np.mean, rows, "bytes_down"),
        "wall_s_per_round": _over(np.median, rows, "wall_s"),  # the first round also starts workers
        "reached": len(reached),
        "rounds_to_target": ms([t["round"] for t in reached]),
        "mb_to_target": ms([t["mb"] for t in reached]),
        "wall_s_to_target": ms([t["wall_s"] for t in reached]),
        "sim_h_to_target": ms([t["sim_h"] for t in reached if _finite(t["sim_h"])]),  # system.enabled runs
    }


def has_sim_time(report: Report) -> bool:
    """Whether some run kept a simulated clock (``system.enabled``: ``sim_time_s`` in its metrics)."""
    return any("sim_time_s" in r for g in report.groups for run in g.runs for r in run.rows)


def _write_comm_csv(report: Report, path: Path) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "setting", "runs", "bytes_up_per_round", "bytes_down_per_round",
                    "wall_s_per_round_median",
                    "target", "reached", "rounds_to_target_mean", "rounds_to_target_std", "mb_to_target_mean",
                    "mb_to_target_std", "wall_s_to_target_mean", "wall_s_to_target_std"]
                   + (["sim_h_to_target_mean", "sim_h_to_target_std"] if has_sim_time(report) else []))
        keys = ("rounds_to_target", "mb_to_target", "wall_s_to_target") + \
            (("sim_h_to_target",) if has_sim_time(report) else ())
        for g in _ordered(report):
            c = comm_stats(g, report.metric, report.target, report.mode)
            w.writerow([c["method"], c["setting"], c["runs"], f"{c['bytes_up_per_round']:.0f}",
                        f"{c['bytes_down_per_round']:.0f}", f"{c['wall_s_per_round']:.4g}", report.target,
                        c["reached"], *(_num(x) for key in keys for x in c[key])])
    return path


def _ordered(report: Report) -> list[Group]:
    order = {s: i for i, s in enumerate(report.settings)}
    return sorted(report.groups, key=lambda g: (order[g.setting], g.method))


def target_sign(report: Report) -> str:
    return "≥" if report.mode == "max" else "≤"


def _pm_bytes(pair: tuple[Optional[float], Optional[float]]) -> str:
    mean, std = pair
    return "-" if mean is None else f"{human_bytes(mean * MB)} ± {human_bytes(std * MB)}"

