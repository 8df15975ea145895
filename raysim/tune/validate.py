"""Checking a sweep before it runs: every candidate config loads, the metric exists, the cluster can place trials."""

from __future__ import annotations

import json
from typing import Any

from raysim.config import ExperimentConfig, load_config
from raysim.errors import UserError
from raysim.tune.spec import SweepError, SweepSpec


def candidate_overrides(spec: SweepSpec) -> list[list[str]]:
    """Trial overrides that together touch every searched value (and both ends of every range)."""
    values = {}
    for key, dist in spec.space.items():
        kind, args = next(iter(dist.items()))
        values[key] = [args[0], args[1] - 1] if kind == "randint" else args  # randint's high is exclusive
    first = {key: vals[0] for key, vals in values.items()}
    out = [[_override(k, v) for k, v in first.items()]]
    for key, vals in values.items():
        for value in vals[1:]:
            out.append([_override(k, value if k == key else v) for k, v in first.items()])
    return out


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML: strings stay strings, lists stay lists


def validate_sweep(spec: SweepSpec) -> ExperimentConfig:
    """Load every candidate config (bad keys and values fail here, naming the key), check the metric exists.

    Returns the first candidate's config; resources are checked by :func:`check_cluster` once Ray is up.
    """
    from raysim.registry import get_algorithm

    configs = []
    for trial in candidate_overrides(spec):
        try:
            # candidates are combinations to check, not runs: their warnings would describe trials that may never
            # be drawn (each trial that runs prints its own)
            configs.append(load_config(spec.base, spec.fixed + trial, warn=False))
        except UserError as exc:
            raise type(exc)(f"{exc} (with {' '.join(trial) or 'the base config'})") from None
    if spec.metric == "acc_global":
        for cfg in configs:
            if not get_algorithm(cfg.algorithm.name)(cfg).has_global_model:
                raise SweepError(f"sweep key 'metric': {cfg.algorithm.name} has no global model, so no acc_global; "
                                 f"use metric: acc_mean")
    if spec.scheduler["name"] in ("asha", "median"):
        rounds = min(cfg.rounds for cfg in configs)
        if spec.scheduler.get("grace_period", 1) > rounds:
            raise SweepError(f"sweep key 'scheduler.grace_period': {spec.scheduler['grace_period']} rounds, but "
                             f"trials run only {rounds}")
    return configs[0]


def check_cluster(spec: SweepSpec) -> None:
    """Refuse, before Tune starts, any trial that could never be placed (Tune would wait for it for ever)."""
    from raysim.engine.resources import check_resources

    for trial in candidate_overrides(spec):
        check_resources(load_config(spec.base, spec.fixed + trial).engine)
