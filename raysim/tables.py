"""Markdown tables and the number formats of the tables that ``raysim report`` and ``raysim tune`` write."""

from __future__ import annotations

from typing import Any, Optional

# the config-key prefixes whose varying keys make a report table's columns (settings); the rest make its rows
# (methods). Here, not in raysim.report (numpy), so that the CLI's parser is built without importing it
DEFAULT_COLUMNS = ("data.", "clients.", "model.")


def counted(n: int, word: str, plural: Optional[str] = None) -> str:
    """``1 trial``, ``2 trials``: a count and its noun, singular for one (``plural`` where it is not word + s)."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured table, columns padded to their widest cell (readable as plain text too)."""
    rows = [[c.replace("|", "\\|") for c in r] for r in rows]  # an error message may hold a '|'
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def metric_cell(value: Any) -> str:
    """A metric in a table: 4 decimals (3 significant digits below 0.001), ``-`` for none, anything else as text."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3g}"
    return str(value)


def short_value(value: Any) -> str:
    """A searched value (learning rate, seed, ...): 4 significant digits, ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def csv_number(value: Optional[float]) -> str:
    """A number in a CSV file: 6 significant digits, empty for none."""
    return "" if value is None else f"{value:.6g}"


def mean_pm(pair: tuple[Optional[float], Optional[float]], fmt: str) -> str:
    """``mean ± std`` in ``fmt``, ``-`` for none."""
    mean, std = pair
    return "-" if mean is None else f"{mean:{fmt}} ± {std:{fmt}}"
