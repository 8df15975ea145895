"""Helpers the tests share: a tiny experiment (as a mapping and as overrides), reading a run's metrics, and the
check that the CLI refuses a config the way a user sees it. ``conftest.py`` re-exports them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGINS = ROOT / "examples" / "plugins"


# the same tiny experiment as a config mapping (for YAML files written by tests)
TINY = {
    "name": "tiny", "rounds": 2,
    "clients": {"num": 4},
    "data": {"name": "sklearn_digits", "partition": "iid"},
    "model": {"name": "mlp", "hidden": [32], "feature_dim": 16},
    "train": {"lr": 0.1, "batch_size": 32},
    "engine": {"num_workers": 1},
}


def tiny_overrides(tmp_path: Path, **extra: object) -> list[str]:
    """A small, fast experiment on scikit-learn's digits; extra keys as dotted overrides (a__b -> a.b).

    One worker, since each worker is a process that imports torch; tests about several workers ask for them."""
    base = {
        "name": "t", "rounds": 2, "clients.num": 4, "data.name": "sklearn_digits", "data.partition": "iid",
        "model.name": "mlp", "model.hidden": "[32]", "model.feature_dim": 16, "train.lr": 0.1,
        "train.batch_size": 32, "engine.num_workers": 1, "log.dir": str(tmp_path / "run"),
    }
    base.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def strip_timing(rows: list[dict]) -> list[dict]:
    """Metrics minus wall-clock times, for comparing runs."""
    return [{k: v for k, v in r.items() if not k.startswith("wall_s")} for r in rows]


def refused_config(key: str, *args: str) -> subprocess.CompletedProcess:
    """``raysim run ARGS`` in a fresh process, which must refuse the config the way a user sees it: exit 2, one
    stderr line ``raysim: error: config key 'KEY'...``, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"raysim: error: config key '{key}'"), proc.stderr
    return proc
