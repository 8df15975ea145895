"""Checking a sweep before it runs: every candidate config loads, the metric exists, the cluster can place trials."""

from __future__ import annotations

import json
from typing import Any, Optional

from raysim.config import ExperimentConfig, load_config
from raysim.errors import UserError
from raysim.tune.spec import SweepError, SweepSpec


def candidate_overrides(spec: SweepSpec) -> list[list[str]]:
    """Trial overrides that together touch every searched value (and both ends of every range)."""
    values = {}
    for key, dist in spec.space.items():
        kind, args = next(iter(dist.items()))
        values[key] = [args[0], args[1] - 1] if kind == "randint" else args  # randint's high is exclusive
        if key == "seed" and len(args) > 2 and all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            values[key] = [min(args), max(args)]  # seeds differ only in number: both ends stand for all (--seeds)
    first = {key: vals[0] for key, vals in values.items()}
    out = [[_override(k, v) for k, v in first.items()]]
    for key, vals in values.items():
        for value in vals[1:]:
            out.append([_override(k, value if k == key else v) for k, v in first.items()])
    return out


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML: strings stay strings, lists stay lists


def candidate_configs(spec: SweepSpec) -> list[ExperimentConfig]:
    """Every candidate combination's config (bad keys and values fail here, naming the key and the combination).

    Candidates are combinations to check, not runs: they are loaded without their config warnings, which would
    describe trials that may never be drawn (each trial that runs prints its own)."""
    configs = []
    for trial in candidate_overrides(spec):
        try:
            configs.append(load_config(spec.base, spec.fixed + trial, warn=False))
        except UserError as exc:
            raise type(exc)(f"{exc} (with {' '.join(trial) or 'the base config'})") from None
    return configs


def validate_sweep(spec: SweepSpec, configs: Optional[list[ExperimentConfig]] = None) -> ExperimentConfig:
    """Load every candidate config (``configs``, when already loaded by :func:`candidate_configs`), check the metric
    exists and the scheduler's grace period fits the rounds.

    Returns the first candidate's config; resources are checked by :func:`check_cluster` once Ray is up.
    """
    from raysim.registry import get_algorithm

    configs = configs or candidate_configs(spec)
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


def check_cluster(spec: SweepSpec, configs: Optional[list[ExperimentConfig]] = None) -> None:
    """Refuse, before Tune starts, any trial that could never be placed (Tune would wait for it for ever)."""
    from raysim.engine.resources import check_resources

    for cfg in configs or candidate_configs(spec):
        check_resources(cfg.engine)
