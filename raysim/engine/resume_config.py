"""The config of an existing run, for ``--resume``: read without the engine (no torch), so that a wrong override
fails before anything slow is imported."""

from __future__ import annotations

from pathlib import Path

import yaml

from raysim.config import ExperimentConfig, load_config
from raysim.errors import UserError


def load_resume_config(run_dir: Path, overrides: list[str]) -> ExperimentConfig:
    """The config of an existing run, with engine/log/rounds overrides allowed."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise UserError(f"{run_dir} is not a raysim run directory (no config.yaml)")
    try:
        base = yaml.safe_load(path.read_bytes())
    except (yaml.YAMLError, OSError, ValueError) as exc:
        from raysim.config import yaml_problem

        raise UserError(f"{path} is damaged: not valid YAML ({yaml_problem(exc, path.read_text(errors='replace'))}); "
                        f"restore it to resume") from None
    if not isinstance(base, dict):
        what = "empty" if base is None else f"a YAML {type(base).__name__}, not a mapping of config keys"
        raise UserError(f"{path} is damaged: {what}; restore it to resume")
    data = base.get("data") if isinstance(base, dict) else None
    if isinstance(data, dict) and "test_split" not in data:
        data["test_split"] = "pooled"  # a run made before data.test_split existed pooled train and test: keep it so
    if isinstance(data, dict) and "classes_per_client" not in data and data.get("partition") in ("iid", "dirichlet"):
        data["partition"] = f"legacy_{data['partition']}"  # made before Flower's partitions: keep raysim's own split
    return load_config(None, overrides, base=base)
