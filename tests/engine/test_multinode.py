"""Multi-node correctness with no shared disk, on a 3-node ``ray.cluster_utils.Cluster`` (tests/multinode_cluster.py,
in a process of its own): a run; seeds through Ray Tune whose nodes are lost, restarted by Tune on other nodes; a
run that loses a node between rounds; a run whose clients keep state and that loses every worker's node mid-round.
Every file stays on the launch node; plugins reach the nodes through the runtime environment.

The cluster script runs only the parts the selected tests need (``pytest -k stateful`` starts the cluster for the
stateful run alone)."""

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

# which parts of tests/multinode_cluster.py each test reads
PARTS = {
    "test_only_the_launch_node_reaches_the_run_directories": ("run", "healing", "lossy", "stateful"),
    "test_a_run_and_seeds_through_tune_on_three_nodes": ("run", "healing"),
    "test_trials_whose_nodes_are_lost_are_restarted_by_tune_from_their_checkpoints": ("run", "healing"),
    "test_a_run_that_loses_a_node_finishes_with_the_same_metrics": ("run", "lossy"),
    "test_stateful_run_survives_losing_every_workers_node_mid_round": ("stateful",),
}


@pytest.fixture(scope="module")
def cluster_findings(request, tmp_path_factory) -> dict:
    module = request.node.module
    parts = sorted({p for item in request.session.items if item.module is module
                    for p in PARTS.get(item.originalname, ())})
    out = tmp_path_factory.mktemp("multinode") / "found.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    env["PYTHONPATH"] = str(ROOT)  # raysim for every node; the plugin deliberately not
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "multinode_cluster.py"), str(out), *parts],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _rounds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "workers_replaced"} for r in strip_timing(rows)]


def test_only_the_launch_node_reaches_the_run_directories(cluster_findings):
    found = cluster_findings
    assert found["probe"] == ["wrote", "refused"]  # the simulated missing disk is in force on the other nodes
    assert found["violations"] == []  # and no process there ever tried to reach a run directory
    files = set(found["files"])
    for run in ("run", "lossy", "stateful", "seeds/seed-0", "seeds/seed-1"):
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


def test_trials_whose_nodes_are_lost_are_restarted_by_tune_from_their_checkpoints(cluster_findings):
    found = cluster_findings
    # no --resume: Tune restarted both trials (once each), on nodes that were not there before, and they finished
    assert found["seeds"] == ["done", "done"], found["seeds_lines"]
    assert found["tune_failures"] == [1, 1]  # Tune's record: each trial failed once (its node), then ended done
    assert not set(found["trial_nodes"]) & set(found["fresh_nodes"])
    # round 1 was not run again (its row, wall time included, is the first attempt's), and the rest matches
    assert found["first_rows_kept"]
    assert _rounds(found["seed0"]) == _rounds(found["run"])


def test_a_run_that_loses_a_node_finishes_with_the_same_metrics(cluster_findings):
    found = cluster_findings
    assert len(found["lost"]) == 1 and found["lost"][0] != found["launch"]
    assert found["lossy"][1].get("workers_replaced", 0) >= 1  # the loss hit round 2
    assert _rounds(found["lossy"]) == _rounds(found["run"])


def test_stateful_run_survives_losing_every_workers_node_mid_round(cluster_findings):
    """Round 2's clients trained, then every node that ran a worker went before aggregation and evaluation: the
    states they made there (~270 KB each, far above Ray's inline limit), read by evaluation and by round 3, and the
    server's history of uploads, read by server-side training, all outlive those nodes."""
    found = cluster_findings
    assert "stateful_error" not in found, found["stateful_error"]
    assert found["stateful_reached"] and found["stateful_lost"] == found["stateful_holding"]
    assert found["launch"] not in found["stateful_lost"]
    assert found["stateful"][1].get("workers_replaced", 0) >= 1  # the loss hit round 2
    assert [r["round"] for r in found["stateful"]] == [1, 2, 3]
    assert _rounds(found["stateful"]) == _rounds(found["stateful_plain"])
