"""Typed experiment configuration: dataclass schema -> OmegaConf (YAML + dotted overrides) -> validated object.

A config file holds only the keys that differ from the defaults below. ``extends: other.yaml`` (relative to the
file) layers a file on top of another, so CPU-sized siblings of paper configs stay a few lines long.
Every mistake becomes a :class:`ConfigError` whose one-line message names the offending key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# the public names of raysim.config, from the modules that hold them: the schema (config_sections), loading and
# writing (config_loading) and the validation convention (validate)
from raysim.config_loading import (_read_yaml, _schema, algorithm_config_class, load_config, to_yaml,  # noqa: F401
                                   yaml_problem)
from raysim.config_sections import (PARTITIONS, AlgorithmConfig, ClientsConfig, DataConfig,  # noqa: F401
                                    EngineConfig, EvalConfig, ExperimentConfig, LogConfig, ModelConfig,
                                    TrainConfig, mlflow_uri, switched_on)
from raysim.validate import ConfigError, is_finite, is_whole, one_of, require  # noqa: F401


def flatten_dict(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{a: {b: 1}}`` -> ``{"a.b": 1}``: nested mappings (sweep files, run configs read back by reports), or nested
    dataclasses (an :class:`ExperimentConfig`), as dotted keys. Only nodes of the root's kind nest: a dict-valued
    field of a config dataclass stays one value."""
    if dataclasses.is_dataclass(tree):
        nested: Any = dataclasses.is_dataclass
        items = [(f.name, getattr(tree, f.name)) for f in dataclasses.fields(tree)]
    else:
        nested, items = (lambda v: isinstance(v, dict)), list(tree.items())
    out: dict[str, Any] = {}
    for key, value in items:
        if nested(value):
            out.update(flatten_dict(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out



def to_flat_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Dotted-key view of the config (for comparing runs and for TensorBoard's HParams)."""
    return flatten_dict(cfg)
