"""The curriculum study's tables and cited figures, computed from its committed data (docs/curriculum-study/data).

    .venv/bin/python experiments/sweeps/curriculum-study-tables.py [DATA_DIR]

Prints every table of docs/curriculum-study.md, in the document's order and format, then the figures its text cites
(means by group, paired differences, p-values, Holm-adjusted p-values, ranges), all computed with ``raysim report``'s
own statistics (``raysim.report_stats``). tests/test_curriculum_study.py imports this file: the document's tables
must equal ``tables()`` cell for cell, and every difference and p-value its text cites must be one of ``cited()``.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import numpy as np

from raysim.report_stats import column_tests, compare, mean_std

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "curriculum-study" / "data"
EXPERIMENTS = ("niid1", "niid2")
U_METHODS = {  # seed-set directory -> the first cell of its row
    "partialkd": "PartialKD (`partialkd`: p = 1, α = 1)",
    "unideal": "UNIDEAL, the seed's settings (`unideal`)",
    "unideal-kept": "the seed's settings, CLKD divided by the kept samples (`unideal-kept`)",
    "unideal-best": "the search's best (`unideal-best`)",
    "unideal-best-flat": "the search's best without its curriculum (`unideal-best-flat`)",
}
F_METHODS = {
    "fedavg": "FedAvg (`fedavg`)",
    "fapd-nadpt": "FAPD-nadpt, k = 32 throughout (`fapd-nadpt`)",
    "fapd": "FAPD as shipped: k0 8, Δk 5, ε 0.02 (`fapd`)",
    "fapd-best": "FAPD, the search's best (`fapd-best`)",
    "fapd-big-teacher": "FAPD as shipped, larger teacher (`fapd-big-teacher`)",
    "fapd-best-big-teacher": "FAPD, the search's best, larger teacher (`fapd-best-big-teacher`)",
}
Table = list[list[str]]
SEARCH_GROUPS = (  # (search file, its score, the settings the text averages the score by)
    ("unideal-search.csv", "best_acc_mean", ("algorithm.schedule.shape", "algorithm.kd_norm", "train.local_epochs")),
    ("fapd-search.csv", "best_acc_global", ("algorithm.k0", "algorithm.kd_tau")),
)


# ------------------------------------------------------------------------------------------------ reading, format
def read(name: str, data: Path = DATA) -> list[dict]:
    """A data file's rows; none for a part of the study that has no data."""
    if not (data / name).is_file():
        return []
    with open(data / name) as fh:
        return list(csv.DictReader(fh))


def by_seed(rows: list[dict], experiment: str, method: str, key: str) -> dict[int, float]:
    return {int(r["seed"]): float(r[key]) for r in rows
            if r["experiment"] == experiment and r["method"] == method and r[key] != ""}


def pct(values: dict[int, float]) -> str:
    mean, std = mean_std(list(values.values()))
    return f"{100 * mean:.2f} ± {100 * std:.2f}"  # type: ignore[operator]


def signed(x: float, digits: int = 2) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def p_text(p: Optional[float]) -> str:
    """Two significant digits (0.47, 0.078, 0.0071); "—" for no test."""
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, Optional[float]]:
    """(mean of a − b over the seeds, the paired p of ``raysim report``); both ran the same seeds."""
    assert set(a) == set(b) and len(a) >= 2, (sorted(a), sorted(b))
    p, kind = compare(list(a.values()), list(b.values()), a, b)
    assert kind == "paired", (a, b)
    return float(np.mean([a[s] - b[s] for s in sorted(a)])), p


def holm_column(groups: dict[str, dict[int, float]]) -> tuple[str, dict[str, Optional[float]]]:
    """``raysim report``'s column test: (the best mean's method, every other method's Holm-adjusted p against it)."""
    objs = {m: SimpleNamespace(values=list(v.values()), by_seed=v, mean=float(np.mean(list(v.values()))),
                               p_vs_best=None, test="", p_adjusted=None, beaten=False) for m, v in groups.items()}
    best = max(objs, key=lambda m: objs[m].mean)
    column_tests(objs[best], [o for m, o in objs.items() if m != best], alpha=0.01)
    return best, {m: o.p_adjusted for m, o in objs.items() if m != best}


def start_text(value: str) -> str:
    return "1/B" if value in ("", "None") else value


