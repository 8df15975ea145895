"""The curriculum study's sweeps (experiments/sweeps/study-*.yaml, docs/curriculum-study.md) run end to end as
their smoke check: one sample, two rounds, on a tiny slice of their data (issue 18's acceptance)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from raysim.cli import main
from raysim.tune import load_sweep

SWEEPS = Path(__file__).parents[2] / "experiments" / "sweeps"
STUDY = sorted(SWEEPS.glob("study-*.yaml"))
TINY_DATA = {  # the smallest data each sweep's base accepts; everything searched stays searched
    "study-unideal-niid1": ["data.samples_per_domain=60", "model.width=4", "scheduler.grace_period=1"],
    "study-unideal-scale": ["data.samples_per_domain=60", "model.width=4", "seed=0",  # the grid: one cell
                            "algorithm.schedule.shape=linear"],
    "study-fapd": ["algorithm.teacher.epochs=2", "scheduler.grace_period=1"],
}


def test_every_study_sweep_has_a_smoke_check():
    assert sorted(p.stem for p in STUDY) == sorted(TINY_DATA)


@pytest.mark.parametrize("sweep", STUDY, ids=lambda p: p.stem)
def test_study_sweep_runs_one_sample_for_two_rounds(ray_cluster, tmp_path, sweep):
    out = tmp_path / "sw"
    args = ["num_samples=1", "rounds=2", f"dir={out}", *TINY_DATA[sweep.stem]]
    spec = load_sweep(sweep, args)
    assert main(["tune", str(sweep), *args, "--quiet"]) == 0
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == spec.total_trials()
    for row in rows:
        assert row["status"] == "done" and row["rounds"] == "2/2", row
        assert 0.0 < float(row[f"best_{spec.metric}"]) <= 1.0
    for key in spec.space:  # every searched key is a column of the table, with a value per trial
        assert all(row[key] != "" for row in rows), key
    assert (out / "best.yaml").is_file()
    assert f"; {len(rows)} trial{'s' if len(rows) != 1 else ''}; run directories" in (out / "results.md").read_text()
