"""FedCDA: the batched selection by hand, the server-side per-client history store, tiny runs on the shared Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import read_rows, refused_config, strip_timing, tiny_overrides

from raysim.algorithms.base import ClientUpdate, ServerContext
from raysim.algorithms.fedcda import select_models, squared_distances, total_divergence
from raysim.config import ConfigError, load_config
from raysim.registry import get_algorithm

# Three clients with two cached models each (newest first): models 0,1 (client A), 2,3 (B), 4,5 (C).
# Squared distances, chosen by hand:
#        0   1   2   3   4   5
DIST = np.array([
    [0, 3, 4, 9, 5, 9],   # 0 = A newest
    [3, 0, 1, 9, 9, 2],   # 1 = A older
    [4, 1, 0, 9, 6, 1],   # 2 = B newest
    [9, 9, 9, 0, 9, 9],   # 3 = B older
    [5, 9, 6, 9, 0, 7],   # 4 = C newest
    [9, 2, 1, 9, 7, 0],   # 5 = C older
], dtype=float)
CANDIDATES = [[0, 1], [2, 3], [4, 5]]


def test_selection_on_three_clients_by_hand():
    # D(s) = d(sA, sB) + d(sA, sC) + d(sB, sC) over the 8 combinations (A, B, C):
    #   (0,2,4) = 4+5+6 = 15   (0,2,5) = 4+9+1 = 14   (0,3,4) = 9+5+9 = 23   (0,3,5) = 9+9+9 = 27
    #   (1,2,4) = 1+9+6 = 16   (1,2,5) = 1+2+1 = 4    (1,3,4) = 9+9+9 = 27   (1,3,5) = 9+2+9 = 20
    # exact search (one batch of 3): (1, 2, 5), D = 4; the newest models (FedAvg) have D = 15
    assert select_models(DIST, CANDIDATES, batch=3) == [1, 2, 5]
    assert total_divergence(DIST, [1, 2, 5]) == 4 and total_divergence(DIST, [0, 2, 4]) == 15
    # batches of one client, in order, the others fixed at their current choice (newest to start):
    #   A: vs B=2, C=4: model 0 -> 4+5 = 9, model 1 -> 1+9 = 10      -> keeps 0
    #   B: vs A=0, C=4: model 2 -> 4+6 = 10, model 3 -> 9+9 = 18     -> keeps 2
    #   C: vs A=0, B=2: model 4 -> 5+6 = 11, model 5 -> 9+1 = 10     -> takes 5
    # -> (0, 2, 5), D = 14: better than FedAvg's 15, worse than the exact 4 (the approximation)
    assert select_models(DIST, CANDIDATES, batch=1) == [0, 2, 5]
    # batches of two: {A, B} vs C=4: (0,2): 4+5+6 = 15, (0,3): 9+5+9 = 23, (1,2): 1+9+6 = 16, (1,3): 9+9+9 = 27
    #   -> (0, 2); then {C} vs A=0, B=2: 4 -> 11, 5 -> 10 -> 5: (0, 2, 5)
    assert select_models(DIST, CANDIDATES, batch=2) == [0, 2, 5]
    # a client with one cached model has no choice; ties keep the newer model
    assert select_models(DIST, [[0], [2, 3], [4, 5]], batch=3) == [0, 2, 5]
    assert select_models(np.zeros((4, 4)), [[0, 1], [2, 3]], batch=2) == [0, 2]


def test_squared_distances_over_float_entries():
    # a = (w: [1, 2], b: [0]), b = (w: [0, 0], b: [2]): |1|^2 + |2|^2 + |0-2|^2 = 1 + 4 + 4 = 9; int entries ignored
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0]), "n": torch.tensor(5)}
    b = {"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([2.0]), "n": torch.tensor(7)}
    d = squared_distances([a, b, a])
    assert d.tolist() == [[0, 9, 0], [9, 0, 9], [0, 9, 0]]


def _server_round(rnd: int, warmup: int):
    """server_train on three clients whose cached 'models' are 1-d points: A = [0 (newest), 10], B = [4, 8],
    C = [12, 9]; 1, 1 and 2 samples."""
    cfg = load_config(None, ["algorithm.name=fedcda", "algorithm.memory_size=2", f"algorithm.warmup_rounds={warmup}"])
    algo = get_algorithm("fedcda")(cfg)
    assert algo.server_history == 2
    pts = {0: [10.0, 0.0], 1: [8.0, 4.0], 2: [9.0, 12.0]}  # oldest first, as ctx.history holds them
    history = {c: [{"w": torch.tensor([v])} for v in vs] for c, vs in pts.items()}
    updates = [ClientUpdate(client_id=c, upload=history[c][-1], num_samples=n) for c, n in ((0, 1), (1, 1), (2, 2))]
    ctx = ServerContext(round=rnd, total_rounds=5, seed=0, device=torch.device("cpu"), num_classes=2,
                        history=history)
    return algo.server_train({"model": {}}, updates, ctx)


def test_server_train_selects_then_averages_by_samples():
    # newest (0, 4, 12): D = 16 + 144 + 64 = 224. Exact search over 8 combinations (B = 5 > 3 clients):
    #   (10, 8, 9): D = 4 + 1 + 1 = 6, the least -> average weighted 1:1:2 = (10 + 8 + 2*9)/4 = 9
    state = _server_round(rnd=3, warmup=2)
    assert state["model"]["w"].item() == pytest.approx(9.0)
    assert state["cda"] == {"divergence_newest": 224.0, "divergence": 6.0, "older": 3.0}
    # in warm-up: plain FedAvg of the newest: (0 + 4 + 2*12)/4 = 7
    state = _server_round(rnd=2, warmup=2)
    assert state["model"]["w"].item() == pytest.approx(7.0) and state["cda"]["older"] == 0


def test_history_store_keeps_a_bounded_window_and_survives_a_checkpoint(ray_cluster, tmp_path):
    import ray

    from raysim.engine.state import ClientHistoryStore

    store = ClientHistoryStore(limit=2)
    for rnd in (1, 2, 3):
        for cid in (0, 5):
            store.push(cid, rnd, ray.put({"w": torch.tensor([10.0 * cid + rnd])}))
    assert store.index() == {0: [2, 3], 5: [2, 3]}
    assert [o["w"].item() for o in ray.get(store.refs(5))] == [52.0, 53.0]
    ckpt = tmp_path / "checkpoint"
    assert store.save(ckpt) == {0: [2, 3], 5: [2, 3]}
    store.push(0, 4, ray.put({"w": torch.tensor([4.0])}))
    index = store.save(ckpt)
    store.prune(ckpt)
    assert sorted(f.name for f in (ckpt / "history").iterdir()) == [
        "c000000_r00003.pt", "c000000_r00004.pt", "c000005_r00002.pt", "c000005_r00003.pt"]
    (ckpt / "history" / "c000009_r00001.pt").write_bytes(b"stray")  # a file no checkpoint names
    again = ClientHistoryStore(limit=2)
    again.load(ckpt, index)
    assert again.index() == index and [o["w"].item() for o in ray.get(again.refs(0))] == [3.0, 4.0]
    assert not (ckpt / "history" / "c000009_r00001.pt").exists()


@pytest.mark.parametrize("key,value", [("memory_size", "0"), ("client_batch", "0"), ("warmup_rounds", "-1"),
                                       ("client_batch", "20")])
def test_bad_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"'algorithm.{key}'"):
        load_config(None, ["algorithm.name=fedcda", f"algorithm.{key}={value}"])


def test_cli_bad_memory_size_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.memory_size", *tiny_overrides(tmp_path), "algorithm.name=fedcda",
                   "algorithm.memory_size=0")


# ---------------------------------------------------------------------------------------------- on Ray
CDA = dict(rounds=4, algorithm__name="fedcda", algorithm__memory_size=2, algorithm__warmup_rounds=1,
           clients__fraction=0.5, data__partition="dirichlet")


def _run(tmp_path, name, **extra):
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **extra))
    run_dir, _, _ = run_experiment(cfg)
    return run_dir, read_rows(run_dir)


def _no_cda(rows):
    return [{k: v for k, v in r.items() if not k.startswith("cda/")} for r in strip_timing(rows)]


def test_fedcda_on_ray_workers_resume_and_fedavg_equivalence(ray_cluster, shared_run, tmp_path):
    from raysim.engine.runner import run_experiment

    run_dir, one = _run(tmp_path, "w1", **CDA)
    _, two = _run(tmp_path, "w2", engine__num_workers=2, **CDA)
    assert strip_timing(one) == strip_timing(two)
    for r in one:
        assert {"acc_global", "acc_mean", "loss", "cda/divergence", "cda/divergence_newest", "cda/older"} <= set(r)
        assert math.isfinite(r["loss"]) and r["cda/divergence"] <= r["cda/divergence_newest"] + 1e-9
    assert one[0]["cda/older"] == 0  # warm-up
    assert any(r["cda/older"] > 0 for r in one[1:])  # an older model was aggregated at least once
    # the cache is bounded: at most memory_size files per client, and each names a round it was kept in
    files = sorted(f.name for f in (run_dir / "checkpoint" / "history").iterdir())
    assert files and max(sum(f.startswith(f"c{c:06d}") for f in files) for c in range(4)) <= 2
    ckpt = torch.load(run_dir / "checkpoint" / "server.pt", weights_only=True)
    assert sum(len(v) for v in ckpt["history"].values()) == len(files)

    # resume after round 2 (the cache comes back from the checkpoint) == the uninterrupted run
    class Crash(Exception):
        pass

    def crash_after_two(metrics):
        if metrics["round"] == 2:
            raise Crash()

    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), **CDA))
    with pytest.raises(Crash):
        run_experiment(cfg, on_round=crash_after_two)
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(one)

    # K = 1 keeps only this round's model: FedAvg, bit for bit (aggregated on a worker instead of the driver)
    _, k1 = _run(tmp_path, "k1", **{**CDA, "algorithm__memory_size": 1})
    fedavg = shared_run(**{k: v for k, v in CDA.items() if not k.startswith("algorithm__")},
                        algorithm__name="fedavg")[1]  # the same run as engine/test_faults.py's FedAvg reference
    assert _no_cda(k1) == _no_cda(fedavg)
