"""docs/curriculum-study.md against its committed data (docs/curriculum-study/data).

Every number of the document's section "The committed data" is recomputed here from the CSV files with
``raysim report``'s own statistics (``raysim.report_stats``: mean ± std, the paired t-test, the column test with
Holm's correction) and must equal what the document prints, to the digits it prints. The other sections hold the
first run's numbers, whose run directories were not kept; the document says so, and a test checks that it does.
"""

from __future__ import annotations

import csv
import re
from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest

from conftest import ROOT
from raysim.report_stats import column_tests, compare, mean_std

DOC_PATH = ROOT / "docs" / "curriculum-study.md"
DATA = ROOT / "docs" / "curriculum-study" / "data"
SECTION = "## The committed data: the UNIDEAL rerun at 52ebae7"
EXPERIMENTS = ("niid1", "niid2")


def read(name: str) -> list[dict]:
    with open(DATA / name) as fh:
        return list(csv.DictReader(fh))


def doc() -> str:
    return DOC_PATH.read_text().replace("−", "-")


def committed_section(text: str) -> str:
    i = text.index(SECTION)
    return text[i:text.index("\n## ", i + 1)]


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text``: its data rows (header and rule left out) as stripped cells."""
    out: list[list[list[str]]] = []
    current: Optional[list[list[str]]] = None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = []
                out.append(current)
                continue  # the header
            if not set(line) <= set("|- "):
                current.append(cells)
        else:
            current = None
    return out


def printed(text: str, value: float, scale: float = 1.0) -> None:
    """``value`` × ``scale`` rounds to the number ``text`` prints, at the decimals it prints."""
    digits = len(text.split(".")[1]) if "." in text else 0
    assert round(value * scale, digits) == pytest.approx(float(text), abs=1e-9), (text, value * scale)


def by_seed(rows: list[dict], experiment: str, method: str) -> dict[int, float]:
    return {int(r["seed"]): float(r["best_acc_mean"]) for r in rows
            if r["experiment"] == experiment and r["method"] == method and r["best_acc_mean"] != ""}


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, Optional[float]]:
    """Mean paired difference a − b and ``raysim report``'s paired p (the runs share their seeds)."""
    assert set(a) == set(b) and len(a) >= 2
    p, kind = compare(list(a.values()), list(b.values()), a, b)
    assert kind == "paired"
    return float(np.mean([a[s] - b[s] for s in a])), p


def holm(groups: dict[str, dict[int, float]]) -> tuple[str, dict[str, Optional[float]]]:
    """``raysim report``'s column test: (the best method, each other method's Holm-adjusted p against it)."""
    objs = {m: SimpleNamespace(values=list(v.values()), by_seed=v, mean=float(np.mean(list(v.values()))),
                               p_vs_best=None, test="", p_adjusted=None, beaten=False) for m, v in groups.items()}
    best = max(objs, key=lambda m: objs[m].mean)
    column_tests(objs[best], [o for m, o in objs.items() if m != best], alpha=0.01)
    return best, {m: o.p_adjusted for m, o in objs.items() if m != best}


def check_section(text: str) -> None:
    """Every number of the committed-data section against the data (raises AssertionError on a disagreement)."""
    section = committed_section(text)
    search_table, seed_table = tables(section)
    # the search: one row per committed trial, sorted by score, each with the trial's settings
    trials = sorted(read("unideal-search.csv"), key=lambda t: -float(t["best_acc_mean"]))
    assert len(search_table) == len(trials)
    for row, t in zip(search_table, trials):
        printed(row[0], float(t["best_acc_mean"]))
        assert int(row[1]) == int(t["rounds"].split("/")[0])
        start = "1/B" if t["algorithm.schedule.start"] in ("", "None") else t["algorithm.schedule.start"]
        span = "epochs" if t["algorithm.schedule.over"] == "local_epochs" else "rounds"
        assert row[2:6] == [t["algorithm.kd_norm"], span, t["algorithm.schedule.shape"], start]
        printed(row[6], float(t["algorithm.schedule.end"]))
        printed(row[7], float(t["algorithm.alpha"]))
        assert row[8:] == [t["algorithm.metric"], t["train.local_epochs"]]
    stopped = sum(t["status"] == "stopped" for t in trials)
    assert f"ASHA stopped {stopped} at round 5 or 10" in section
    best = trials[0]
    assert f"({float(best['best_acc_mean']):.4f}," in section and f"α = {float(best['algorithm.alpha']):.2f}" in section
    # the five seeds: mean ± std, Δ and p against PartialKD, Holm-adjusted p of the report's column test
    seeds = read("seeds.csv")
    columns = {exp: {m: v for m in {r["method"] for r in seeds} if len(v := by_seed(seeds, exp, m)) >= 2}
               for exp in EXPERIMENTS}
    methods = [re.search(r"`([a-z0-9-]+)", row[0]).group(1) for row in seed_table]  # type: ignore[union-attr]
    assert set(methods) == set(columns["niid1"]) | set(columns["niid2"])
    for row, method in zip(seed_table, methods):
        for exp, cells in zip(EXPERIMENTS, (row[1:5], row[5:9])):
            values = columns[exp][method]
            assert sorted(values) == [1, 2, 3, 4, 5]
            mean, std = mean_std(list(values.values()))
            m, s = cells[0].split("±")
            printed(m.strip(), mean, 100)
            printed(s.strip(), std, 100)
            best_method, adjusted = holm(columns[exp])
            if method == "partialkd":
                assert cells[1:3] == ["", ""]
            else:
                d, p = paired(values, columns[exp]["partialkd"])
                printed(cells[1], d, 100)
                printed(cells[2], p)  # type: ignore[arg-type]
            if method == best_method:
                assert cells[3] == "—"
            else:
                printed(cells[3], adjusted[method])  # type: ignore[arg-type]


def test_the_committed_section_matches_its_data():
    check_section(doc())


@pytest.mark.parametrize("old,new", [("80.63 ± 4.38", "80.64 ± 4.38"), ("| 0.029 | 0.058 |", "| 0.029 | 0.029 |"),
                                     ("| −9.81 |", "| −9.18 |"), ("| 0.8300 | 15 | batch", "| 0.8300 | 10 | batch")])
def test_a_changed_digit_fails(old, new):
    """The check can fail: one number changed in a copy of the document (a mean, a Holm p, a Δ, a search row)."""
    text = DOC_PATH.read_text()
    assert old in text
    with pytest.raises(AssertionError):
        check_section(text.replace(old, new, 1).replace("−", "-"))


def test_the_document_says_which_numbers_have_no_data():
    text = doc()
    assert "were not\nkept" in text or "were not kept" in text.replace("\n", " ")
    assert SECTION in text
    assert sorted(p.name for p in DATA.iterdir()) == ["seeds.csv", "unideal-search.csv"]
