"""FedCDA: the batched selection by hand, the server-side per-client history store, tiny runs on the shared Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import crash_after, read_rows, refused_config, strip_timing, tiny_overrides

from raysim.algorithms.base import ClientUpdate, ServerContext
from raysim.algorithms.fedcda import objective, select_batch
from raysim.config import ConfigError, load_config
from raysim.registry import get_algorithm


def _algo(memory: int, warmup: int, *extra: str):
    cfg = load_config(None, ["algorithm.name=fedcda", f"algorithm.memory_size={memory}",
                             f"algorithm.warmup_rounds={warmup}", *extra])
    return get_algorithm("fedcda")(cfg)


def _round(algo, state: dict, rnd: int, uploads: dict, history: dict) -> dict:
    """One server round: ``uploads`` {client: (w, loss, samples)} of 1-d 'models'; ``history`` {client: [(round, w,
    loss), ...]} collects what the engine would keep (server_keep), oldest first, this round's last."""
    updates = []
    for cid, (w, loss, n) in sorted(uploads.items()):
        upload = {"model": {"w": torch.tensor([w])}, "loss": torch.tensor(loss, dtype=torch.float64)}
        u = ClientUpdate(client_id=cid, upload=upload, num_samples=n)
        history.setdefault(cid, []).append(algo.server_keep(u, rnd))
        history[cid] = history[cid][-algo.server_history:]
        updates.append(u)
    ctx = ServerContext(round=rnd, total_rounds=9, seed=0, device=torch.device("cpu"), num_classes=2,
                        history={c: list(history[c]) for c in uploads})
    return algo.server_train(algo.server_aggregate(updates, state, rnd), updates, ctx)


def test_lower_loss_wins_between_models_of_equal_divergence():
    algo = _algo(memory=2, warmup=1)
    assert algo.server_history == 3  # K candidates + the standing selection
    hist: dict = {}
    state = algo.init_server_state({"w": torch.tensor([0.0])})
    # round 1 (warm-up, plain FedAvg): A = 0 (loss 0.3), B = -1 (loss 0.2), one sample each -> -0.5
    state = _round(algo, state, 1, {0: (0.0, 0.3, 1), 1: (-1.0, 0.2, 1)}, hist)
    assert state["model"]["w"].item() == -0.5 and state["selected"] == {0: 1, 1: 1}
    # round 2: only B, newest +1 with loss 0.5; its older -1 has loss 0.2; A stays at 0. Both choices are 1 away
    # from A, so the divergence (1/N) sum |s_n - mean|^2 = 0.25 either way; J = mean F + (L/2) 0.25, L = 1:
    #   B = +1: (0.3 + 0.5)/2 + 0.125 = 0.525      B = -1: (0.3 + 0.2)/2 + 0.125 = 0.375  -> the older, lower loss
    state = _round(algo, state, 2, {1: (1.0, 0.5, 1)}, hist)
    assert state["selected"] == {0: 1, 1: 1}
    assert state["model"]["w"].item() == pytest.approx(-0.5)  # uniform mean of A = 0 and B = -1
    assert state["cda"]["objective_newest"] == pytest.approx(0.525)
    assert state["cda"]["objective"] == pytest.approx(0.375)
    assert state["cda"]["older"] == 1 and state["cda"]["clients"] == 2
    # the same divergences with the losses the other way round: the newest (now lower loss) wins
    algo, hist = _algo(memory=2, warmup=1), {}
    state = _round(algo, algo.init_server_state({"w": torch.tensor([0.0])}), 1,
                   {0: (0.0, 0.3, 1), 1: (-1.0, 0.5, 1)}, hist)
    state = _round(algo, state, 2, {1: (1.0, 0.2, 1)}, hist)
    assert state["selected"][1] == 2 and state["model"]["w"].item() == pytest.approx(0.5)