# ------------------------------------------------------------------------------------------------ the tables
def unideal_search(data: Path = DATA) -> Table:
    rows = []
    for r in sorted(read("unideal-search.csv", data), key=lambda r: -float(r["best_acc_mean"])):
        span = "epochs" if r["algorithm.schedule.over"] == "local_epochs" else "rounds"
        rows.append([f"{float(r['best_acc_mean']):.4f}", r["rounds"].split("/")[0], r["algorithm.kd_norm"], span,
                     r["algorithm.schedule.shape"], start_text(r["algorithm.schedule.start"]),
                     str(float(r["algorithm.schedule.end"])), f"{float(r['algorithm.alpha']):.2f}",
                     r["algorithm.metric"], r["train.local_epochs"]])
    return rows


def unideal_columns(data: Path = DATA) -> dict[str, dict[str, dict[int, float]]]:
    seeds = read("seeds.csv", data)
    return {exp: {m: v for m in U_METHODS if len(v := by_seed(seeds, exp, m, "best_acc_mean")) >= 2}
            for exp in EXPERIMENTS}


def unideal_seeds(data: Path = DATA) -> Table:
    """| method | NIID-1 | Δ | p | Holm | NIID-2 | Δ | p | Holm |: Δ and p against PartialKD (paired); Holm: the
    report's column test (every method against the column's best mean)."""
    columns = unideal_columns(data)
    holms = {exp: holm_column(columns[exp]) for exp in EXPERIMENTS}
    rows = []
    for method, label in U_METHODS.items():
        cells = [label]
        for exp in EXPERIMENTS:
            values = columns[exp].get(method)
            if values is None:
                cells += ["", "", "", ""]
                continue
            best, adjusted = holms[exp]
            holm = "—" if method == best else p_text(adjusted[method])
            if method == "partialkd":
                cells += [pct(values), "", "", holm]
            else:
                d, p = paired(values, columns[exp]["partialkd"])
                cells += [pct(values), signed(100 * d), p_text(p), holm]
        if any(cells[1:]):
            rows.append(cells)
    return rows


def scale_cells(data: Path = DATA) -> dict[int, tuple[dict[int, float], dict[int, float]]]:
    scale = read("scale.csv", data)
    out = {}
    for n in sorted({int(r["samples_per_domain"]) for r in scale}):
        shape = {s: {int(r["seed"]): float(r["best_acc_mean"]) for r in scale
                     if int(r["samples_per_domain"]) == n and r["shape"] == s} for s in ("linear", "constant")}
        out[n] = (shape["linear"], shape["constant"])
    return out


def scale_table(data: Path = DATA) -> Table:
    """| samples per domain | curriculum (linear) | none (constant) | Δ | p | per seed |"""
    rows = []
    for n, (lin, con) in scale_cells(data).items():
        d, p = paired(lin, con)
        per_seed = ", ".join(signed(100 * (lin[s] - con[s]), 1) for s in sorted(lin))
        rows.append([f"{n:,}", pct(lin), pct(con), signed(100 * d), p_text(p), per_seed])
    return rows


def fapd_search(data: Path = DATA) -> Table:
    rows = []
    for r in sorted(read("fapd-search.csv", data), key=lambda r: -float(r["best_acc_global"])):
        rows.append([f"{float(r['best_acc_global']):.4f}", r["rounds"].split("/")[0],
                     f"{float(r['algorithm.epsilon']):.3f}", r["algorithm.delta_k"], r["algorithm.window"],
                     r["algorithm.k0"], f"{float(r['algorithm.lambda_kd']):.2f}",
                     f"{float(r['algorithm.lambda_cl']):.2f}", str(float(r["algorithm.kd_tau"]))])
    return rows


def fapd_columns(data: Path = DATA) -> dict[str, dict[int, float]]:
    seeds = read("seeds.csv", data)
    return {m: v for m in F_METHODS if len(v := by_seed(seeds, "fapd", m, "best_acc_global")) >= 2}


def fapd_seeds(data: Path = DATA) -> Table:
    """| method | best acc_global | Δ vs nadpt | p | Δ vs FedAvg | p | Holm | teacher accuracy | final k |"""
    seeds = read("seeds.csv", data)
    column = fapd_columns(data)
    if not column:
        return []
    best, adjusted = holm_column(column)
    rows = []
    for method, values in column.items():
        cells = [F_METHODS[method], pct(values)]
        for ref in ("fapd-nadpt", "fedavg"):
            if method == ref:
                cells += ["", ""]
            else:
                d, p = paired(values, column[ref])
                cells += [signed(100 * d), p_text(p)]
        cells.append("—" if method == best else p_text(adjusted[method]))
        teacher = list(by_seed(seeds, "fapd", method, "teacher_acc").values())
        ks = sorted({int(x) for x in by_seed(seeds, "fapd", method, "final_k").values()})
        cells.append(f"{100 * min(teacher):.1f}–{100 * max(teacher):.1f}" if teacher else "—")
        cells.append("—" if not ks else (str(ks[0]) if len(ks) == 1 else f"{ks[0]}–{ks[-1]}"))
        rows.append(cells)
    return rows


