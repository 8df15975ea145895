"""The curriculum study's tables and cited figures, printed from its committed data (docs/curriculum-study/data).

    .venv/bin/python experiments/sweeps/curriculum-study-tables.py [DATA_DIR]

Prints, in docs/curriculum-study.md's formats, the two search tables, the two five-seed tables, the data-size grid
and the figures the text cites (means by group, Holm-adjusted p-values as `raysim report` computes them, ranges),
all from raysim's own statistics (``raysim.report_stats``); a part with no data is left out. The document's section
"The committed data" comes from this output, and tests/test_curriculum_study.py recomputes every number of it from
the same data.
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
U_METHODS = ["partialkd", "unideal", "unideal-kept", "unideal-best", "unideal-best-flat"]
F_METHODS = ["fedavg", "fapd-nadpt", "fapd", "fapd-best", "fapd-big-teacher", "fapd-best-big-teacher"]


def read(name: str, data: Path = DATA) -> list[dict]:
    """A data file's rows; none for a part of the study that has no data."""
    if not (data / name).is_file():
        return []
    with open(data / name) as fh:
        return list(csv.DictReader(fh))


def by_seed(rows: list[dict], experiment: str, method: str, key: str) -> dict[int, float]:
    return {int(r["seed"]): float(r[key]) for r in rows
            if r["experiment"] == experiment and r["method"] == method and r[key] != ""}


def pct(pair: tuple[Optional[float], Optional[float]]) -> str:
    return f"{100 * pair[0]:.2f} ± {100 * pair[1]:.2f}"


def signed(x: float, digits: int = 2) -> str:
    s = f"{x:+.{digits}f}"
    return s.replace("-", "−")


def p_text(p: Optional[float]) -> str:
    """Two significant digits, as the document writes them (0.47, 0.078, 0.007)."""
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, Optional[float]]:
    """(mean of a − b over the shared seeds, the paired p of ``raysim report``)."""
    seeds = sorted(set(a) & set(b))
    p, kind = compare(list(a.values()), list(b.values()), a, b)
    assert kind == "paired", (a, b)
    return float(np.mean([a[s] - b[s] for s in seeds])), p


