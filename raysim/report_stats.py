"""Statistics for ``raysim report`` that the seeds' tables need beyond a mean ± std of best accuracies.

* Significance against a column's best: a paired t-test (``scipy.stats.ttest_rel``) when both methods ran the same
  seeds, since a seed fixes the partition and the initial weights and pairing removes that shared variance; Welch's
  t-test (``ttest_ind(equal_var=False)``) otherwise. With several methods in a column, the p-values of the column's
  comparisons are Holm-adjusted (family-wise error rate at ``alpha``), so adding methods does not add false stars.
* Final-round values beside best-round ones: the best round is chosen on test data (optimistic); the final round is not.
* Client spread from ``client_metrics.jsonl``: mean, std over clients and the mean of the worst 10% of clients, which a
  mean over clients hides.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from raysim.runlog import CLIENT_METRICS, read_metrics, warn_stderr

WORST_SHARE = 0.10
MIN_SEEDS = 3  # a significance mark needs at least this many seeds on each side (two give a test 1 degree of freedom)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the i-th (0-based) of m is
    multiplied by (m - i), made non-decreasing, capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def paired_seeds(a: dict[Any, float], b: dict[Any, float]) -> bool:
    """Two groups can be paired when they ran exactly the same seeds (at least two)."""
    return len(a) >= 2 and set(a) == set(b)


def compare(best: Sequence[float], other: Sequence[float], best_by_seed: Optional[dict] = None,
            other_by_seed: Optional[dict] = None) -> tuple[Optional[float], str]:
    """(two-sided p, "paired" | "welch") of ``best`` against ``other``: paired on seeds when both ``by_seed`` maps
    (seed -> value) hold the same seeds, else Welch's test on the values; (None, "") with fewer than two values on a
    side, (None, kind) for a degenerate test (no variance)."""
    import warnings

    from scipy import stats

    with warnings.catch_warnings():  # identical values: scipy warns of precision loss; a nan p is handled below
        warnings.simplefilter("ignore", RuntimeWarning)
        if best_by_seed and other_by_seed and paired_seeds(best_by_seed, other_by_seed):
            seeds = sorted(best_by_seed, key=lambda s: (str(type(s)), s))
            p = float(stats.ttest_rel([best_by_seed[s] for s in seeds], [other_by_seed[s] for s in seeds]).pvalue)
            kind = "paired"
        elif len(best) >= 2 and len(other) >= 2:
            p = float(stats.ttest_ind(list(best), list(other), equal_var=False).pvalue)
            kind = "welch"
        else:
            return None, ""
    return (None, kind) if math.isnan(p) else (p, kind)


def column_tests(best: Any, others: list[Any], alpha: float, mode: str = "max") -> None:
    """Set ``p_vs_best``, ``test``, ``p_adjusted`` and ``beaten`` on each of ``others`` (report.Group objects)
    against ``best``; Holm's correction runs over the comparisons that produced a p-value. ``mode="min"``: lower
    values are better (a loss). No ``beaten`` mark with fewer than ``MIN_SEEDS`` values on either side."""
    tested = []
    for g in others:
        g.p_vs_best, g.test = compare(best.values, g.values, best.by_seed, g.by_seed)
        if g.p_vs_best is not None:
            tested.append(g)
    for g, p_adj in zip(tested, holm([g.p_vs_best for g in tested])):
        g.p_adjusted = p_adj
        g.beaten = (p_adj < alpha and (best.mean > g.mean if mode == "max" else best.mean < g.mean)
                    and min(len(best.values), len(g.values)) >= MIN_SEEDS)


def final_value(rows: list[dict], metric: str) -> Optional[float]:
    """The metric at the last round that has it (the last evaluation): the highest round, whatever the rows' order."""
    values = [(r["round"], r[metric]) for r in rows if r.get(metric) is not None]
    return max(values, key=lambda rv: rv[0])[1] if values else None