def test_global_model_is_the_uniform_mean_of_every_clients_selection():
    algo = _algo(memory=1, warmup=1)  # K = 1: each participant's selection is its newest model
    hist: dict = {}
    state = algo.init_server_state({"w": torch.tensor([0.0])})
    # round 1 (warm-up): FedAvg of the participants by samples: A = 0 (1), B = 3 (1), C = 9 (4) -> 39/6 = 6.5
    state = _round(algo, state, 1, {0: (0.0, 0.1, 1), 1: (3.0, 0.1, 1), 2: (9.0, 0.1, 4)}, hist)
    assert state["model"]["w"].item() == pytest.approx(6.5)
    # round 2: only C, now at 6. The mean is over every client's selection, uniform, non-participants unchanged:
    #   (A 0 + B 3 + C 6) / 3 = 3      (not FedAvg of the round's clients, 6; not by samples, (0 + 3 + 24)/6 = 4.5)
    state = _round(algo, state, 2, {2: (6.0, 0.1, 4)}, hist)
    assert state["model"]["w"].item() == pytest.approx(3.0)
    assert state["selected"] == {0: 1, 1: 1, 2: 2}
    # round 3: only A, now at 3: (3 + 3 + 6) / 3 = 4; B still counts with its round-1 model
    state = _round(algo, state, 3, {0: (3.0, 0.1, 1)}, hist)
    assert state["model"]["w"].item() == pytest.approx(4.0)
    assert state["selected"] == {0: 3, 1: 1, 2: 2} and state["cda"]["clients"] == 3
    # a client that has never taken part holds no model and is not in the mean: D joins at 12 -> (3+3+6+12)/4 = 6
    state = _round(algo, state, 4, {3: (12.0, 0.1, 5)}, hist)
    assert state["model"]["w"].item() == pytest.approx(6.0)


def test_batch_search_is_exhaustive_with_the_rest_fixed():
    # two clients in one batch, models 0, 1 (client A, newest first) and 2, 3 (B) at the points 0, 4 | 1, 5; a
    # fixed client at 2; all losses 0, L = 2, so J = (1/N) sum |s - mean|^2 with N = 3:
    #   (0, 1): mean 1, J = (1 + 0 + 1)/3 = 2/3          (0, 5): mean 7/3, J = (49 + 64 + 1)/27 = 114/27
    #   (4, 1): mean 7/3, J = (25 + 16 + 1)/27 = 42/27   (4, 5): mean 11/3, J = (1 + 16 + 25)/27 = 42/27
    pts = np.array([0.0, 4.0, 1.0, 5.0])
    gram = np.outer(pts, pts)
    fixed_dot = pts * 2.0
    best, j = select_batch([[0, 1], [2, 3]], gram, fixed_dot, np.zeros(4), (0.0, 4.0, 4.0, 1), smoothness=2.0)

    def by_hand(a: float, b: float) -> float:
        xs = np.array([a, b, 2.0])
        return float(((xs - xs.mean()) ** 2).mean())

    assert best == [0, 2] and j == pytest.approx(by_hand(0, 1)) == pytest.approx(2 / 3)
    assert by_hand(0, 1) < min(by_hand(0, 5), by_hand(4, 1), by_hand(4, 5))
    # objective() is the same formula from the running sums: N = 3, sums 0 + 1 + 2, squares 0 + 1 + 4
    assert objective(3, 0.0, 5.0, 9.0, 2.0) == pytest.approx(2 / 3)


def test_selection_is_a_pure_function_of_seed_and_round():
    def run() -> dict:
        algo, hist = _algo(2, 1, "algorithm.num_batches=2"), {}
        state = algo.init_server_state({"w": torch.tensor([0.0])})
        state = _round(algo, state, 1, {c: (float(c), 0.1 * c, 1) for c in range(5)}, hist)
        return _round(algo, state, 2, {c: (float(3 - c), 0.1, 1) for c in range(5)}, hist)

    a, b = run(), run()
    assert a["selected"] == b["selected"] and a["model"]["w"].item() == b["model"]["w"].item()
    assert a["cda"]["objective"] <= a["cda"]["objective_newest"] + 1e-12


class _Objects:
    """The store's object interface (an executor's put/get) in this process, as the inline executor has it."""

    def put(self, obj):
        return obj

    def get(self, handles):
        return list(handles)


