"""``raysim report RUN_DIR...``: tables, significance tests and plots from run directories alone.

Runs are found below the given paths (a run directory holds ``config.yaml`` and ``metrics.jsonl``; sweep and seed
parents are searched) and grouped by their config minus the seed and the keys that only say how or where a run ran
(``name``, ``log.*``, ``engine.*``). The main table is shaped like the papers': rows are methods, columns are
settings, cells are mean ± std over seeds of each run's best accuracy; the column's best is bold, and a ``*`` marks
each method that the best beats at p < 0.01 (a paired t-test on shared seeds, else Welch's, Holm-corrected over the
column: ``raysim.report_stats``, which also gives the final-round table and the client spread).

Which runs are a method and which a setting (``layout``):

* ``name``: from the configs' names, ``<setting>-<method>`` with the method starting at the algorithm's name, as the
  experiment files are named (``experiments/fapd/cifar10-moon.yaml`` is ``cifar10-moon``: setting ``cifar10``, method
  ``moon``; ``digits-fapd-nadpt``: ``digits`` and ``fapd-nadpt``; ``digits-niid1-cpu-fedproto``:
  ``digits-niid1-cpu`` and ``fedproto``). So every method of a seed's table lands in one table whatever its own
  hyperparameters, and a method that had to run a variant of the setting (UNIDEAL's FedAvg on the RGB domains)
  stays in its setting's column. Groups that still share a cell (a sweep over ``train.lr``, say) get the keys that
  tell them apart appended to the method: ``fedprox (lr=0.1)``.
* ``keys``: from the keys that vary between groups: columns are the varying ``data.*`` / ``clients.*`` /
  ``model.*`` keys (``columns``), rows ``algorithm.name`` plus the other varying keys.
* ``auto`` (the default): ``name`` when every group's runs are named that way (one name per group), else ``keys``.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import yaml

from raysim.config import flatten_dict
from raysim.errors import UserError
from raysim.report_stats import MIN_SEEDS, extra_sections, final_table_rows, format_value, write_extra_csvs
from raysim.runlog import EPOCHS, human_bytes, read_metrics, warn_stderr
from raysim.tables import DEFAULT_COLUMNS
from raysim.tables import csv_number as _num
from raysim.tables import markdown_table
from raysim.tables import mean_pm as _pm

# keys that say how, where or how long a run ran, not which method it is: they never split a group ("rounds": a run
# of 3 rounds and one of 4 are the same method; the report warns when a group mixes lengths)
IGNORED_PREFIXES = ("seed", "name", "log.", "engine.")
RUN_LENGTH_KEYS = ("rounds",)
# metrics where less is better (``--mode auto``); every other metric is best at its maximum
LOWER_IS_BETTER = ("loss", "bytes_", "wall_s")
LAYOUTS = ("auto", "name", "keys")
ALPHA = 0.01
MB = 1e6


@dataclass
class Run:
    path: Path
    config: dict[str, Any]  # flat, dotted keys
    rows: list[dict]

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    def best(self, metric: str, mode: str = "max") -> Optional[float]:
        values = [r[metric] for r in self.rows if isinstance(r.get(metric), (int, float))]
        return (max(values) if mode == "max" else min(values)) if values else None

    def to_target(self, metric: str, target: float, mode: str = "max") -> Optional[dict]:
        """The first round whose metric reaches ``target`` (at or above it; at or below for ``mode="min"``), with the
        bytes and seconds spent until then."""
        for r in self.rows:
            value = r.get(metric)
            if isinstance(value, (int, float)) and (value >= target if mode == "max" else value <= target):
                return {"round": r["round"], "mb": _x_value(r, "mb"), "wall_s": r.get("wall_s_total", math.nan),
                        "sim_h": _x_value(r, "sim_h")}
        return None


@dataclass
class Group:
    """All seeds of one (method, setting)."""

    method: str
    setting: str
    runs: list[Run]
    values: list[float] = field(default_factory=list)  # best metric per run
    mean: Optional[float] = None
    std: Optional[float] = None  # sample std (ddof=1); 0 for one run
    p_vs_best: Optional[float] = None  # t-test against the column's best (two-sided; ``test`` says which)
    beaten: bool = False  # the column's best is better at Holm-adjusted p < alpha
    is_best: bool = False
    by_seed: dict = field(default_factory=dict)  # seed -> best metric ({} when seeds repeat): pairs runs
    test: str = ""  # "paired" (same seeds) | "welch" | "" (not tested)
    p_adjusted: Optional[float] = None  # p_vs_best after Holm's correction over the column's comparisons
    final_values: list[float] = field(default_factory=list)  # the metric at each run's last evaluated round
    final_mean: Optional[float] = None
    final_std: Optional[float] = None


@dataclass
class Report:
    groups: list[Group]
    methods: list[str]
    settings: list[str]
    metric: str
    target: float
    files: dict[str, Path]
    layout: str = "keys"  # how rows and columns were found: "name" or "keys" (see the module docstring)
    mode: str = "max"  # "max": higher is better (accuracies); "min": lower (loss, bytes, seconds)
    notes: list[str] = field(default_factory=list)  # why plots were left out, for the console

    @property
    def percent(self) -> bool:
        """Accuracies are shown in %; any other metric as it is."""
        return is_percent(self.metric)

    @property
    def unit(self) -> str:
        return " (%)" if self.percent else ""

    def group(self, method: str, setting: Optional[str] = None) -> Group:
        for g in self.groups:
            if g.method == method and (setting is None or g.setting == setting):
                return g
        raise KeyError((method, setting))


def metric_mode(metric: str) -> str:
    """``--mode auto``: "min" for losses, traffic and times, "max" for everything else (accuracies, k, p ...)."""
    return "min" if metric.startswith(LOWER_IS_BETTER) else "max"


def is_percent(metric: str) -> bool:
    return metric.startswith("acc")


# ---------------------------------------------------------------------------------------------- finding runs


def is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file()


def find_runs(paths: Sequence[str | Path], *, found: Optional[list[str]] = None) -> list[Path]:
    """Run directories at or below each path (sweep and seed parents nest them). The search does not enter run
    directories (their checkpoints and reports hold no runs) or hidden folders. ``found`` collects one line per
    searched folder saying how many runs it held and where, so a folder holding more than was meant (``raysim report
    /tmp``) shows at once."""
    import os

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
    return kept


def load_run(path: Path) -> Run:
    try:
        raw = yaml.safe_load((path / "config.yaml").read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}/config.yaml is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}/config.yaml is not a mapping of config keys")
    metrics = path / "metrics.jsonl"
    return Run(path=path, config=flatten_dict(raw), rows=usable_rows(read_metrics(metrics, warn=warn_stderr), metrics))


def _ignored(key: str) -> bool:
    return key in RUN_LENGTH_KEYS or any(key == p or key.startswith(p) for p in IGNORED_PREFIXES)


def _hashable(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# ---------------------------------------------------------------------------------------------- grouping


def group_runs(runs: list[Run], columns: Sequence[str] = DEFAULT_COLUMNS, layout: str = "auto") -> list[Group]:
    """Group by config minus seed/name/log/engine; label each group's method and setting by ``layout``."""
    return _group_runs(runs, columns, layout)[0]


