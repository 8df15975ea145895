"""Finding run directories below the given paths and reading each one's config and usable rows."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import yaml

from raysim.config import flatten_dict
from raysim.errors import UserError
from raysim.report.model import Run
from raysim.runlog import EPOCHS, read_metrics, warn_stderr


def is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file()


def find_runs(paths: Sequence[str | Path], *, found: Optional[list[str]] = None) -> list[Path]:
    """Run directories at or below each path (sweep and seed parents nest them). The search does not enter run
    directories (their checkpoints and reports hold no runs) or hidden folders. ``found`` collects one line per
    searched folder saying how many runs it held and where, so a folder holding more than was meant (``raysim report
    /tmp``) shows at once."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise UserError(f"{p} does not exist")
        if is_run_dir(p):
            runs.append(p)
            continue
        below = []
        for folder, dirs, _ in os.walk(p):
            here = Path(folder)
            if is_run_dir(here):
                below.append(here)
                dirs[:] = []
                continue
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if not below:
            raise UserError(f"{p} holds no raysim run directories (none with config.yaml and metrics.jsonl)")
        if found is not None:
            parents = sorted({str(b.parent.relative_to(p)) for b in below})
            where = ", ".join(parents[:3]) + (f" and {len(parents) - 3} more folders" if len(parents) > 3 else "")
            found.append(f"{len(below)} run director{'y' if len(below) == 1 else 'ies'} under {p} (in {where})")
        runs.extend(sorted(below))
    return list(dict.fromkeys(f.resolve() for f in runs))


_LARGEST = 1e300  # past this a metric's mean, spread or percentage overflows: not a value a run can have measured
_KEPT_LISTS = ("skipped",)  # list values a round's metrics may hold (the clients whose update was dropped)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and abs(value) <= _LARGEST


def _kept_list(key: str, value: object) -> bool:
    """A list a report reads: the skipped clients, or a per-epoch curve (``p_epochs``) of finite numbers."""
    if not isinstance(value, list):
        return False
    return key in _KEPT_LISTS or (key.endswith(EPOCHS) and all(_finite(v) for v in value))


def usable_rows(rows: list[dict], path: Path, warn: Callable[[str], None] = warn_stderr) -> list[dict]:
    """The rows with only the values a report can compare: finite numbers (a bool, string, nested value, NaN, Inf
    or a number past 1e300 is dropped, so that a non-finite value is never a best), and only rows whose ``round`` is
    a whole number; one warning line says how many were dropped, and where."""
    kept, dropped, where = [], 0, {}
    for row in rows:
        rnd = row.get("round")
        if not isinstance(rnd, int) or isinstance(rnd, bool):
            dropped += 1
            where.setdefault("round", []).append(repr(rnd)[:12])
            continue
        clean = {}
        for key, value in row.items():
            if _kept_list(key, value) or value is None or _finite(value):
                clean[key] = value
            else:
                dropped += 1
                where.setdefault(key, []).append(str(rnd))
        kept.append(clean)
    if dropped:
        detail = "; ".join(f"{k} (round{'s' if len(v) > 1 else ''} {', '.join(v[:3])}{' ...' if len(v) > 3 else ''})"
                           for k, v in list(where.items())[:3])
        what = "values that are not finite numbers" if dropped > 1 else "value that is not a finite number"
        warn(f"{path}: dropped {dropped} {what}: {detail}{' ...' if len(where) > 3 else ''}")
    return in_round_order(kept, path, warn)


def in_round_order(rows: list[dict], path: Path, warn: Callable[[str], None] = warn_stderr) -> list[dict]:
    """The rows by round, one per round (the last line of a round that appears twice): a report's final round is the
    highest, whatever the order of the lines (an edited or concatenated file); one warning line when they were
    not in order."""
    by_round: dict[int, dict] = {}
    for row in rows:
        by_round[row["round"]] = row
    ordered = [by_round[r] for r in sorted(by_round)]
    if len(ordered) != len(rows) or any(a is not b for a, b in zip(ordered, rows)):
        repeated = len(rows) - len(ordered)
        again = f" ({repeated} repeated: the last line of each kept)" if repeated else ""
        warn(f"{path}: its rounds are not in order{again}; read in round order")
    return ordered


def load_run(path: Path) -> Run:
    try:
        raw = yaml.safe_load((path / "config.yaml").read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}/config.yaml is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}/config.yaml is not a mapping of config keys")
    metrics = path / "metrics.jsonl"
    return Run(path=path, config=flatten_dict(raw), rows=usable_rows(read_metrics(metrics, warn=warn_stderr), metrics))
