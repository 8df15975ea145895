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
    check_named_plugins(run_dir, base)  # before load_config imports them
    return load_config(None, overrides, base=base)


def saved_mapping(run_dir: Path) -> dict:
    """``config.yaml`` as plain YAML (``{}`` when it is not a mapping: loading it then says what is wrong)."""
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_bytes())
    except (yaml.YAMLError, OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def check_named_plugins(run_dir: Path, saved: dict) -> None:
    """A run directory's ``config.yaml`` (``saved``) may name ``plugins:``, modules that loading the config imports:
    they are imported only when the run's checkpoint, verified against the digest of its own content, records the
    same list (the config it was made with). An edited ``config.yaml``, a run with no checkpoint, or one older than
    that record, is refused in one line before anything is imported. (torch, which reads the checkpoint, is imported
    only for a run that names plugins.)"""
    named = saved.get("plugins")
    if not named:
        return
    from raysim.engine.state import has_checkpoint, read_checkpoint, server_file

    path = run_dir / "config.yaml"
    shown = ", ".join(map(str, named)) if isinstance(named, list) else repr(named)
    if not has_checkpoint(run_dir):
        raise UserError(f"{path} names plugins ({shown}), and {run_dir} holds no checkpoint that records them "
                        f"(expected {server_file(run_dir)}): raysim imports only the plugins a run's checkpoint "
                        f"was made with; start a new run with your own config")
    ckpt = read_checkpoint(run_dir)  # its own digest checked: a damaged or edited one is refused here
    made = ckpt.get("config")
    if not isinstance(made, dict):
        raise UserError(f"{path} names plugins ({shown}), and {server_file(run_dir)} predates raysim's record of "
                        f"the config a checkpoint was made with, so nothing vouches for them: raysim imports only "
                        f"the plugins a run's checkpoint records; start a new run with your own config")
    recorded = made.get("plugins") or []
    if named != recorded:
        raise UserError(f"{path} names plugins ({shown}) other than the ones {server_file(run_dir)} was made with "
                        f"({', '.join(map(str, recorded)) or 'none'}): config.yaml was changed since, and raysim "
                        f"imports only the plugins a run's checkpoint records; restore config.yaml")
