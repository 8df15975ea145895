"""raysim tune: a real two-trial sweep on the session's 2-CPU Ray, fail-fast resource checks, sweep-file parsing."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

import raysim
from raysim.cli import main
from raysim.config import load_config
from raysim.errors import UserError
from raysim.tune import (SweepError, candidate_overrides, load_sweep, parse_seeds,
                         trial_bundles)
from conftest import TINY, read_rows, tiny_overrides


def write_sweep(tmp_path: Path, **sweep: object) -> Path:
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    body = {"base": "exp.yaml", "metric": "acc_mean", "mode": "max", "num_samples": 1,
            "space": {"train.lr": {"grid": [0.02, 0.3]}}}
    body.update(sweep)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_two_trial_sweep_writes_table_best_config_and_hparams(ray_cluster, tmp_path, capsys):
    from raysim.engine import pool

    # a run on two Ray workers first: inside the session's warm_workers() they stay, holding both of its CPUs, and
    # the sweep must end them before its trials ask for CPUs (else the trials would wait for ever)
    raysim.run(None, *tiny_overrides(tmp_path / "before", engine__backend="ray", engine__num_workers=2))
    assert len(pool._warm["idle"]) == 2
    sweep = write_sweep(tmp_path)
    out = tmp_path / "sw"
    assert main(["tune", str(sweep), f"dir={out}", "--quiet"]) == 0
    assert pool._warm["idle"] == []
    printed = capsys.readouterr().out
    assert "2/2 trials done" in printed and "best acc_mean" in printed

    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2
    assert sorted(float(r["train.lr"]) for r in rows) == [0.02, 0.3]
    assert all(r["status"] == "done" and r["rounds"] == "2/2" for r in rows)
    best_values = [float(r["best_acc_mean"]) for r in rows]
    assert best_values == sorted(best_values, reverse=True)  # best first
    for r in rows:  # each trial is an ordinary raysim run directory inside the sweep directory
        run_dir = Path(r["run_dir"])
        assert run_dir.parent == out / "trials"
        metrics = read_rows(run_dir)
        assert [m["round"] for m in metrics] == [1, 2]
        assert float(r["best_acc_mean"]) == pytest.approx(max(m["acc_mean"] for m in metrics))
        assert load_config(run_dir / "config.yaml").train.lr == pytest.approx(float(r["train.lr"]))
        assert list(run_dir.glob("events.out.tfevents.*.hparams")), "HParams for TensorBoard's comparison view"
    md = (out / "results.md").read_text()
    assert "| trial" in md and "best_acc_mean" in md

    best = load_config(out / "best.yaml")  # ready to run: a valid config with no run directory of its own
    assert best.log.dir is None
    assert best.train.lr == pytest.approx(float(rows[0]["train.lr"]))
    assert best.rounds == 2 and best.engine.num_workers == 1

    # resuming a finished sweep restores Tune's state and rewrites the same table
    assert main(["tune", "--resume", str(out), "--quiet"]) == 0
    again = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["trial"], r["best_acc_mean"], r["status"]) for r in again] == \
        [(r["trial"], r["best_acc_mean"], r["status"]) for r in rows]


def test_sweep_asking_for_a_gpu_fails_fast(ray_cluster, tmp_path, capsys):
    sweep = write_sweep(tmp_path, fixed={"engine.gpus_per_worker": 1})
    assert main(["tune", str(sweep), f"dir={tmp_path / 'sw'}"]) == 2  # refused before Tune starts (no wait)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpus_per_worker" in err[0] and "no GPU" in err[0]
    assert not (tmp_path / "sw" / "tune").exists()


def test_sweep_needing_more_cpus_than_the_cluster_fails_fast(ray_cluster, tmp_path, capsys):
    sweep = write_sweep(tmp_path, space={"engine.num_workers": {"choice": [1, 3]}})
    assert main(["tune", str(sweep), f"dir={tmp_path / 'sw'}"]) == 2
    assert "engine.num_workers" in capsys.readouterr().err


def test_sweep_file_errors_name_the_key(tmp_path):
    with pytest.raises(SweepError, match="sweep key 'bogus'"):
        load_sweep(write_sweep(tmp_path, bogus=1))
    with pytest.raises(SweepError, match="space.train.lr"):
        load_sweep(write_sweep(tmp_path, space={"train.lr": [0.1, 0.2]}))
    with pytest.raises(SweepError, match="loguniform needs low > 0"):
        load_sweep(write_sweep(tmp_path, space={"train.lr": {"loguniform": [0, 1]}}))
    with pytest.raises(SweepError, match="scheduler.name"):
        load_sweep(write_sweep(tmp_path, scheduler="pbt"))
    with pytest.raises(SweepError, match="'base'"):
        load_sweep(write_sweep(tmp_path, base="missing.yaml"))


def test_unknown_or_invalid_searched_keys_fail_before_ray(tmp_path, capsys):
    assert main(["tune", str(write_sweep(tmp_path, space={"train.lrr": {"choice": [0.1]}}))]) == 2
    assert "train.lrr" in capsys.readouterr().err
    # every value of a choice is checked, not just the first
    assert main(["tune", str(write_sweep(tmp_path, space={"train.lr": {"choice": [0.1, -1.0]}}))]) == 2
    assert "train.lr" in capsys.readouterr().err
    # acc_global needs a global model: `local` has none
    assert main(["tune", str(write_sweep(tmp_path, metric="acc_global",
                                         fixed={"algorithm.name": "local"}))]) == 2
    assert "acc_global" in capsys.readouterr().err


def test_overrides_split_between_sweep_and_experiment(tmp_path):
    path = write_sweep(tmp_path, space={"train.lr": {"loguniform": [0.01, 0.5]},
                                        "train": {"momentum": {"uniform": [0.0, 0.9]}}})
    spec = load_sweep(path, ["num_samples=3", "scheduler.name=asha", "scheduler.grace_period=1", "rounds=4",
                             "train.momentum=0.5"])
    assert spec.num_samples == 3 and spec.scheduler == {"name": "asha", "grace_period": 1}
    assert "rounds=4" in spec.fixed
    assert set(spec.space) == {"train.lr"}  # a command-line value fixes a searched key
    assert spec.total_trials() == 3
    # ASHA's settings may stay in the file when the command line asks for fifo
    assert load_sweep(path, ["scheduler.name=asha", "scheduler.grace_period=2", "scheduler.name=fifo"]) \
        .scheduler["name"] == "fifo"
    grid = load_sweep(write_sweep(tmp_path, num_samples=2, space={"seed": {"grid": [0, 1, 2]},
                                                                  "train.lr": {"choice": [0.1, 0.2]}}))
    assert grid.total_trials() == 6
    # validation touches every value and both ends of every range
    cands = candidate_overrides(load_sweep(write_sweep(tmp_path, space={"train.batch_size": {"randint": [8, 64]},
                                                                        "train.lr": {"choice": [0.1, 0.2]}})))
    assert ["train.batch_size=8", "train.lr=0.1"] in cands and ["train.batch_size=63", "train.lr=0.1"] in cands
    assert ["train.batch_size=8", "train.lr=0.2"] in cands


def test_trial_bundles_reserve_driver_and_workers():
    cfg = load_config(None, ["engine.num_workers=3", "engine.cpus_per_worker=2", "engine.gpus_per_worker=0.5"])
    assert trial_bundles(cfg.engine) == [{}] + [{"CPU": 2.0, "GPU": 0.5}] * 3
    cfg = load_config(None, ["engine.num_workers=1", "engine.driver_cpus=1"])
    assert trial_bundles(cfg.engine) == [{"CPU": 1.0}, {"CPU": 1.0}]


def test_resume_needs_a_sweep_directory(tmp_path, capsys):
    assert main(["tune", "--resume", str(tmp_path)]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


def test_parse_seeds():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,3,5") == [0, 3, 5]
    assert parse_seeds("0-2,10, 1") == [0, 1, 2, 10]
    for bad in ("3-1", "a", "", "-1"):
        with pytest.raises(UserError):
            parse_seeds(bad)


@pytest.mark.parametrize("sweep", sorted((Path(__file__).parents[2] / "experiments" / "sweeps").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_example_sweeps_are_valid(sweep):
    """Every searched key exists and every searched value is accepted."""
    from raysim.tune import validate_sweep

    spec = load_sweep(sweep)
    validate_sweep(spec)
    assert spec.total_trials() >= 1