def mean_std(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


# ---------------------------------------------------------------------------------------------- clients


def client_spread(run_dir: Path) -> Optional[dict[str, float]]:
    """Per-client accuracies of the run's last evaluated round: mean, std over clients (ddof=0: the clients are the
    whole population, not a sample), worst 10% (mean of the ceil(10%) lowest, at least one client); None when the
    run has no ``client_metrics.jsonl``."""
    rows = read_metrics(run_dir / CLIENT_METRICS, warn=warn_stderr)
    if not rows:
        return None
    last = max(rows, key=lambda r: r["round"] if isinstance(r["round"], int) else -1)  # whatever the lines' order
    acc = np.sort(np.asarray(last["acc"], dtype=np.float64))
    worst = max(1, math.ceil(WORST_SHARE * len(acc)))
    return {"round": last["round"], "clients": len(acc), "mean": float(acc.mean()), "std": float(acc.std()),
            "worst10": float(acc[:worst].mean()), "min": float(acc[0])}


def group_spread(run_dirs: Sequence[Path]) -> Optional[dict[str, Any]]:
    """Each run's client spread, averaged over the runs (seeds) that have one."""
    spreads = [s for s in (client_spread(p) for p in run_dirs) if s is not None]
    if not spreads:
        return None
    out: dict[str, Any] = {"runs": len(spreads), "clients": spreads[0]["clients"]}
    for key in ("mean", "std", "worst10", "min"):
        out[key] = mean_std([s[key] for s in spreads])
    return out


# ---------------------------------------------------------------------------------------------- report sections


def format_value(value: float, percent: bool) -> str:
    """An accuracy in % with two decimals; any other metric with four significant digits."""
    return f"{100 * value:.2f}" if percent else f"{value:.4g}"


def _pct(pair: tuple[Optional[float], Optional[float]], n: int, percent: bool = True) -> str:
    mean, std = pair
    if mean is None:
        return "-"
    m, sd = format_value(mean, percent), format_value(std or 0.0, percent)
    return f"{m} ± {sd}" if n > 1 else f"{m} (n=1)"


def final_table_rows(report: Any) -> list[list[str]]:
    """The main table's shape (methods x settings) with each run's last evaluated value instead of its best."""
    def cell(method: str, setting: str) -> str:
        g = next((g for g in report.groups if g.method == method and g.setting == setting), None)
        return "-" if g is None else _pct((g.final_mean, g.final_std), len(g.final_values), report.percent)

    return [[m] + [cell(m, s) for s in report.settings] for m in report.methods]


def spread_rows(report: Any) -> list[list[str]]:
    """One row per group that has ``client_metrics.jsonl``: clients, mean, std over clients, worst 10%, minimum."""
    order = {s: i for i, s in enumerate(report.settings)}
    rows = []
    for g in sorted(report.groups, key=lambda g: (order[g.setting], g.method)):
        s = group_spread([r.path for r in g.runs])
        if s is not None:
            rows.append([g.method, g.setting, str(s["clients"]), f"{s['runs']}/{len(g.runs)}",
                         *(_pct(s[k], s["runs"]) for k in ("mean", "std", "worst10", "min"))])
    return rows


def extra_sections(report: Any) -> list[str]:
    """report.md's sections after the main table: the final-round table and the client spread."""
    from raysim.tables import markdown_table

    header = ["method"] + report.settings
    lines = [f"## Final-round `{report.metric}`{report.unit}, mean ± std over seeds", "",
             markdown_table(header, final_table_rows(report)), "",
             "The value at each run's last evaluated round: unlike the best round, not chosen on test data.", ""]
    spread = spread_rows(report)
    if spread:
        lines += ["## Client spread (personalised accuracy, last evaluated round, %)", "",
                  markdown_table(["method", "setting", "clients", "runs", "mean", "std over clients", "worst 10%",
                                  "worst client"], spread), "",
                  "From each run's `client_metrics.jsonl`; each figure is computed per run, then mean ± std over "
                  "runs. Worst 10%: the mean of the lowest-scoring ceil(10%) of clients (at least one).", ""]
    return lines


def write_extra_csvs(report: Any, out: Path) -> dict[str, Path]:
    """final_table.csv (shaped like table.csv) and, when runs have ``client_metrics.jsonl``, clients.csv."""
    import csv

    files = {}
    path = out / "final_table.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method"] + report.settings)
        w.writerows(final_table_rows(report))
    files[path.name] = path
    rows = []
    for g in report.groups:
        s = group_spread([r.path for r in g.runs])
        if s is not None:
            rows.append([g.method, g.setting, s["clients"], s["runs"],
                         *(f"{x:.6g}" for k in ("mean", "std", "worst10", "min") for x in s[k])])
    if rows:
        path = out / "clients.csv"
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["method", "setting", "clients", "runs", "mean", "mean_sd", "std", "std_sd", "worst10",
                        "worst10_sd", "min", "min_sd"])
            w.writerows(sorted(rows, key=lambda r: (r[1], r[0])))
        files[path.name] = path
    return files
