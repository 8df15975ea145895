"""Multi-node correctness with no shared disk, on a 3-node ``ray.cluster_utils.Cluster`` (tests/multinode_cluster.py,
in a process of its own): a run; seeds through Ray Tune whose nodes are lost, then resumed on other nodes; a run
that loses a node. Every file stays on the launch node; plugins reach the nodes through the runtime environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import strip_timing

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster_findings(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("multinode") / "found.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    env["PYTHONPATH"] = str(ROOT)  # raysim for every node; the plugin deliberately not
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "multinode_cluster.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=420, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _rounds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "workers_replaced"} for r in strip_timing(rows)]


def test_only_the_launch_node_reaches_the_run_directories(cluster_findings):
    found = cluster_findings
    assert found["probe"] == ["wrote", "refused"]  # the simulated missing disk is in force on the other nodes
    assert found["violations"] == []  # and no process there ever tried to reach a run directory
    files = set(found["files"])
    for run in ("run", "lossy", "seeds/seed-0", "seeds/seed-1"):
        assert {f"{run}/metrics.jsonl", f"{run}/config.yaml", f"{run}/checkpoint/server.pt"} <= files, run
        assert any(f.startswith(f"{run}/events.out.tfevents") for f in files), run
    assert {"seeds/results.csv", "seeds/results.md"} <= files


def test_a_run_and_seeds_through_tune_on_three_nodes(cluster_findings):
    found = cluster_findings
    assert [r["round"] for r in found["run"]] == [1, 2, 3]
    # the plugin algorithm ran on the nodes (shipped by py_modules), and a Tune trial computes what a run does,
    # with 1 worker as with 2
    assert found["seeds"] == ["done", "done"]
    assert _rounds(found["seed0"]) == _rounds(found["run"])


def test_trials_whose_nodes_are_lost_continue_from_their_checkpoints_on_other_nodes(cluster_findings):
    found = cluster_findings
    assert "done" not in found["seeds_lost"]  # the loss ended both trials after round 1
    assert not set(found["trial_nodes"]) & set(found["fresh_nodes"])  # resumed on nodes that were not there
    # round 1 was not run again (its row, wall time included, is the first attempt's), and the rest matches
    assert found["first_rows_kept"]
    assert _rounds(found["seed0"]) == _rounds(found["run"])


def test_a_run_that_loses_a_node_finishes_with_the_same_metrics(cluster_findings):
    found = cluster_findings
    assert len(found["lost"]) == 1 and found["lost"][0] != found["launch"]
    assert found["lossy"][1].get("workers_replaced", 0) >= 1  # the loss hit round 2
    assert _rounds(found["lossy"]) == _rounds(found["run"])
