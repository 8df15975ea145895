"""Trials and seeds at the machine's throughput (issue 57): a one-worker trial runs in its own Tune process, which Tune
reuses for the next trial; a seed set runs its seeds in a few processes at once. Whatever ran before in a process,
every run's numbers are those of the same config run alone in a fresh ``raysim run``."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import ROOT, read_rows, strip_timing
from raysim.cli import main
from test_tune import write_sweep


def _fresh_run(run_dir: Path, out: Path) -> list[dict]:
    """``raysim run`` of a trial's config in a fresh interpreter (in process), the reference for warm runs."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests" / "plugins"),
                                                                    os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(run_dir / "config.yaml"), f"log.dir={out}",
                    "engine.backend=inline", "--quiet"], check=True, cwd=ROOT, env=env, capture_output=True)
    return strip_timing(read_rows(out))


def _trial_pids(sweep_dir: Path) -> dict[str, set[int]]:
    """Each trial's process ids, from the results Tune recorded (``pid`` in every result.json row)."""
    return {d.name: {json.loads(line)["pid"] for line in (d / "result.json").read_text().splitlines()}
            for d in (sweep_dir / "tune").iterdir() if (d / "result.json").is_file()}


def _actors(class_name: str) -> list[dict]:
    """The session Ray's actors of ``class_name`` (Tune's trials: ``ImplicitFunc``), ended ones included."""
    import ray

    return [a for a in ray._private.state.actors().values()
            if str(a.get("ActorClassName")).rpartition(".")[2] == class_name]


def test_two_trials_in_one_reused_process_equal_fresh_runs(ray_cluster, tmp_path):
    """One trial at a time: Tune hands the second trial the first one's process, where both runs ran whole (no
    ClientWorker was started); the second reused the first's dataset (same data config). Each trial's rows equal
    a fresh ``raysim run`` of its config."""
    workers_before = len(_actors("ClientWorker"))
    sweep = write_sweep(tmp_path, max_concurrent=1, space={"train.lr": {"grid": [0.3, 0.02]}})
    out = tmp_path / "sw"
    assert main(["tune", str(sweep), f"dir={out}", "--quiet"]) == 0
    assert len(_actors("ClientWorker")) == workers_before  # both runs in their trial's own process
    pids = _trial_pids(out)
    assert len(pids) == 2 and len(set.union(*pids.values())) == 1, pids  # one process ran both trials
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert all(r["status"] == "done" for r in rows)
    for r in rows:
        run_dir = Path(r["run_dir"])
        assert strip_timing(read_rows(run_dir)) == _fresh_run(run_dir, tmp_path / "fresh" / run_dir.name), r


def test_a_trial_whose_process_dies_is_restarted_from_its_checkpoint(ray_cluster, tmp_path):
    """The trial's process is its run's only worker: killed in round 2 (SIGKILL, as the OOM killer would), Tune
    restarts the trial in another process, which continues from round 1's checkpoint to an undisturbed run's
    numbers."""
    gate, reached = tmp_path / "go", tmp_path / "held"
    sweep = write_sweep(tmp_path, space={"train.lr": {"grid": [0.3]}},
                        fixed={"plugins": ["held"], "algorithm.name": "held_fedavg", "algorithm.hold_round": 2,
                               "algorithm.hold_until": str(gate), "algorithm.hold_reached": str(reached)})
    out, code = tmp_path / "sw", []
    sweep_thread = threading.Thread(target=lambda: code.append(main(["tune", str(sweep), f"dir={out}", "rounds=3",
                                                                     "--quiet"])))
    sweep_thread.start()
    try:
        deadline = time.monotonic() + 120
        while not reached.exists() and time.monotonic() < deadline and sweep_thread.is_alive():
            time.sleep(0.05)
        assert reached.exists(), "the trial never reached its held round"
        trial = [a for a in _actors("ImplicitFunc") if a["State"] == "ALIVE"]
        assert len(trial) == 1, trial
        os.kill(trial[0]["Pid"], signal.SIGKILL)
    finally:
        gate.touch()
        sweep_thread.join(300)
    assert code == [0]
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["status"], r["rounds"]) for r in rows] == [("done", "3/3")]
    assert [p.read_text().count("Failure #") for p in (out / "tune").glob("*/error.txt")] == [1]  # restarted once
    run_dir = Path(rows[0]["run_dir"])
    assert strip_timing(read_rows(run_dir)) == _fresh_run(run_dir, tmp_path / "fresh")