def _group_runs(runs: list[Run], columns: Sequence[str], layout: str) -> tuple[list[Group], str]:
    if layout not in LAYOUTS:
        raise UserError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    buckets: dict[tuple, list[Run]] = {}
    for run in runs:
        key = tuple(sorted((k, _hashable(v)) for k, v in run.config.items() if not _ignored(k)))
        buckets.setdefault(key, []).append(run)
    keys = sorted({k for run in runs for k in run.config if not _ignored(k)})
    named = [_named_cell(members) for members in buckets.values()]
    if layout == "name" and None in named:
        bad = next(m for m, n in zip(buckets.values(), named) if n is None)[0]
        raise UserError(f"{bad.path}: its config's name {bad.config.get('name')!r} is not '<setting>-<method>' with "
                        f"the method starting at algorithm.name {bad.config.get('algorithm.name')!r} "
                        f"(use the keys layout)")
    if layout != "keys" and None not in named:
        return _label_by_name(list(buckets.values()), named, keys), "name"
    varying = [k for k in keys if len({_hashable(b[0].config.get(k)) for b in buckets.values()}) > 1]
    col_keys = [k for k in varying if any(k == c or k.startswith(c) for c in columns)]
    row_keys = [k for k in varying if k not in col_keys]
    # an algorithm's own keys (algorithm.mu) name a method only where they differ between runs of that algorithm:
    # between algorithms, the name already tells them apart
    by_algorithm: dict[str, list[dict]] = {}
    for members in buckets.values():
        by_algorithm.setdefault(_hashable(members[0].config.get("algorithm.name")), []).append(members[0].config)
    groups = []
    for members in buckets.values():
        cfg = members[0].config
        peers = by_algorithm[_hashable(cfg.get("algorithm.name"))]
        own = [k for k in row_keys if not k.startswith("algorithm.")
               or len({_hashable(c.get(k)) for c in peers}) > 1]
        groups.append(Group(method=_method_label(cfg, own, varying),
                            setting=_setting_label(cfg, col_keys, varying), runs=sorted(members, key=_seed_key)))
    return groups, "keys"


