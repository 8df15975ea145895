"""Config schema: defaults, YAML + overrides, extends, and one-line errors that name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raysim.config import ConfigError, load_config, to_flat_dict, to_yaml
from raysim.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_and_contract_keys_exist():
    cfg = load_config(None, [])
    flat = to_flat_dict(cfg)
    for key in ["seed", "rounds", "clients.num", "clients.fraction", "algorithm.name", "data.name", "model.name",
                "train.lr", "train.local_epochs", "train.batch_size", "engine.num_workers", "engine.cpus_per_worker",
                "engine.gpus_per_worker", "engine.address", "log.dir"]:
        assert key in flat, key


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("rounds: 7\ntrain:\n  lr: 0.3\n")
    cfg = load_config(f, ["train.lr=0.2", "clients.num=5", "model.name=[mlp,cnn,mlp,mlp,mlp]"])
    assert (cfg.rounds, cfg.train.lr, cfg.clients.num) == (7, 0.2, 5)
    assert cfg.model.for_client(1) == "cnn"


def test_extends_layers_files(tmp_path):
    (tmp_path / "base.yaml").write_text("rounds: 9\nseed: 3\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nseed: 4\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert (cfg.rounds, cfg.seed) == (9, 4)


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(None, ["rounds=3", "algorithm.name=partialavg"])
    (tmp_path / "c.yaml").write_text(to_yaml(cfg))
    assert load_config(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize("override, key", [
    (["trian.lr=0.1"], "trian"),
    (["train.lrate=0.1"], "train.lrate"),
    (["train.lr=fast"], "train.lr"),
    (["train.lr=-0.1"], "train.lr"),
    (["clients.fraction=1.5"], "clients.fraction"),
    (["clients.fraction=0"], "clients.fraction"),
    (["rounds=0"], "rounds"),
    (["engine.num_workers=0"], "engine.num_workers"),
    (["engine.on_nonfinite=ignore"], "engine.on_nonfinite"),
    (["algorithm.name=nope"], "algorithm.name"),
    (["clients.num=3", "model.name=[mlp,cnn]"], "model.name"),
])
def test_bad_configs_name_the_key(override, key):
    with pytest.raises(UserError) as info:  # a ConfigError, or for an unknown name the registry's UserError
        load_config(None, override)
    message = str(info.value)
    assert message.startswith(f"config key '{key}'") and "\n" not in message, message


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.slow
def test_cli_config_error_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(ROOT / "experiments/smoke.yaml"),
                           "train.lr=-1", f"log.dir={tmp_path / 'r'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "train.lr" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_to_yaml_writes_what_omegaconf_writes_for_shipped_experiments():
    """One shipped experiment in eight (all 246 agreed when this was written) and the defaults."""
    from omegaconf import OmegaConf

    from raysim.catalog import experiment_names
    from raysim.config import to_yaml

    names = [n for n in experiment_names() if not n.startswith("sweeps/")][::8]
    for cfg in [load_config(n, warn=False) for n in names] + [load_config(None, [])]:
        assert to_yaml(cfg) == OmegaConf.to_yaml(OmegaConf.structured(cfg))
