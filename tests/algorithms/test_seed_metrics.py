"""The metrics the seeds report, from a real run: acc_weighted, client_metrics.jsonl, UNIDEAL's p, and the t-SNE of a
run's test features (FAPD's Fig. 4). FedAvg's acc_weighted = acc_global, determinism over worker counts and resume of
client_metrics.jsonl are checked in test_engine.py and test_crash_safety.py, on runs those tests make anyway."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import read_rows
from raysim.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def client_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "client_metrics.jsonl").read_text().splitlines()]


def test_acc_weighted_and_client_metrics_of_every_evaluated_round(unideal_run):
    rows, clients = read_rows(unideal_run), client_rows(unideal_run)
    assert rows[0]["acc_weighted"] is None and rows[0]["acc_mean"] is None  # round 1: no evaluation
    assert [c["round"] for c in clients] == [2]  # only evaluated rounds have a line
    last, c = rows[1], clients[0]
    assert "acc_global" not in last  # UNIDEAL holds no global model; acc_weighted is there all the same
    assert c["client"] == [0, 1, 2, 3] and all(t > 0 for t in c["total"])
    assert c["acc"] == [n / t for n, t in zip(c["correct"], c["total"])]
    assert last["acc_weighted"] == sum(c["correct"]) / sum(c["total"])
    assert last["acc_mean"] == pytest.approx(float(np.mean(c["acc"])), abs=1e-15)
    # UNIDEAL's curriculum fraction, every round: one local epoch counts as the last (p = end = 1)
    assert [r["p"] for r in rows] == [1.0, 1.0]


def test_tsne_of_a_runs_test_features(unideal_run, tmp_path, capsys):
    out = tmp_path / "tsne"
    assert main(["report", "--tsne", str(unideal_run), "--out", str(out), "--tsne-max", "60"]) == 0
    assert "tsne.png" in capsys.readouterr().out
    exported = np.load(out / "features.npz")
    c = client_rows(unideal_run)[-1]
    # every client's test samples, through its own evaluation model, at the checkpointed (last) round
    assert exported["features"].shape == (sum(c["total"]), 16) and int(exported["round"]) == 2
    assert sorted(set(exported["clients"].tolist())) == c["client"]
    assert np.isfinite(exported["features"]).all()
    # the rebuilt evaluation models predict exactly what the run's evaluation counted
    hits = exported["predicted"] == exported["labels"]
    assert [int(hits[exported["clients"] == cid].sum()) for cid in c["client"]] == c["correct"]
    with open(out / "tsne.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) <= 60 and len(rows) >= 50 and set(rows[0]) == {"x", "y", "label", "client"}
    assert len({r["label"] for r in rows}) == 10  # the subset keeps every class
    assert (out / "tsne.png").read_bytes()[:8] == PNG_SIGNATURE


def test_tsne_of_something_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main(["report", "--tsne", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raysim: error: --tsne:") and err.count("\n") == 1
    assert main(["report"]) == 2
    assert "report needs RUN_DIR" in capsys.readouterr().err
