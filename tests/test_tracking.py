"""Experiment tracking: log.mlflow (MLflow's file store) and log.wandb (offline), for a run, an in-process seed set
and every Tune trial; a missing extra is one line naming it."""

from __future__ import annotations

import importlib.util
import time

import pytest

import raysim
from conftest import tiny_overrides, wandb_history
from raysim.cli import main


def _raysim_lines(stderr: str) -> list[str]:
    """raysim's own stderr lines (the session's Ray may stream its raylet's warnings to this process too)."""
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("raysim:")]


def _mlflow_runs(store) -> dict:
    """run name -> (params, acc_mean values by step) of every run in an MLflow store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    found = {}
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            history = client.get_metric_history(run.info.run_id, "acc_mean")
            found[run.info.run_name] = (run.data.params, {m.step: m.value for m in history}, run.info.status)
    return found


def test_smoke_run_logs_config_and_every_round_to_mlflow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # log.mlflow=true: ./mlruns
    result = raysim.run("smoke", "engine.backend=inline", "log.mlflow=true", f"log.dir={tmp_path / 'run'}",
                        progress=False)
    runs = _mlflow_runs(tmp_path / "mlruns")
    (params, acc, status) = runs["run"]
    assert acc == dict(zip(result.metrics["round"], result.metrics["acc_mean"])) and len(acc) == 3
    assert params["train.lr"] == "0.1" and params["rounds"] == "3" and params["data.partition"] == "dirichlet"
    assert status == "FINISHED"
    # a resumed run continues the same MLflow run
    assert main(["run", "--resume", str(tmp_path / "run"), "rounds=4", "--quiet"]) == 0
    (_, acc, status) = _mlflow_runs(tmp_path / "mlruns")["run"]
    assert sorted(acc) == [1, 2, 3, 4] and status == "FINISHED"


def test_smoke_run_leaves_an_offline_wandb_run_with_every_round(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert main(["run", "smoke", "engine.backend=inline", "log.wandb=raysim-test", f"log.dir={tmp_path / 'run'}",
                 "--quiet"]) == 0
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    for _ in range(60):  # W&B's service writes the run file behind the process (its exit flushes it)
        rows = [r for r in wandb_history(offline) if "acc_mean" in r]
        if len(rows) == 3:
            break
        time.sleep(0.5)
    assert [r["_step"] for r in rows] == [1, 2, 3]
    logged = raysim.load_run(tmp_path / "run").metrics["acc_mean"].tolist()
    assert [r["acc_mean"] for r in rows] == pytest.approx(logged)


def test_in_process_seed_set_tracks_each_seed(tmp_path):
    store = tmp_path / "store"
    assert main(["run", *tiny_overrides(tmp_path, engine__backend="inline", log__mlflow=store), "--seeds", "0-1",
                 f"log.dir={tmp_path / 'seeds'}", "--quiet"]) == 0
    runs = _mlflow_runs(store)
    assert set(runs) == {"seed-0", "seed-1"}
    assert {runs[s][0]["seed"] for s in runs} == {"0", "1"} and all(len(r[1]) == 2 for r in runs.values())


def test_two_trial_sweep_one_mlflow_run_per_trial_and_user_callbacks(ray_cluster, tmp_path):
    """Tune's own MLflowLoggerCallback: one MLflow run per trial, each round a step; raysim.tune passes callbacks of
    the user's own to the Tuner."""
    import yaml
    from ray.tune import Callback

    class Rounds(Callback):
        def __init__(self):
            self.seen = []

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.seen.append(result["round"])

    base = tmp_path / "exp.yaml"
    base.write_text(yaml.safe_dump({"rounds": 2, "clients": {"num": 4}, "data": {"partition": "iid"},
                                    "model": {"hidden": [16], "feature_dim": 8}, "engine": {"num_workers": 1},
                                    "log": {"mlflow": str(tmp_path / "store")}}))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(base), "num_samples": 1,
                                     "space": {"train.lr": {"grid": [0.05, 0.1]}}}))
    rounds = Rounds()
    result = raysim.tune(sweep, f"dir={tmp_path / 'sw'}", callbacks=[rounds])
    assert len(result.trials) == 2
    runs = _mlflow_runs(tmp_path / "store")
    assert len(runs) == 2
    assert sorted(p["train.lr"] for p, _, _ in runs.values()) == ["0.05", "0.1"]
    assert all(sorted(acc) == [1, 2] for _, acc, _ in runs.values())
    assert sorted(rounds.seen) == [1, 1, 2, 2]


@pytest.mark.parametrize("extra", ["mlflow", "wandb"])
def test_tracking_without_its_extra_is_one_line_naming_it(tmp_path, monkeypatch, capsys, extra):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == extra else real(name, *a))
    assert main(["run", *tiny_overrides(tmp_path, engine__backend="inline"), f"log.{extra}=true"]) == 2
    err = _raysim_lines(capsys.readouterr().err)
    assert len(err) == 1 and f"config key 'log.{extra}'" in err[0] and f"pip install 'raysim[{extra}]'" in err[0]
    assert not (tmp_path / "run").exists()


def test_tracking_that_cannot_start_is_one_line_and_leaves_nothing(tmp_path, capsys):
    assert main(["run", *tiny_overrides(tmp_path, engine__backend="inline"), "log.mlflow=nosuchscheme://x"]) == 2
    err = _raysim_lines(capsys.readouterr().err)
    assert len(err) == 1 and "config key 'log.mlflow': cannot start tracking at nosuchscheme://x" in err[0]
    assert not (tmp_path / "run").exists()