def tables(data: Path = DATA) -> list[Table]:
    """Every table of the document, in its order."""
    return [t for t in (unideal_search(data), unideal_seeds(data), scale_table(data), fapd_search(data),
                        fapd_seeds(data)) if t]


# ------------------------------------------------------------------------------------------------ cited figures
def group_means(rows: list[dict], score: str, key: str) -> dict[str, tuple[float, int]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(float(r[score]))
    return {k: (float(np.mean(v)), len(v)) for k, v in groups.items()}


def paired_differences(data: Path = DATA) -> dict[str, tuple[float, Optional[float]]]:
    """Every paired comparison the text may cite, by name: (mean difference, p)."""
    out: dict[str, tuple[float, Optional[float]]] = {}
    for exp, column in unideal_columns(data).items():
        for a in column:
            for b in column:
                if a != b:
                    out[f"{exp}: {a} − {b}"] = paired(column[a], column[b])
    for n, (lin, con) in scale_cells(data).items():
        out[f"{n} per domain: linear − constant"] = paired(lin, con)
    column = fapd_columns(data)
    for a in column:
        for b in column:
            if a != b:
                out[f"fapd: {a} − {b}"] = paired(column[a], column[b])
    return out


def cited(data: Path = DATA) -> dict[str, str]:
    """Every figure the text may cite, as printed (value -> what it is): differences in points (two decimals and
    one), p-values (raw and Holm), means by group in the searches (three decimals), std-free means (two)."""
    out: dict[str, str] = {}
    for name, (d, p) in paired_differences(data).items():
        for digits in (2, 1):
            out.setdefault(signed(100 * d, digits), name)
            out.setdefault(f"{abs(100 * d):.{digits}f}", name)
        out.setdefault(p_text(p), f"p of {name}")
    for exp, column in unideal_columns(data).items():
        for m, v in holm_column(column)[1].items():
            out.setdefault(p_text(v), f"Holm p of {exp} {m}")
        for m, values in column.items():
            out.setdefault(f"{100 * float(np.mean(list(values.values()))):.2f}", f"{exp} {m} mean")
    column = fapd_columns(data)
    if column:
        for m, v in holm_column(column)[1].items():
            out.setdefault(p_text(v), f"Holm p of fapd {m}")
        for m, values in column.items():
            out.setdefault(f"{100 * float(np.mean(list(values.values()))):.2f}", f"fapd {m} mean")
    for name, score, keys in SEARCH_GROUPS:
        rows = read(name, data)
        for key in keys:
            for group, (mean, n) in group_means(rows, score, key).items():
                out.setdefault(f"{mean:.3f}", f"{name} mean of {key}={group} (n={n})")
    return out


# ------------------------------------------------------------------------------------------------ printing
def markdown(table: Table) -> str:
    return "\n".join("| " + " | ".join(row) + " |" for row in table)


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    for table in tables(data):
        print(markdown(table), end="\n\n")
    print("## paired differences (points) and p")
    for name, (d, p) in paired_differences(data).items():
        print(f"{name}: {signed(100 * d)} (p {p_text(p)})")
    print("\n## Holm (the report's column test)")
    for exp, column in unideal_columns(data).items():
        best, adjusted = holm_column(column)
        print(f"{exp}: best {best}; " + ", ".join(f"{m} {p_text(v)}" for m, v in adjusted.items()))
    if fapd_columns(data):
        best, adjusted = holm_column(fapd_columns(data))
        print(f"fapd: best {best}; " + ", ".join(f"{m} {p_text(v)}" for m, v in adjusted.items()))
    print("\n## search means by group")
    for name, score, keys in SEARCH_GROUPS:
        rows = read(name, data)
        for key in keys:
            means = group_means(rows, score, key)
            print(f"{name} by {key}: " + ", ".join(f"{g} {m:.3f} (n={n})" for g, (m, n) in means.items()))


if __name__ == "__main__":
    main()
