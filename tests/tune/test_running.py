"""Running a sweep when the disk under Ray Tune's own state fills up: Tune only logs its failed saves and runs on;
raysim stops the sweep in one line (exit 3), and ``--resume`` finishes it once space is freed.

tests/plugins/full_disk.py makes Tune's copies of its state into ``SWEEP_DIR/tune`` fail as pyarrow's writes do on
a full disk, while ``SWEEP_DIR/FULL_DISK`` holds ``tune``."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY, read_rows, strip_timing
from raysim.cli import main
from raysim.config import load_config
from raysim.engine.runner import run_experiment

pytestmark = pytest.mark.slow


def test_a_full_disk_under_tunes_own_state_stops_the_sweep_and_resume_continues(ray_cluster, tmp_path, capsys):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({**TINY, "plugins": ["full_disk"]}))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({
        "base": "exp.yaml", "metric": "acc_mean", "mode": "max", "num_samples": 1, "max_concurrent": 1,
        "space": {"train.lr": {"grid": [0.02, 0.3]}}}))
    out = tmp_path / "sw"
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # the session's PYTHONPATH has tests/plugins
    proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", "tune", str(tmp_path / "sweep.yaml"), f"dir={out}",
                             "rounds=3", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    try:
        deadline, seen = time.monotonic() + 300, []
        while time.monotonic() < deadline:  # the first trial ended with Tune's state saved; then the disk fills
            line = proc.stdout.readline()
            seen.append(line)
            if not line or "1/2 trials done" in line:
                break
        assert "1/2 trials done" in seen[-1], "".join(seen)
        (out / "FULL_DISK").write_text("tune")
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "Last sync command failed" not in err, err
    stops = [line for line in err.splitlines() if line.startswith("raysim:")]
    assert len(stops) == 1, err
    assert stops[0].startswith(f"raysim: stopped: cannot write Ray Tune's state in {out / 'tune'}: ")
    assert "No space left on device" in stops[0] and stops[0].endswith(f"resume with: raysim tune --resume {out}")

    (out / "FULL_DISK").unlink()  # space freed
    assert main(["tune", "--resume", str(out), "--quiet"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert sorted(r["train.lr"] for r in rows) == ["0.02", "0.3"]
    assert all(r["status"] == "done" and r["rounds"] == "3/3" for r in rows), rows
    for r in rows:  # each as an undisturbed run of its config
        run_dir = Path(r["run_dir"])
        plain = load_config(run_dir / "config.yaml", [f"log.dir={tmp_path / r['train.lr']}", "engine.backend=inline"])
        assert strip_timing(read_rows(run_dir)) == strip_timing(run_experiment(plain)[1])
