"""docs/curriculum-study.md against its committed data (docs/curriculum-study/data).

Every table of the document is recomputed from the CSV files by experiments/sweeps/curriculum-study-tables.py, with
``raysim report``'s own statistics (``raysim.report_stats``: mean ± std, the paired t-test, the column test with
Holm's correction), and must equal the document's cell for cell. Every difference in points and every p-value the
text cites must be one the data gives, and the counts and settings the text names must be the data's.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from conftest import ROOT

DOC_PATH = ROOT / "docs" / "curriculum-study.md"
DATA = ROOT / "docs" / "curriculum-study" / "data"
_spec = importlib.util.spec_from_file_location("curriculum_study_tables",
                                               ROOT / "experiments" / "sweeps" / "curriculum-study-tables.py")
study = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(study)  # type: ignore[union-attr]


def doc_tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text``: its data rows (header and rule left out) as stripped cells."""
    out: list[list[list[str]]] = []
    current = None
    for line in text.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                out.append(current)
                continue  # the header
            if not set(line) <= set("|- "):
                current.append([c.strip() for c in line.strip().strip("|").split("|")])
        else:
            current = None
    return out


def prose(text: str) -> str:
    """The text without its tables, code blocks, inline code and image lines: what cites figures in sentences."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    lines = [ln for ln in text.splitlines() if not ln.startswith("|") and not ln.startswith("![")]
    return re.sub(r"`[^`]*`", "", "\n".join(lines))


def check_tables(text: str) -> None:
    expected = study.tables(DATA)
    found = doc_tables(text)
    assert len(found) == len(expected) == 5, (len(found), len(expected))
    for i, (got, want) in enumerate(zip(found, expected)):
        assert len(got) == len(want), (i, len(got), len(want))
        for row_got, row_want in zip(got, want):
            assert row_got == row_want, (i, row_got, row_want)


SIGNED = re.compile(r"(?<![\w.])[+−]\d+\.\d+")  # a difference in points: +1.17, −2.6
P_VALUE = re.compile(r"\bp(?: =)? (\d\.\d+(?:e-\d+)?)")  # p = 0.037, Holm p = 0.0013, p 4.4e-04
POINTS = re.compile(r"(\d+\.\d+) points?\b")  # 2.6 points
MEAN3 = re.compile(r"(?<![\d.])0\.\d{3}(?!\d)")  # a search mean by group, 0.758
SCORE4 = re.compile(r"(?<![\d.])0\.\d{4}(?!\d)")  # a search trial's score, 0.8450


def check_cited(text: str) -> None:
    cited = study.cited(DATA)
    tables = study.tables(DATA)
    search_scores = {row[0] for table in (tables[0], tables[3]) for row in table}  # the two searches' scores
    search_cells = {cell for table in (tables[0], tables[3]) for row in table for cell in row}  # and settings
    body = prose(text)
    for pattern in (SIGNED, P_VALUE, POINTS):
        for m in pattern.finditer(body):
            figure = m.group(1) if m.groups() else m.group(0)
            assert figure in cited, (figure, body[m.start() - 80:m.end()])
    for m in MEAN3.finditer(body):
        assert m.group(0) in cited or m.group(0) in search_cells, (m.group(0), body[m.start() - 80:m.end()])
    for m in SCORE4.finditer(body):
        assert m.group(0) in search_scores or m.group(0) in cited, (m.group(0), body[m.start() - 80:m.end()])


def check_counts(text: str) -> None:
    """ASHA's stopped trials and the searches' best settings, as the text names them."""
    for name, score, settings in (("unideal-search.csv", "best_acc_mean", ("algorithm.alpha",)),
                                  ("fapd-search.csv", "best_acc_global", ("algorithm.epsilon",))):
        trials = study.read(name, DATA)
        stopped = sum(t["status"] == "stopped" for t in trials)
        assert f"ASHA stopped {stopped} " in text, (name, stopped)
        best = max(trials, key=lambda t: float(t[score]))
        for key in settings:
            assert f"{float(best[key]):.{2 if key == 'algorithm.alpha' else 3}f}" in text, (name, key)


def check(text: str) -> None:
    check_tables(text)
    check_cited(text)
    check_counts(text)


def test_the_document_matches_its_data():
    assert sorted(p.name for p in DATA.iterdir()) == ["fapd-search.csv", "scale.csv", "seeds.csv",
                                                      "unideal-search.csv"]
    check(DOC_PATH.read_text())


def test_a_changed_digit_fails():
    """The check can fail: one figure changed in a copy of the document, in each of the five tables and in the
    text (a difference and a p-value), is caught."""
    text = DOC_PATH.read_text()
    tables = study.tables(DATA)
    edits = [(study.markdown([tables[0][0]]), 0), (study.markdown([tables[1][1]]), 1),
             (study.markdown([tables[2][0]]), 1), (study.markdown([tables[3][-1]]), 0),
             (study.markdown([tables[4][2]]), 1)]
    for row, cell in edits:
        assert row in text, row
        cells = row.strip("| ").split(" | ")
        cells[cell] = bump(cells[cell])
        with pytest.raises(AssertionError):
            check(text.replace(row, study.markdown([cells]), 1))
    for pattern in (SIGNED, P_VALUE):
        line = next(ln for ln in prose(text).splitlines() if pattern.search(ln) and ln in text)
        m = pattern.search(line)
        figure = m.group(1) if m.groups() else m.group(0)  # type: ignore[union-attr]
        changed = line[:m.end() - len(figure)] + bump(figure) + line[m.end():]  # type: ignore[union-attr]
        with pytest.raises(AssertionError):
            check(text.replace(line, changed, 1))


def bump(figure: str) -> str:
    """The same figure with its last digit changed (9 -> 8, else + 1)."""
    i = max(i for i, ch in enumerate(figure) if ch.isdigit())
    digit = int(figure[i])
    return figure[:i] + str(8 if digit == 9 else digit + 1) + figure[i + 1:]