def holm_column(groups: dict[str, dict[int, float]]) -> dict[str, tuple[Optional[float], Optional[float]]]:
    """``raysim report``'s column test: every method against the column's best mean, Holm over the column."""
    objs = {m: SimpleNamespace(values=list(v.values()), by_seed=v, mean=float(np.mean(list(v.values()))),
                               p_vs_best=None, test="", p_adjusted=None, beaten=False) for m, v in groups.items()}
    best = max(objs, key=lambda m: objs[m].mean)
    column_tests(objs[best], [o for m, o in objs.items() if m != best], alpha=0.01)
    return {m: (o.p_vs_best, o.p_adjusted) for m, o in objs.items()} | {"_best": (None, None), best: (None, None)}


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    seeds = read("seeds.csv", data)
    # ---------------------------------------------------------------- UNIDEAL search
    print("## UNIDEAL search\n")
    print("| best acc_mean | rounds run | kd_norm | span | shape | start | end | α | score | local epochs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    search = sorted(read("unideal-search.csv", data), key=lambda r: -float(r["best_acc_mean"]))
    for r in search:
        start = "1/B" if r["algorithm.schedule.start"] in ("", "None") else r["algorithm.schedule.start"]
        span = "epochs" if r["algorithm.schedule.over"] == "local_epochs" else "rounds"
        print(f"| {float(r['best_acc_mean']):.4f} | {r['rounds'].split('/')[0]} | {r['algorithm.kd_norm']} | {span} | "
              f"{r['algorithm.schedule.shape']} | {start} | {float(r['algorithm.schedule.end'])} | "
              f"{float(r['algorithm.alpha']):.2f} | {r['algorithm.metric']} | {r['train.local_epochs']} |")
    print()
    for key in ("algorithm.schedule.shape", "algorithm.kd_norm", "train.local_epochs"):
        groups: dict[str, list[float]] = {}
        for r in search:
            groups.setdefault(r[key], []).append(float(r["best_acc_mean"]))
        print(f"mean best by {key}: " + ", ".join(f"{k} {np.mean(v):.3f} (n={len(v)})" for k, v in groups.items()))
    # ---------------------------------------------------------------- UNIDEAL five seeds
    print("\n## UNIDEAL five seeds\n")
    for exp in ("niid1", "niid2"):
        base = by_seed(seeds, exp, "partialkd", "best_acc_mean")
        column = {}
        for m in U_METHODS:
            v = by_seed(seeds, exp, m, "best_acc_mean")
            if len(v) < 2:
                if v:
                    print(f"{exp} {m}: only seed(s) {sorted(v)} finished")
                continue
            column[m] = v
            line = f"{exp} {m}: {pct(mean_std(list(v.values())))}"
            if m != "partialkd":
                d, p = paired(v, base)
                line += f" | Δ {signed(100 * d)} | p {p_text(p)}"
            print(line)
        holm = holm_column(column)
        print(f"{exp} report column (vs the best mean), raw p / Holm: " +
              ", ".join(f"{m} {p_text(h[0])} / {p_text(h[1])}" for m, h in holm.items() if m in column))
    print("\nas one table (| method | NIID-1 | Δ | p | Holm | NIID-2 | Δ | p | Holm |):\n")
    holms = {exp: holm_column({m: v for m in U_METHODS if len(v := by_seed(seeds, exp, m, "best_acc_mean")) >= 2})
             for exp in ("niid1", "niid2")}
    for m in U_METHODS:
        cells = []
        for exp in ("niid1", "niid2"):
            v = by_seed(seeds, exp, m, "best_acc_mean")
            if len(v) < 2:
                cells += ["", "", "", ""]
            elif m == "partialkd":
                cells += [pct(mean_std(list(v.values()))), "", "", p_text(holms[exp][m][1])]
            else:
                d, p = paired(v, by_seed(seeds, exp, "partialkd", "best_acc_mean"))
                cells += [pct(mean_std(list(v.values()))), signed(100 * d), p_text(p), p_text(holms[exp][m][1])]
        if any(cells):
            print(f"| {m} | " + " | ".join(cells) + " |")
    flat = by_seed(seeds, "niid2", "unideal-best-flat", "best_acc_mean")
    if flat:
        d, p = paired(flat, by_seed(seeds, "niid2", "unideal-best", "best_acc_mean"))
        print(f"niid2 best-flat − best: {signed(100 * d)} (p {p_text(p)})")
    # ---------------------------------------------------------------- scale grid
    scale = read("scale.csv", data)
    if scale:
        print("\n## Data per domain\n")
    for n in sorted({int(r["samples_per_domain"]) for r in scale}):
        lin = {int(r["seed"]): float(r["best_acc_mean"]) for r in scale
               if int(r["samples_per_domain"]) == n and r["shape"] == "linear"}
        con = {int(r["seed"]): float(r["best_acc_mean"]) for r in scale
               if int(r["samples_per_domain"]) == n and r["shape"] == "constant"}
        d, p = paired(lin, con)
        per_seed = ", ".join(signed(100 * (lin[s] - con[s]), 1) for s in sorted(lin))
        print(f"| {n:,} | {pct(mean_std(list(lin.values())))} | {pct(mean_std(list(con.values())))} | "
              f"{signed(100 * d)} | {p_text(p)} |   per seed: {per_seed}")
    # ---------------------------------------------------------------- FAPD search
    if not read("fapd-search.csv", data) and not any(r["experiment"] == "fapd" for r in seeds):
        print("\n(no FAPD data)")
        return
    print("\n## FAPD search\n")
    print("| best acc_global | rounds run | ε | Δk | window | k0 | λ_kd | λ_cl | kd_tau |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(read("fapd-search.csv", data), key=lambda r: -float(r["best_acc_global"])):
        print(f"| {float(r['best_acc_global']):.4f} | {r['rounds'].split('/')[0]} | "
              f"{float(r['algorithm.epsilon']):.3f} | "
              f"{r['algorithm.delta_k']} | {r['algorithm.window']} | {r['algorithm.k0']} | "
              f"{float(r['algorithm.lambda_kd']):.2f} | {float(r['algorithm.lambda_cl']):.2f} | "
              f"{float(r['algorithm.kd_tau'])} |")
    # ---------------------------------------------------------------- FAPD five seeds
    print("\n## FAPD five seeds\n")
    nadpt = by_seed(seeds, "fapd", "fapd-nadpt", "best_acc_global")
    fedavg = by_seed(seeds, "fapd", "fedavg", "best_acc_global")
    column = {}
    for m in F_METHODS:
        v = by_seed(seeds, "fapd", m, "best_acc_global")
        column[m] = v
        cells = [pct(mean_std(list(v.values())))]
        for ref, name in ((nadpt, "fapd-nadpt"), (fedavg, "fedavg")):
            if m == name:
                cells += ["", ""]
            else:
                d, p = paired(v, ref)
                cells += [signed(100 * d), p_text(p)]
        teacher = list(by_seed(seeds, "fapd", m, "teacher_acc").values())
        ks = [int(float(x)) for x in by_seed(seeds, "fapd", m, "final_k").values()]
        cells.append(f"{100 * min(teacher):.1f}–{100 * max(teacher):.1f}" if teacher else "—")
        cells.append("—" if not ks else (str(ks[0]) if min(ks) == max(ks) else f"{min(ks)}–{max(ks)}"))
        print(f"| {m} | " + " | ".join(cells) + " |")
    holm = holm_column(column)
    print("report column (vs the best mean), raw p / Holm: " +
          ", ".join(f"{m} {p_text(h[0])} / {p_text(h[1])}" for m, h in holm.items() if m in column))


if __name__ == "__main__":
    main()
