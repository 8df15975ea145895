"""What `pip install raysim` gives outside a clone: the shipped experiments as package data, found by name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT


def test_package_list_names_every_package_and_the_experiments():
    """pyproject.toml lists packages by hand (the experiments are mapped into raysim/experiments/): a new
    subpackage missing from the list would be missing from the wheel."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "raysim").rglob("__init__.py")}
    assert set(config["packages"]) == on_disk | {"raysim.experiments"}
    assert config["package-dir"] == {"raysim.experiments": "experiments"}


def test_extras_say_what_they_bring():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert {"optuna", "mlflow", "wandb", "dev", "test", "all"} <= set(extras)
    core = " ".join(project["dependencies"])
    for optional in ("optuna", "mlflow", "wandb", "ruff", "mypy"):
        assert optional not in core
    ray = next(d for d in project["dependencies"] if d.startswith("ray["))
    assert re.search(r"<2\.\d+$", ray), "Ray capped at the minor versions raysim is tested with"
    readme = (ROOT / "README.md").read_text()
    reference = (ROOT / "docs" / "reference.md").read_text()  # the README's reference material, linked from it
    for extra in ("optuna", "mlflow", "wandb", "dev", "test", "all"):
        assert f"`{extra}`" in readme, f"the README names the {extra} extra"
        assert f"| `{extra}` |" in reference, f"docs/reference.md says what the {extra} extra brings"


@pytest.mark.slow
def test_wheel_in_a_new_venv_runs_a_shipped_experiment_by_name(tmp_path):
    """The built wheel, installed into a new virtual environment (its dependencies borrowed from this one), runs
    `raysim run smoke` from an empty directory and lists the shipped experiments. The smoke demo itself must look
    healthy to a newcomer: it once ended at acc_mean 0.24 after its 3 rounds."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("raysim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "raysim/experiments/smoke.yaml" in names and "raysim/experiments/sweeps/smoke-lr.yaml" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # not raysim itself
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300)

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    where = subprocess.run([str(python), "-c", "import raysim; print(raysim.__file__)"], capture_output=True,
                           text=True, check=True, cwd=empty, env=env).stdout
    assert where.startswith(str(venv)), where
    listed = subprocess.run([str(venv / "bin" / "raysim"), "list", "experiments"], capture_output=True, text=True,
                            check=True, cwd=empty, env=env, timeout=120).stdout
    assert re.search(r"^smoke\s", listed, re.M) and re.search(r"^unideal/digits-niid1-cpu/unideal\s", listed, re.M)
    done = subprocess.run([str(venv / "bin" / "raysim"), "run", "smoke", "engine.address=local", "--quiet"],
                          capture_output=True, text=True, cwd=empty, env=env, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (empty / "runs").glob("smoke-*")
    assert (run_dir / "metrics.jsonl").is_file()
    final = float(re.search(r"final acc_mean\s+([0-9.]+)", done.stdout).group(1))
    assert final >= 0.8, done.stdout


@pytest.mark.slow
def test_every_shipped_experiment_loads_by_name():
    """Every file under experiments/ is a valid config (or sweep) reachable by its name (imports every algorithm)."""
    from raysim.catalog import experiment_names
    from raysim.config import load_config
    from raysim.tune import load_sweep

    names = experiment_names()
    assert len(names) > 100 and "leaf/femnist-fedavg" in names and "leaf/shakespeare-fedavg" in names
    for name in names:
        if name.startswith("sweeps/"):
            assert load_sweep(name).base
        else:
            load_config(name, warn=False)