def split_name(name: Any, algorithm: Any) -> Optional[tuple[str, str]]:
    """(setting, method) of a config named ``<setting>-<method>`` whose method is ``algorithm`` or starts with
    ``algorithm-`` (the last such place in the name); None when the name is not of that form."""
    name, algorithm = str(name or ""), str(algorithm or "")
    if not algorithm:
        return None
    token = f"-{algorithm}"
    at = name.rfind(token)
    while at > 0:
        end = at + len(token)
        if end == len(name) or name[end] == "-":
            return name[:at], name[at + 1:]
        at = name.rfind(token, 0, at)
    return None


def _named_cell(members: list[Run]) -> Optional[tuple[str, str]]:
    """The group's (setting, method) from its runs' names, if they all name the same one."""
    cells = {split_name(r.config.get("name"), r.config.get("algorithm.name")) for r in members}
    return cells.pop() if len(cells) == 1 and None not in cells else None


def _label_by_name(buckets: list[list[Run]], named: list[tuple[str, str]], keys: list[str]) -> list[Group]:
    """Groups labelled by their names; groups sharing a cell get the keys that tell them apart."""
    groups = []
    for members, (setting, method) in zip(buckets, named):
        clash = [b for b, cell in zip(buckets, named) if cell == (setting, method)]
        if len(clash) > 1:
            differ = [k for k in keys if len({_hashable(b[0].config.get(k)) for b in clash}) > 1]
            cfg = members[0].config
            method += " (" + ", ".join(f"{_short(k, differ)}={_value(cfg.get(k))}" for k in differ) + ")"
        groups.append(Group(method=method, setting=setting, runs=sorted(members, key=_seed_key)))
    return groups


def _seed_key(run: Run) -> tuple:
    return (str(type(run.seed)), run.seed if run.seed is not None else 0, str(run.path))


def _short(key: str, keys: list[str]) -> str:
    """The key's last segment, unless another varying key shares it."""
    leaf = key.rsplit(".", 1)[-1]
    return leaf if sum(k.rsplit(".", 1)[-1] == leaf for k in keys) == 1 else key


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ",".join(map(_value, value)) + "]"
    return str(value)


def _method_label(cfg: dict, row_keys: list[str], varying: list[str]) -> str:
    name = _value(cfg.get("algorithm.name", "?"))
    extra = [f"{_short(k, varying)}={_value(cfg[k])}" for k in row_keys
             if k != "algorithm.name" and cfg.get(k) is not None]
    return f"{name} ({', '.join(extra)})" if extra else name


def _setting_label(cfg: dict, col_keys: list[str], varying: list[str]) -> str:
    named = [k for k in col_keys if cfg.get(k) is not None]  # a key this run's dataset or model does not have
    if not named:
        return _value(cfg.get("data.name", "all"))
    return ", ".join(f"{_short(k, varying)}={_value(cfg.get(k))}" for k in named)


# ---------------------------------------------------------------------------------------------- statistics


def score(groups: list[Group], metric: str, alpha: float = ALPHA, mode: str = "max") -> None:
    """Mean ± std of each group's best (the maximum, or the minimum for ``mode="min"``) and final metric; each
    column's best tested against the others (paired on shared seeds, else Welch; Holm-corrected: see
    ``raysim.report_stats``)."""
    from raysim.report_stats import column_tests, final_value, mean_std

    for g in groups:
        bests = [(run.seed, run.best(metric, mode)) for run in g.runs]
        g.values = [v for _, v in bests if v is not None]
        seeds = [s for s, v in bests if v is not None]
        g.by_seed = dict(zip(seeds, g.values)) if len(set(map(_hashable, seeds))) == len(seeds) else {}
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


