"""raysim tune with Optuna's TPE (Ray Tune's OptunaSearch), other schedulers and any metrics.jsonl metric."""

from __future__ import annotations

import csv
import os
import signal

import pytest

import raysim
from raysim.tune import SweepError, _Progress, _scheduler, _searcher, load_sweep, read_state, run_sweep
from test_tune import write_sweep


def test_optuna_sweep_interrupted_and_resumed(ray_cluster, tmp_path, monkeypatch):
    """Ctrl-C after the first trial: raysim's record holds that trial with its values and final loss; --resume
    tells a new Optuna study that trial, runs only what is left of num_samples, keeps the first trial's values and
    finishes with every trial done."""
    sweep = write_sweep(tmp_path, num_samples=2, max_concurrent=1, metric="loss", mode="min",
                        search={"name": "optuna", "seed": 1, "startup_trials": 1},
                        space={"train.lr": {"loguniform": [0.01, 0.5]}})
    spec = load_sweep(sweep, ["rounds=1", f"dir={tmp_path / 'sw'}"])
    finished = _Progress.finished

    def finish_then_interrupt(self, trial, failed):
        finished(self, trial, failed)
        if len(self.done) == 1:  # trial ids that ended
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: Tune stops

    monkeypatch.setattr(_Progress, "finished", finish_then_interrupt)
    first = run_sweep(spec, quiet=True)
    monkeypatch.setattr(_Progress, "finished", finished)
    done = [r for r in first.rows if r["status"] == "done"]
    assert len(done) == 1 and len(first.rows) <= 2
    ended = [t for t in read_state(tmp_path / "sw").trials if t.status == "ended"]  # raysim's record, plain JSON
    assert len(ended) == 1 and ended[0].value is not None and ended[0].values["train.lr"] == done[0]["train.lr"]
    assert not list((tmp_path / "sw" / "tune").glob("searcher-state-*.pkl")), "no pickled searcher to restore"

    result = run_sweep(spec, sweep_dir=tmp_path / "sw", resume=True, quiet=True)
    rows = list(csv.DictReader(open(tmp_path / "sw" / "results.csv")))
    assert len(rows) == 2 and all(r["status"] == "done" for r in rows)
    assert done[0]["train.lr"] in [float(r["train.lr"]) for r in rows]
    assert result.best is not None and "best_loss" in rows[0]


WEAK = 1e-6  # a learning rate at which nothing is learnt


def test_a_scheduler_stops_the_weak_trial(ray_cluster, tmp_path):
    """A trial that learns (momentum 0.9) runs all its rounds; the one that cannot (lr 1e-6) is stopped early by
    ASHA, counting raysim's rounds (``time_attr="round"``).

    ASHA decides as results come, so the trials run one after the other (max_concurrent 1, in the grid's order):
    the weak one meets the recorded results of the strong one. Median stopping takes the same rounds from the same
    reports; that its settings reach Ray's MedianStoppingRule is checked without a sweep below. (Ray's HyperBand
    runs its first bracket to max_t without halving: with 4 trials of 2 rounds, both its brackets still ran every
    trial to the end, so it is not here.) Through the Python API: the table as a DataFrame, the best trial and its
    config."""
    from raysim.config import load_config

    scheduler, concurrent, lrs, rounds = {"name": "asha", "grace_period": 1, "reduction_factor": 2}, 1, [0.3, WEAK], 4
    sweep = write_sweep(tmp_path, max_concurrent=concurrent, scheduler=scheduler, fixed={"train.momentum": 0.9},
                        space={"train.lr": {"grid": lrs}})
    result = raysim.tune(sweep, f"dir={tmp_path / 'sw'}", f"rounds={rounds}")
    rows = {row["train.lr"]: row for row in result.trials.to_dict("records")}
    assert sorted(rows) == sorted(lrs)
    for lr in lrs[:-1]:
        assert (rows[lr]["status"], rows[lr]["rounds"]) == ("done", f"{rounds}/{rounds}"), rows
    assert rows[WEAK]["status"] == "stopped" and int(rows[WEAK]["rounds"].split("/")[0]) < rounds, rows
    assert result.best["train.lr"] != WEAK and result.best["status"] == "done"
    assert result.best_config == tmp_path / "sw" / "best.yaml"
    assert load_config(result.best_config).train.lr == result.best["train.lr"]


def test_schedulers_and_searchers_are_checked(tmp_path):
    sweep = write_sweep(tmp_path)
    assert type(_scheduler(load_sweep(sweep, ["scheduler.name=hyperband"]), 5)).__name__ == "HyperBandScheduler"
    median = _scheduler(load_sweep(sweep, ["scheduler.name=median", "scheduler.grace_period=2",
                                           "scheduler.min_samples_required=1"]), 5)
    assert type(median).__name__ == "MedianStoppingRule"
    assert (median._time_attr, median._grace_period, median._min_samples_required) == ("round", 2, 1)
    asha = _scheduler(load_sweep(sweep, ["scheduler.name=asha", "scheduler.reduction_factor=3"]), 5)
    assert (asha._time_attr, asha._max_t, asha._reduction_factor) == ("round", 5, 3)
    assert load_sweep(sweep, ["metric=bytes_up_total", "mode=min"]).metric == "bytes_up_total"
    assert load_sweep(sweep, ["metric=k"]).metric == "k"
    with pytest.raises(SweepError, match="search.name"):
        load_sweep(sweep, ["search.name=bayes"])
    with pytest.raises(SweepError, match="use choice instead of grid"):
        load_sweep(sweep, ["search.name=optuna"])  # the sweep's space is a grid
    with pytest.raises(SweepError, match="sweep key 'metric'"):
        load_sweep(sweep, ["metric=acc_mena"])


def test_seeded_random_search_draws_the_same_trials_every_time(tmp_path):
    """search: {name: random, seed: N} seeds Tune's random generator: a rerun of a study samples the same trials;
    another seed samples others; no seed keeps Tune's unseeded default."""
    from ray.tune.experiment import Experiment

    from raysim.tune.trials import _param_space

    def draw(search: dict) -> list[tuple]:
        spec = load_sweep(write_sweep(tmp_path, num_samples=4, search=search,
                                      space={"train.lr": {"loguniform": [0.01, 0.5]},
                                             "train.batch_size": {"choice": [8, 16, 32, 64]}}))
        generator = _searcher(spec)
        generator.add_configurations([Experiment("draw", lambda config: None, config=_param_space(spec),
                                                 num_samples=spec.num_samples)])
        return [(t.config["train.lr"], t.config["train.batch_size"]) for t in
                (generator.next_trial() for _ in range(spec.num_samples))]

    first = draw({"name": "random", "seed": 0})
    assert draw({"name": "random", "seed": 0}) == first
    assert draw({"name": "random", "seed": 1}) != first
    assert len(set(first)) == 4
    assert _searcher(load_sweep(write_sweep(tmp_path, search={"name": "random"}))) is None


def test_optuna_without_its_extra_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    import importlib.util

    from raysim.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else real(name, *a))
    sweep = write_sweep(tmp_path, space={"train.lr": {"loguniform": [0.01, 0.5]}})
    assert main(["tune", str(sweep), "search.name=optuna", f"dir={tmp_path / 'sw'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'raysim[optuna]'" in err and "sweep key 'search.name'" in err
    assert not (tmp_path / "sw").exists()
