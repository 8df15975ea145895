"""What a report is made of: runs (a run directory's flat config and rows), groups (the seeds of one method in one
setting) and the report, with the metric's direction and unit."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# keys that say how, where, how long or how often measured a run ran, not which method it is: they never split a
# group and never name one ("rounds": a run of 3 rounds and one of 4 are the same method, and the report warns when a
# group mixes lengths; eval.every and eval.chunk, like engine.* and log.*, are keys a --resume may change because
# they change nothing a run computes)
IGNORED_PREFIXES = ("seed", "name", "log.", "engine.", "eval.every", "eval.chunk")
RUN_LENGTH_KEYS = ("rounds",)
# every metric's direction (``--mode auto``): the lowest is best for a cost (losses, traffic, wall-clock and
# simulated seconds, the privacy spent, an attack's success, staleness, lost clients), the highest for a score
# (accuracies) and for the curricula's k and p (how far they went); a metric named in neither list is taken as a
# score, and the report says so
LOWER_IS_BETTER = ("loss", "bytes_", "wall_s", "sim_time_s", "round_sim_s", "time/", "epsilon", "dpsgd/epsilon",
                   "audit/epsilon", "attack/asr", "staleness", "dropouts", "late", "nonprivate/loss",
                   "nonprivate/bytes_")
HIGHER_IS_BETTER = ("acc", "hparams/best_acc", "curriculum/teacher_acc", "curriculum/explained_variance",
                    "nonprivate/curriculum/teacher_acc")
CURRICULA = ("k", "p")  # names, not prefixes ("partial" is no curriculum)
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
                return {"round": r["round"], "mb": x_value(r, "mb"), "wall_s": r.get("wall_s_total", math.nan),
                        "sim_h": x_value(r, "sim_h")}
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


def metric_direction(metric: str) -> Optional[str]:
    """"min" (a cost: ``LOWER_IS_BETTER``), "max" (a score: ``HIGHER_IS_BETTER``), or None for a metric raysim does
    not know (a plugin's own)."""
    if metric.startswith(LOWER_IS_BETTER):
        return "min"
    if metric in CURRICULA or metric.startswith(HIGHER_IS_BETTER):
        return "max"
    return None


def metric_mode(metric: str) -> str:
    """``--mode auto``: the metric's direction, "max" for one raysim does not know."""
    return metric_direction(metric) or "max"


def is_percent(metric: str) -> bool:
    return metric.startswith("acc")


def x_value(row: dict, x: str) -> float:
    if x == "mb":
        return (row.get("bytes_up_total", math.nan) + row.get("bytes_down_total", math.nan)) / MB
    if x == "sim_h":  # system.enabled: the simulated clock at the end of the round, in hours
        return row.get("sim_time_s", math.nan) / 3600.0
    return row.get(x, math.nan)


def ignored(key: str) -> bool:
    """Whether a config key only says how, where or how long a run ran (it never splits a group)."""
    return key in RUN_LENGTH_KEYS or any(key == p or key.startswith(p) for p in IGNORED_PREFIXES)


def hashable(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