# ---------------------------------------------------------------------------------------------- the report


def make_report(paths: Sequence[str | Path], out: Path, *, metric: str = "acc_mean", target: float = 0.5,
                columns: Sequence[str] = DEFAULT_COLUMNS, alpha: float = ALPHA, plots: bool = True,
                layout: str = "auto", mode: str = "auto", announce: bool = False) -> Report:
    """Find, group and score the runs; write report.md, table.csv, summary.csv, final_table.csv, comm.csv, clients.csv
    (when runs have client_metrics.jsonl) and the PNG plots.

    ``metric`` is any numeric key of ``metrics.jsonl``; ``mode`` says whether its best is the maximum or the minimum
    (``auto``: minimum for losses, bytes and seconds). ``layout`` says how methods (rows) and settings (columns) are
    found: see the module docstring. ``announce``: say on stderr what a searched folder held."""
    if mode not in ("auto", "max", "min"):
        raise UserError(f"--mode must be auto, max or min, got {mode!r}")
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
        seeds = [_hashable(r.seed) for r in g.runs]
        shared = sorted({json.loads(s) for s in seeds if seeds.count(s) > 1}, key=str)
        where = f"{g.method} on {g.setting}" if g.setting else g.method
        if shared:
            differ = sorted({k for r in g.runs for k in r.config
                             if _ignored(k) and k not in ("seed", "name") and not k.startswith("log.")
                             and len({_hashable(o.config.get(k)) for o in g.runs}) > 1})
            how = f" and differ only in {', '.join(differ)}" if differ else ""
            notes.append(f"{where}: {len(g.runs)} runs share seed {', '.join(map(str, shared))}{how}: its n and "
                         f"± are not over independent seeds (run other seeds, or report fewer runs)")
        lengths = sorted({r.config.get("rounds") for r in g.runs if r.config.get("rounds") is not None})
        if len(lengths) > 1:
            notes.append(f"{where}: its runs ran different numbers of rounds ({', '.join(map(str, lengths))}); "
                         f"rounds do not split a method, but its best and final values come from runs of "
                         f"different lengths")
    return notes


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


def _write_markdown(report: Report, path: Path, alpha: float) -> Path:

    seeds = sorted({len(g.values) for g in report.groups})
    lines = ["# raysim report", "",
             f"{sum(len(g.runs) for g in report.groups)} runs in {len(report.groups)} groups "
             f"(seeds per group: {', '.join(map(str, seeds))}).", "",
             f"## Best `{report.metric}`{report.unit}, mean ± std over seeds"
             + ("" if report.mode == "max" else " (best: the lowest)"), "",
             markdown_table(["method"] + report.settings, main_table_rows(report)), "",
             f"Bold: the best in its column. `*`: the column's best beats this method at p < {alpha:g} "
             f"(paired t-test over seeds when both ran the same seeds, else Welch's t-test; Holm-corrected over the "
             f"column's comparisons; no mark from fewer than {MIN_SEEDS} seeds on either side, though the "
             f"p-values are computed from two). "
             f"p-values (raw and Holm-adjusted) are in `summary.csv`. "
             + ("Rows and columns come from the configs' names (`<setting>-<method>`)." if report.layout == "name"
                else "Rows and columns come from the config keys that vary between groups."), "",
             *([f"Warnings: {'; '.join(report.notes)}.", ""] if report.notes else []),
             *extra_sections(report),
             f"## Communication and speed (target: {report.metric} {target_sign(report)} {report.target:g})", ""]
    rows = []
    simulated = has_sim_time(report)
    for g in _ordered(report):
        c = comm_stats(g, report.metric, report.target, report.mode)
        rows.append([g.method, g.setting, human_bytes(c["bytes_up_per_round"]),
                     human_bytes(c["bytes_down_per_round"]), f"{c['wall_s_per_round']:.2f}",
                     f"{c['reached']}/{c['runs']}", _pm(c["rounds_to_target"], ".1f"), _pm_bytes(c["mb_to_target"]),
                     _pm(c["wall_s_to_target"], ".1f")] + ([_pm(c["sim_h_to_target"], ".3g")] if simulated else []))
    lines += [markdown_table(["method", "setting", "up / round", "down / round", "s / round (median)",
                              "reached", "rounds to target", "bytes to target", "s to target"]
                             + (["simulated h to target"] if simulated else []), rows), "",
              "Up/down: bytes crossing the network per round (all sampled clients together); bytes to target: "
              "cumulative up + down until the first round at or above the target, over the seeds that reached it; "
              "s to target includes the first round's start-up.", ""]
    labels = plot_labels(report) if any(n.endswith(".png") for n in report.files) else {}
    if any(short != method for method, short in labels.items()):
        lines += ["## Plot labels", "", markdown_table(["label", "method"], [[labels[m], m] for m in report.methods]),
                  ""]
    for name, title in (("acc_vs_round.png", "Accuracy per round"), ("acc_vs_mb.png", "Accuracy per megabyte"),
                        ("k_vs_round.png", "FAPD curriculum dimension k"),
                        ("p_vs_round.png", "UNIDEAL curriculum share p"),
                        ("acc_vs_sim_h.png", "Accuracy against simulated time"),
                        ("to_target.png",
                         f"Traffic and time to {report.metric} {target_sign(report)} {report.target:g}")):
        if name in report.files:
            lines += [f"## {title}", "", f"![{title}]({name})", ""]
    path.write_text("\n".join(lines))
    return path