def test_history_store_keeps_a_bounded_window_and_survives_a_checkpoint(tmp_path):
    from raysim.engine.state import ClientHistoryStore

    objects = _Objects()
    store = ClientHistoryStore(2, objects)
    for rnd in (1, 2, 3):
        for cid in (0, 5):
            store.push(cid, rnd, objects.put({"w": torch.tensor([10.0 * cid + rnd])}))
    assert store.index() == {0: [2, 3], 5: [2, 3]}
    assert [o["w"].item() for o in objects.get(store.refs(5))] == [52.0, 53.0]
    ckpt = tmp_path / "checkpoint"
    assert store.save(ckpt) == {0: [2, 3], 5: [2, 3]}
    store.push(0, 4, objects.put({"w": torch.tensor([4.0])}))
    index = store.save(ckpt)
    store.prune(ckpt)
    assert sorted(f.name for f in (ckpt / "history").iterdir()) == [
        "c000000_r00003.pt", "c000000_r00004.pt", "c000005_r00002.pt", "c000005_r00003.pt"]
    (ckpt / "history" / "c000009_r00001.pt").write_bytes(b"stray")  # a file no checkpoint names
    again = ClientHistoryStore(2, objects)
    again.load(ckpt, index)
    assert again.index() == index and [o["w"].item() for o in objects.get(again.refs(0))] == [3.0, 4.0]
    assert not (ckpt / "history" / "c000009_r00001.pt").exists()


@pytest.mark.parametrize("key,value", [("memory_size", "0"), ("num_batches", "0"), ("warmup_rounds", "-1"),
                                       ("smoothness", "-1")])
def test_bad_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"'algorithm.{key}'"):
        load_config(None, ["algorithm.name=fedcda", f"algorithm.{key}={value}"])


def test_cli_bad_memory_size_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.memory_size", *tiny_overrides(tmp_path), "algorithm.name=fedcda",
                   "algorithm.memory_size=0")


# ---------------------------------------------------------------------------------------------- on Ray
# L large: the divergence outweighs the losses, so older models get selected within these few rounds
CDA = dict(rounds=4, algorithm__name="fedcda", algorithm__memory_size=2, algorithm__warmup_rounds=1,
           algorithm__smoothness=1000.0, clients__fraction=0.5, data__partition="dirichlet")


def _run(tmp_path, name, **extra):
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **extra))
    run_dir, _, _ = run_experiment(cfg)
    return run_dir, read_rows(run_dir)


def _no_cda(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("cda/", "bytes_up"))} for r in strip_timing(rows)]


def test_fedcda_on_ray_workers_resume_and_fedavg_equivalence(ray_cluster, shared_run, tmp_path):
    from raysim.engine.runner import run_experiment

    run_dir, one = _run(tmp_path, "w1", **CDA)
    _, two = _run(tmp_path, "w2", engine__num_workers=2, **CDA)
    assert strip_timing(one) == strip_timing(two)
    for r in one:
        assert {"acc_global", "acc_mean", "loss", "cda/objective", "cda/objective_newest", "cda/older"} <= set(r)
        assert math.isfinite(r["loss"]) and r["cda/objective"] <= r["cda/objective_newest"] + 1e-9
    assert one[0]["cda/older"] == 0  # warm-up
    assert any(r["cda/older"] > 0 for r in one[1:])  # an older model was aggregated at least once
    # the cache is bounded: at most memory_size + 1 files per client, and each names a round it was kept in
    files = sorted(f.name for f in (run_dir / "checkpoint" / "history").iterdir())
    assert files and max(sum(f.startswith(f"c{c:06d}") for f in files) for c in range(4)) <= 3
    ckpt = torch.load(run_dir / "checkpoint" / "server.pt", weights_only=True)
    assert sum(len(v) for v in ckpt["history"].values()) == len(files)

    # resume after round 2 (the cache comes back from the checkpoint) == the uninterrupted run
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), **CDA))
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(one)

    # warm-up through the whole run is FedAvg, bit for bit (aggregated on a worker instead of the driver); the
    # upload carries the last epoch's loss as well (8 bytes more per client)
    _, warm = _run(tmp_path, "warm", **{**CDA, "algorithm__warmup_rounds": 4})
    fedavg = shared_run(**{k: v for k, v in CDA.items() if not k.startswith("algorithm__")},
                        algorithm__name="fedavg")[1]  # the same run as engine/test_faults.py's FedAvg reference
    assert _no_cda(warm) == _no_cda(fedavg)
