"""The engine: determinism over worker counts and batching (on the shared 2-CPU Ray); resume, resources,
algorithms end to end and TensorBoard (in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import crash_after, read_rows, strip_timing, tiny_overrides
from raysim.cli import main as cli_main
from raysim.config import load_config
from raysim.engine.resources import check_resources
from raysim.engine.runner import run_experiment
from raysim.errors import UserError


def _run(tmp_path: Path, name: str = "run", **extra):
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **extra))
    run_dir, rows, _ = run_experiment(cfg)
    return run_dir, rows


DETERMINISM = dict(rounds=3, clients__num=8, clients__fraction=0.75, data__partition="dirichlet")


@pytest.fixture(scope="module")
def inline_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("inline"), "inline", **DETERMINISM)[0]


@pytest.mark.parametrize("workers, per_call", [(1, "auto"), (2, "1"), (3, "3")])
def test_metrics_identical_for_any_worker_count_and_clients_per_call(ray_cluster, inline_run, tmp_path, workers,
                                                                    per_call):
    """Ray with 1, 2 and 3 workers (half a CPU each for 3, on 2 CPUs), one client per call, three, or auto: the
    metrics and per-client lines of the in-process run, bit for bit."""
    run_dir, rows = _run(tmp_path, "ray", engine__backend="ray", engine__num_workers=workers,
                         engine__cpus_per_worker=0.5 if workers == 3 else 1, engine__clients_per_call=per_call,
                         **DETERMINISM)
    assert strip_timing(rows) == strip_timing(read_rows(inline_run)) and len(rows) == 3
    clients = [(d / "client_metrics.jsonl").read_text() for d in (run_dir, inline_run)]
    assert clients[0] == clients[1] and clients[0].count("\n") == 3


def test_resume_matches_uninterrupted_run(tmp_path):
    extra = dict(rounds=4, algorithm__name="partialavg", clients__fraction=0.5, data__partition="dirichlet")
    _, full = _run(tmp_path, "full", **extra)

    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), **extra))
    crash_after(cfg, 2)
    assert [r["round"] for r in read_rows(tmp_path / "part")] == [1, 2]
    _, resumed = run_experiment(cfg, resume=True)[:2]
    assert resumed and resumed[-1]["round"] == 4
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(full)
    # the per-client lines of a round after the checkpoint were trimmed on resume, then written again once
    assert (tmp_path / "part" / "client_metrics.jsonl").read_text() == \
        (tmp_path / "full" / "client_metrics.jsonl").read_text()


def test_fedavg_with_one_client_equals_local_training(tmp_path):
    extra = dict(clients__num=1, engine__num_workers=1, data__partition="iid")
    _, fed = _run(tmp_path, "fed", algorithm__name="fedavg", **extra)
    _, loc = _run(tmp_path, "loc", algorithm__name="local", **extra)
    for a, b in zip(fed, loc):
        assert a["acc_mean"] == b["acc_mean"] and a["loss"] == b["loss"]
    assert loc[0]["bytes_up"] == 0 and fed[0]["bytes_up"] > 0


def test_partialavg_shares_only_the_head(tmp_path):
    run_dir, rows = _run(tmp_path, algorithm__name="partialavg")
    ckpt = torch.load(run_dir / "checkpoint" / "server.pt", weights_only=True)
    assert set(ckpt["server_state"]["model"]) == {"head.weight", "head.bias"}
    head_bytes = sum(t.numel() * 4 for t in ckpt["server_state"]["model"].values())
    assert rows[0]["bytes_up"] == head_bytes * 4 and rows[0]["bytes_down"] == head_bytes * 4
    states = [torch.load(f, weights_only=True) for f in sorted((run_dir / "checkpoint" / "clients").iterdir())]
    assert len(states) == 4
    assert all(not any(k.startswith("head.") for k in s) for s in states)
    assert not torch.equal(states[0]["backbone.1.weight"], states[1]["backbone.1.weight"])
    assert "acc_global" not in rows[0]


def test_tensorboard_events_hold_the_scalars(shared_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, rows = shared_run()  # the tiny run, as other tests read it too
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ["acc/mean", "acc/global", "acc/weighted", "loss/train", "comm/bytes_up", "comm/bytes_down",
                "comm/bytes_up_total", "comm/bytes_down_total", "time/round_s",
                "per_client/acc_0000", "per_client/acc_0003"]:
        assert tag in tags, tag
    values = [e.value for e in acc.Scalars("acc/mean")]
    assert values == pytest.approx([r["acc_mean"] for r in rows])
    # FedAvg: the pooled accuracy over the clients' test samples is the global model's
    assert all(r["acc_weighted"] == r["acc_global"] is not None for r in rows)
    assert "acc/clients" in acc.Tags()["histograms"]
    assert (run_dir / "config.yaml").is_file()


def test_gpu_request_on_gpu_less_cluster_fails_fast(ray_cluster, tmp_path, capsys):
    smoke = Path(__file__).resolve().parents[2] / "experiments" / "smoke.yaml"
    code = cli_main(["run", str(smoke), f"log.dir={tmp_path / 'gpu'}", "engine.gpus_per_worker=0.5"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err  # one line, naming the key
    assert err.startswith("raysim: error: config key 'engine.gpus_per_worker': asks for 0.5 GPU per worker, but "
                          "the Ray cluster has no GPU"), err
    assert not (tmp_path / "gpu").exists()


def test_resource_check_messages():
    cfg = load_config(None, ["engine.gpus_per_worker=0.25"])
    with pytest.raises(UserError, match="engine.gpus_per_worker.*no GPU"):
        check_resources(cfg.engine, total={"CPU": 2.0}, nodes=[{"CPU": 2.0}])
    cfg = load_config(None, ["engine.num_workers=3"])
    with pytest.raises(UserError, match="engine.num_workers.*3 CPU.*has 2"):
        check_resources(cfg.engine, total={"CPU": 2.0}, nodes=[{"CPU": 2.0}])
    cfg = load_config(None, ["engine.num_workers=2", "engine.cpus_per_worker=3"])
    with pytest.raises(UserError, match="engine.cpus_per_worker': 3 CPU per worker, but the largest node has 2$"):
        check_resources(cfg.engine, total={"CPU": 8.0}, nodes=[{"CPU": 2.0}] * 4)
    cfg = load_config(None, ["engine.num_workers=2", "engine.gpus_per_worker=1"])
    with pytest.raises(UserError, match="engine.gpus_per_worker': 1 GPU per worker, but the largest node has 0.5$"):
        check_resources(cfg.engine, total={"CPU": 4.0, "GPU": 2.0}, nodes=[{"CPU": 2.0, "GPU": 0.5}] * 4)
    check_resources(load_config(None, ["engine.gpus_per_worker=0.5"]).engine, total={"CPU": 4.0, "GPU": 1.0},
                    nodes=[{"CPU": 4.0, "GPU": 1.0}])


def test_a_round_whose_every_client_diverged_stops_the_run_in_one_line(tmp_path):
    """engine.on_nonfinite=skip drops a non-finite update; a round that drops them all has nothing to aggregate: an
    error, not a row of NaN (and the command exits 3 with one line)."""
    from raysim.errors import RunStopped

    with pytest.raises(RunStopped, match=r"every client of round 1 \(4\) returned a non-finite"):
        _run(tmp_path, train__lr=1e30, engine__on_nonfinite="skip")
    code = cli_main(["run", "smoke", "train.lr=1e30", "engine.on_nonfinite=skip", f"log.dir={tmp_path / 'cli'}"])
    assert code == 3


def test_a_server_model_that_turns_non_finite_stops_the_run(tmp_path, monkeypatch):
    """Finite uploads whose server step overflows (here a server step that scales the mean by 1e39 in float32)."""
    from raysim.algorithms.fedavg import FedAvg
    from raysim.errors import RunStopped

    def overflowing(self, mean, server_state, round):
        server_state["model"] = {k: v * 1e39 if v.is_floating_point() else v for k, v in mean.items()}
        return server_state

    monkeypatch.setattr(FedAvg, "server_aggregate_mean", overflowing)
    with pytest.raises(RunStopped, match="round 1's server step gave a non-finite"):
        _run(tmp_path)
    assert not (tmp_path / "run" / "checkpoint").exists()  # nothing of the failed round was kept