# ---------------------------------------------------------------------------------------------- plots


def _curve(runs: list[Run], y: str, x: Optional[str] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per round: mean and std over runs of ``y`` (and the mean of ``x`` when given, else the round)."""
    by_round: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for r in run.rows:
            if r.get(y) is None:
                continue
            xv = r["round"] if x is None else _x_value(r, x)
            if not math.isfinite(xv):  # a run without that axis (no simulated clock)
                continue
            by_round.setdefault(r["round"], []).append((xv, r[y]))
    rounds = sorted(by_round)
    xs = np.array([np.mean([p[0] for p in by_round[k]]) for k in rounds])
    ys = np.array([np.mean([p[1] for p in by_round[k]]) for k in rounds])
    sd = np.array([np.std([p[1] for p in by_round[k]], ddof=1) if len(by_round[k]) > 1 else 0.0 for k in rounds])
    return xs, ys, sd


def _epoch_curve(runs: list[Run], y: str, x: Optional[str] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As :func:`_curve` for a per-local-epoch list (``p_epochs``): one point per local epoch, local epoch e of E
    of round r at x = r - 1 + e / E (the round's last epoch at x = r)."""
    by_x: dict[float, list[float]] = {}
    for run in runs:
        for r in run.rows:
            values = r.get(y)
            if not isinstance(values, list) or not values:
                continue
            for e, v in enumerate(values, start=1):
                if v is not None:
                    by_x.setdefault(r["round"] - 1 + e / len(values), []).append(float(v))
    xs = sorted(by_x)
    ys = np.array([np.mean(by_x[k]) for k in xs])
    sd = np.array([np.std(by_x[k], ddof=1) if len(by_x[k]) > 1 else 0.0 for k in xs])
    return np.array(xs), ys, sd


def _x_value(row: dict, x: str) -> float:
    if x == "mb":
        return (row.get("bytes_up_total", math.nan) + row.get("bytes_down_total", math.nan)) / MB
    if x == "sim_h":  # system.enabled: the simulated clock at the end of the round, in hours
        return row.get("sim_time_s", math.nan) / 3600.0
    return row.get(x, math.nan)


MAX_PANELS = 12  # settings (panels) in one figure; more make a figure nobody can read
MAX_METHODS = 20  # methods (distinct colours) in one figure
PANELS_PER_ROW = 4


def _plottable(report: Report) -> bool:
    """Plots of more settings or methods than a figure can show are left out, with the reason, instead of a
    figure thousands of pixels wide (``raysim report`` on a folder of unrelated runs)."""
    too_many = [f"{n} {what} (at most {cap})" for n, what, cap in
                ((len(report.settings), "settings", MAX_PANELS), (len(report.methods), "methods", MAX_METHODS))
                if n > cap]
    if not too_many:
        return True
    note = (f"plots left out: {' and '.join(too_many)} are more than one figure shows; report fewer runs, or choose "
            f"the setting keys with --columns")
    report.notes.append(note)
    warn_stderr(note)
    return False


LABEL_MAX = 24  # longer method labels become "<algorithm>-<n>" in plots, explained in report.md's key table


def plot_labels(report: Report) -> dict[str, str]:
    """Method -> the label its curves carry: itself when short, else its algorithm name and a number."""
    out: dict[str, str] = {}
    counts: dict[str, int] = {}
    for method in report.methods:
        if len(method) <= LABEL_MAX:
            out[method] = method
            continue
        base = method.split(" (", 1)[0][:LABEL_MAX - 3]
        counts[base] = counts.get(base, 0) + 1
        out[method] = f"{base}-{counts[base]}"
    return out


def write_plots(report: Report, out: Path) -> dict[str, Path]:
    """Accuracy vs round and vs cumulative MB (mean line, std band over seeds); k vs round where FAPD logged it, p
    vs round where UNIDEAL did.

    One panel per setting, holding only settings with data (no empty k or p panel for a setting without them); one
    legend under the panels with short labels (``plot_labels``), each method in the same colour everywhere."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    labels = plot_labels(report)
    cmap = plt.get_cmap("tab10" if len(report.methods) <= 10 else "tab20")
    colours = {m: cmap(i % cmap.N) for i, m in enumerate(report.methods)}
    files = {}
    plots = [("acc_vs_round.png", report.metric, None, "round", report.metric),
             ("acc_vs_mb.png", report.metric, "mb", "cumulative MB (up + down)", report.metric),
             ("k_vs_round.png", "k", None, "round", "curriculum dimension k"),
             ("p_vs_round.png", "p", None, "round", "distilled share p (mean over local epochs)")]
    if has_sim_time(report):
        plots.append(("acc_vs_sim_h.png", report.metric, "sim_h", "simulated hours", report.metric))
    if any(isinstance(r.get("p_epochs"), list) for g in report.groups for run in g.runs for r in run.rows):
        plots[-1] = ("p_vs_round.png", "p_epochs", None, "round (one point per local epoch)",
                     "distilled share p")  # the curriculum's course inside each round
    for name, y, x, xlabel, ylabel in plots:
        curve = _epoch_curve if y == "p_epochs" else _curve
        curves = {s: [(g, curve(g.runs, y, x)) for g in _ordered(report) if g.setting == s]
                  for s in report.settings}
        curves = {s: [(g, c) for g, c in cs if len(c[0])] for s, cs in curves.items()}
        settings = [s for s in report.settings if curves[s]]
        if not settings:
            continue
        n = len(settings)
        across, down = min(n, PANELS_PER_ROW), -(-n // PANELS_PER_ROW)
        methods = [m for m in report.methods if any(g.method == m for s in settings for g, _ in curves[s])]
        ncol = max(1, min(len(methods), int(5.0 * across // 1.6) or 1, 4))
        rows = -(-len(methods) // ncol)
        fig, axes = plt.subplots(down, across, figsize=(5.0 * across, 3.6 * down + 0.28 * rows), squeeze=False,
                                 layout="constrained")
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        handles = {}
        for ax, setting in zip(axes.flat, settings):
            for g, (xs, ys, sd) in curves[setting]:
                step = "post" if y == "k" else None
                line, = ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, markersize=3, color=colours[g.method],
                                drawstyle="steps-post" if step else "default")
                ax.fill_between(xs, ys - sd, ys + sd, alpha=0.2, color=colours[g.method], step=step)
                handles.setdefault(g.method, line)
            if x is None:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title("\n".join(textwrap.wrap(setting, 45)), fontsize=10)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        seeds = {g.method: len(g.runs) for g in report.groups}
        fig.legend([handles[m] for m in methods], [f"{labels[m]} (n={seeds[m]})" for m in methods],
                   loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)
        fig.savefig(out / name, dpi=110)
        files[name] = out / name
        plt.close(fig)
    return files


def write_target_plot(report: Report, out: Path) -> dict[str, Path]:
    """``to_target.png`` (see :func:`target_figure`); nothing when no method reached the target."""
    fig = target_figure(report)
    if fig is None:
        return {}
    import matplotlib.pyplot as plt

    path = out / "to_target.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {path.name: path}


def target_figure(report: Report) -> Any:
    """UNIDEAL's Fig. 1: for every method, the traffic (up + down) and the wall-clock time it took to reach the
    report's target (mean ± std over the seeds that reached it), one panel per setting, one labelled point per
    method; methods that never reached it are listed under the panel. None when no method reached the target.

    Traffic spans decades (a head against a whole model), so the axis is logarithmic; a method that sends nothing
    (``local``) sits at 0 on a symmetric-log axis, linear below the smallest traffic drawn. Only major ticks carry
    labels unless the axis spans less than a decade, and a label is put left of its point in the right part of a
    panel, so no label overlaps another or leaves the figure."""
    stats = {s: [(g, comm_stats(g, report.metric, report.target, report.mode)) for g in report.groups
                 if g.setting == s] for s in report.settings}
    settings = [s for s in report.settings if any(c["reached"] for _, c in stats[s])]
    if not settings:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    labels = plot_labels(report)
    cmap = plt.get_cmap("tab10" if len(report.methods) <= 10 else "tab20")
    colours = {m: cmap(i % cmap.N) for i, m in enumerate(report.methods)}
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # "6", not "6×10⁰"
    across, down = min(len(settings), PANELS_PER_ROW), -(-len(settings) // PANELS_PER_ROW)
    fig, axes = plt.subplots(down, across, figsize=(5.5 * across, 4.4 * down), squeeze=False, layout="constrained")
    for ax in axes.flat[len(settings):]:
        ax.set_visible(False)
    placed = []
    for ax, setting in zip(axes.flat, settings):
        missed, points = [], []
        for g, c in sorted(stats[setting], key=lambda gc: gc[0].method):
            if not c["reached"]:
                missed.append(labels[g.method])
                continue
            (mb, mb_sd), (sec, sec_sd) = c["mb_to_target"], c["wall_s_to_target"]
            ax.errorbar(mb, sec, xerr=mb_sd, yerr=sec_sd, fmt="o", color=colours[g.method], capsize=3)
            points.append((mb, sec, f"{labels[g.method]} ({c['reached']}/{c['runs']}, {human_bytes(mb * MB)})"))
        positive = [mb for mb, _, _ in points if mb > 0]
        if len(positive) < len(points):  # a method that sent nothing: 0 on a symmetric-log axis
            ax.set_xscale("symlog", linthresh=min(positive) / 2 if positive else 1.0, linscale=0.5)
            ax.set_xlim(left=0)
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(plain if max(positive) / min(positive) < 10 else NullFormatter())
        ax.xaxis.set_major_formatter(plain)
        ax.margins(x=0.08, y=0.12)
        ax.set_xlabel(f"MB (up + down) to {report.metric} {target_sign(report)} {report.target:g}")
        ax.set_ylabel("seconds to target")
        ax.set_title(setting, fontsize=10)
        ax.grid(alpha=0.3)
        if missed:
            ax.text(0.0, -0.22, "never reached: " + ", ".join(missed), transform=ax.transAxes, fontsize=7, va="top")
        placed.append((ax, points))
    fig.canvas.draw()  # final limits: labels in a panel's right third go left of their point
    for ax, points in placed:
        for mb, sec, text in points:
            fx, fy = ax.transAxes.inverted().transform(ax.transData.transform((mb, sec)))
            right = fx > 0.6
            ax.annotate(text, (mb, sec), fontsize=7, textcoords="offset points",
                        xytext=(-4 if right else 4, -10 if fy > 0.85 else 4), ha="right" if right else "left")
    return fig


def format_console(report: Report, out: Path) -> str:
    """What ``raysim report`` prints: the main table and where everything went."""

    lines = [f"best {report.metric}{report.unit}, mean ± std over seeds"
             f"{'' if report.mode == 'max' else ' (best: the lowest)'}; * = beaten by the column's best at "
             f"Holm-adjusted p < {ALPHA:g}",
             markdown_table(["method"] + report.settings, main_table_rows(report, markdown=False)),
             f"final-round {report.metric}{report.unit}, mean ± std over seeds",
             markdown_table(["method"] + report.settings, final_table_rows(report)),
             f"report: {out / 'report.md'} (tables: table.csv, summary.csv, comm.csv; plots: "
             f"{', '.join(n for n in report.files if n.endswith('.png')) or 'none'})"]
    lines += [f"raysim: {note}" for note in report.notes]
    return "\n".join(lines)
