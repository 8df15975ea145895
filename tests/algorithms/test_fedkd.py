"""FedKD: SVD truncation at the energy threshold by hand, the mutual-distillation loss against the authors' formula,
the hooks without Ray (mentor attached, factors uploaded, mentee versions), and a tiny run on Ray (workers 1 vs 2)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, read_rows, refused_config, tiny_overrides
from raysim.algorithms.base import ClientContext, ClientUpdate
from raysim.algorithms.fedkd import (apply_update, compress, energy_rank, energy_threshold, mutual_distillation_loss,
                                     reconstruct, stage_pairs)
from raysim.config import ConfigError, load_config
from raysim.trees import nbytes
from raysim.models import build_model
from raysim.registry import get_algorithm

# orthogonal
H = torch.tensor([[1.0, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float64) / 2


# ---------------------------------------------------------------------------------------------- the math by hand
def test_svd_truncation_at_the_energy_threshold_by_hand():
    # M = H diag(4, 2, 1, 0.5) H^T has singular values 4, 2, 1, 0.5: energies 16, 4, 1, 0.25 (total 21.25)
    # kept share with k values: k=1 16/21.25 = 0.7529, k=2 20/21.25 = 0.941176, k=3 21/21.25 = 0.988235, k=4 1
    m = H @ torch.diag(torch.tensor([4.0, 2, 1, 0.5], dtype=torch.float64)) @ H.T
    s = torch.linalg.svdvals(m)
    assert [energy_rank(s, t) for t in (0.5, 0.94, 0.95, 0.98, 0.99, 1.0)] == [1, 2, 3, 3, 4, 4]
    # at T = 0.95 three values stay: U·S [4, 3] and V [3, 4] travel (24 float32 = 96 bytes), and the rebuilt
    # matrix is M without its smallest component, H diag(4, 2, 1, 0) H^T, off by exactly 0.5 in Frobenius norm
    packed = compress(m.float(), 0.95)
    assert packed["us"].shape == (4, 3) and packed["v"].shape == (3, 4) and nbytes(packed) == 96
    want = H @ torch.diag(torch.tensor([4.0, 2, 1, 0], dtype=torch.float64)) @ H.T
    got = reconstruct(packed, m.shape)
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert float(torch.linalg.norm(got.double() - m)) == pytest.approx(0.5, abs=1e-5)
    # T = 0.94: two values; T = 0.99: all four, M back exactly (up to float32)
    assert compress(m.float(), 0.94)["us"].shape == (4, 2)
    assert torch.allclose(reconstruct(compress(m.float(), 0.99), m.shape).double(), m, atol=1e-5)
    # an all-zero update travels as empty factors (0 bytes); vectors and integer tensors travel dense
    zero = compress(torch.zeros(3, 5), 0.95)
    assert nbytes(zero) == 0 and torch.equal(reconstruct(zero, torch.Size([3, 5])), torch.zeros(3, 5))
    assert set(compress(torch.ones(7), 0.95)) == {"dense"}
    assert set(compress(torch.ones(2, 2, dtype=torch.int64), 0.95)) == {"dense"}
    # a conv weight [out, in, kh, kw] is factorised as [out, in*kh*kw] and comes back in its shape
    conv = torch.randn(4, 2, 3, 3)
    packed = compress(conv, 1.0)
    assert packed["v"].shape[1] == 18 and torch.allclose(reconstruct(packed, conv.shape), conv, atol=1e-5)


def test_energy_schedule_rises_from_t_start_to_t_end():
    # authors: energy = tmin + ((1 + comm_round) / epochs) * (tmax - tmin), comm_round 0-based
    assert energy_threshold(1, 3, 0.95, 0.98) == pytest.approx(0.96)
    assert energy_threshold(2, 3, 0.95, 0.98) == pytest.approx(0.97)
    assert energy_threshold(3, 3, 0.95, 0.98) == pytest.approx(0.98)


def test_stage_pairs_follow_the_authors_layer_ratio():
    # mentee 4 layers, mentor 12: mentee layers 4,3,2,1 with mentor layers 12,9,6,3 (0-based indices below)
    assert stage_pairs(4, 12) == [(3, 11), (2, 8), (1, 5), (0, 2)]
    assert stage_pairs(3, 3) == [(2, 2), (1, 1), (0, 0)]


def test_mutual_distillation_loss_is_the_authors_formula():
    # equal logits: both KLs are 0, so L = 2 CE + 2 h / (2 CE); with CE = log 3 (uniform logits, 3 classes)
    y = torch.tensor([0, 2])
    flat = torch.zeros(2, 3)
    loss, parts = mutual_distillation_loss(flat, flat, y, torch.tensor(0.5))
    ce = math.log(3)
    assert loss.item() == pytest.approx(2 * ce + 2 * 0.5 / (2 * ce)) and parts["kd"].item() == pytest.approx(0)
    # general case against ModelBert.forward: loss1 + loss3 + mse/(l1+l2) + loss2 + loss4 + mse/(l1+l2)
    torch.manual_seed(0)
    t, s, h = torch.randn(5, 4), torch.randn(5, 4), torch.tensor(0.3)
    y = torch.tensor([0, 1, 2, 3, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # KLDivLoss's 'mean' warning, kept by the authors
        kl = torch.nn.KLDivLoss()
        l1, l2 = F.cross_entropy(t, y), F.cross_entropy(s, y)
        loss3 = kl(F.log_softmax(t, 1), F.softmax(s, 1)) / (l1 + l2)
        loss4 = kl(F.log_softmax(s, 1), F.softmax(t, 1)) / (l1 + l2)
        want = l1 + loss3 + h / (l1 + l2) + l2 + loss4 + h / (l1 + l2)
    loss, parts = mutual_distillation_loss(t, s, y, h)
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert parts["ce_mentor"].item() == pytest.approx(l1.item())
    assert parts["ce_mentee"].item() == pytest.approx(l2.item())


# ---------------------------------------------------------------------------------------------- hooks, no Ray
def _setup(*extra: str):
    cfg = load_config(None, ["algorithm.name=fedkd", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=4",
                             "rounds=3", *extra])
    algo = get_algorithm("fedkd")(cfg)
    return cfg, algo, lambda: build_model(cfg, "mlp", (5,), 3, 0, algo)


def _ctx(cid: int, rnd: int, payload: dict, state: dict, x, y) -> ClientContext:
    return ClientContext(client_id=cid, round=rnd, total_rounds=3, epoch=0, num_epochs=1, payload=payload,
                         state=state, num_classes=3, train_data=(x, y, torch.arange(len(y))))


def _train_client(algo, model, cid, rnd, payload, state, x, y):
    ctx = _ctx(cid, rnd, payload, dict(state), x, y)
    algo.client_setup(model, ctx)
    loss, _ = algo.client_loss(model, x, y, ctx)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    return algo.client_upload(model, ctx), algo.client_keep(model, ctx)


def test_hooks_mentor_factors_and_mentee_versions():
    cfg, algo, build = _setup()
    model = build()
    # the mentor (default: twice the mentee's hidden width) and the map of the one stage whose widths differ
    assert model.mentor.backbone[1].out_features == 16 and model.mentor_pairs == ((1, 1), (0, 0))
    assert isinstance(model.mentor_maps[0], torch.nn.Identity) and model.mentor_maps[1].in_features == 8
    shared = {k for k in model.state_dict() if algo.is_shared(k)}
    assert shared == {k for k in model.state_dict() if k.startswith(("backbone.", "head."))}
    assert torch.equal(build().mentor.head.weight, model.mentor.head.weight)  # deterministic everywhere
    # one optimiser trains everything: mentor, maps and mentee all get gradients
    torch.manual_seed(1)
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    ctx = _ctx(0, 1, {}, {}, x, y)
    algo.client_setup(model, ctx)
    loss, parts = algo.client_loss(model, x, y, ctx)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters()) and parts["hidden"].item() > 0
    # round 1: two clients upload factors; bytes = Σ k(m + n) float32 for matrices + the dense biases
    initial = build().state_dict()
    state = algo.init_server_state(initial)
    assert algo.server_payload(state, 1) == {} and algo.client_payload(state, 0, 1) is None
    ups, keeps = [], []
    for cid in (0, 1):
        up, keep = _train_client(algo, build(), cid, 1, {}, {}, x + cid, y)
        delta = up["delta"]
        assert set(delta) == shared
        for k, packed in delta.items():
            if k.endswith("weight"):
                k_rank = packed["us"].shape[1]
                assert packed["v"].shape[0] == k_rank and 1 <= k_rank <= min(initial[k].shape)
        ups.append(up)
        keeps.append(keep)
        assert keep["version"] == 0 and set(keep["private"]) == set(model.state_dict()) - shared
        assert all(torch.equal(keep["mentee"][k], initial[k]) for k in shared)  # it keeps what it started from
    state = algo.server_aggregate([ClientUpdate(c, u, 6) for c, u in enumerate(ups)], state, 1)
    assert (state["version"], state["update_from"], state["held"]) == (1, 0, {0: 0, 1: 0})
    # the server's mentee = initial + the plain mean of the reconstructed updates, itself truncated at T(1) = 0.96:
    # what is dropped holds at most 4% of the mean's energy; vectors go down exactly
    mean = {k: (reconstruct(ups[0]["delta"][k], initial[k].shape) + reconstruct(ups[1]["delta"][k], initial[k].shape))
            .double() / 2 for k in shared}
    for k in shared:
        down = reconstruct(state["update"][k], initial[k].shape)
        assert torch.equal(state["model"][k], initial[k] + down)
        if k.endswith("weight"):
            assert float(((down.double() - mean[k]) ** 2).sum()) <= 0.04 * float((mean[k] ** 2).sum()) + 1e-10
        else:
            assert torch.equal(down, mean[k].float())
    # round 2: a client applies the downloaded factors to the mentee it kept and gets the server's bit for bit
    payload = algo.server_payload(state, 2)
    assert set(payload) == {"update", "from", "version"} and algo.client_payload(state, 0, 2) is None
    m2 = build()
    ctx = _ctx(0, 2, payload, dict(keeps[0]), x, y)
    algo.client_setup(m2, ctx)
    assert all(torch.equal(m2.state_dict()[k], state["model"][k]) for k in shared)
    assert torch.equal(m2.mentor.head.weight, keeps[0]["private"]["mentor.head.weight"])
    # a client that missed round 1's update (held 0) while the server moved on twice gets the dense mentee
    state["held"] = {0: 1, 1: 0}
    state["update_from"], state["version"] = 1, 2
    assert algo.client_payload(state, 0, 3) is None
    assert set(algo.client_payload(state, 1, 3)) == {"model", "version"}
    # prediction: the mentor by default (no acc_global), the mentee on request
    assert not algo.has_global_model and torch.equal(algo.predict(m2, x, ctx), m2.mentor(x))
    _, mentee_algo, _ = _setup("algorithm.predict=mentee")
    assert mentee_algo.has_global_model and torch.equal(mentee_algo.predict(m2, x, ctx), m2(x))


def test_apply_update_keeps_dtypes():
    base = {"w": torch.ones(2, 2), "n": torch.tensor(3)}
    out = apply_update(base, {"w": compress(torch.eye(2), 1.0), "n": {"dense": torch.tensor(2)}})
    assert torch.allclose(out["w"], torch.ones(2, 2) + torch.eye(2)) and out["n"].item() == 5
    assert out["n"].dtype == torch.int64


# ---------------------------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("override, key", [("algorithm.t_start=0", "algorithm.t_start"),
                                           ("algorithm.t_end=0.9", "algorithm.t_end"),
                                           ("algorithm.t_end=1.5", "algorithm.t_end"),
                                           ("algorithm.predict=both", "algorithm.predict"),
                                           ("algorithm.mentor.width=0", "algorithm.mentor.width"),
                                           ("algorithm.mentor.hidden=[0]", "algorithm.mentor.hidden")])
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, ["algorithm.name=fedkd", override])


def test_bad_hyperparameter_through_the_cli_exits_2(tmp_path):
    refused_config("algorithm.t_end", *tiny_overrides(tmp_path, algorithm__name="fedkd"), "algorithm.t_end=0.5")


def test_experiment_configs_load_and_pass_the_check():
    from raysim.data import build_federated_data

    paths = sorted((ROOT / "experiments" / "unideal").glob("*/fedkd.yaml"))
    assert len(paths) == 6 and not any("hete" in p.parent.name for p in paths)  # the mentee is averaged
    from raysim.config import to_flat_dict

    algorithm_keys = [{k: v for k, v in to_flat_dict(load_config(path)).items() if k.startswith("algorithm.")}
                      for path in paths]
    assert all(keys == algorithm_keys[0] for keys in algorithm_keys)  # one recipe in every setting
    assert algorithm_keys[0]["algorithm.name"] == "fedkd"
    cfg = load_config(ROOT / "experiments" / "unideal" / "tabular-niid1" / "fedkd.yaml")
    get_algorithm("fedkd")(cfg).check(cfg, build_federated_data(cfg))


# ---------------------------------------------------------------------------------------------- a whole run
def test_fedkd_run_sends_factors_and_learns(tmp_path):
    from raysim.engine.runner import run_experiment

    run_dir, _, _ = run_experiment(load_config(None, tiny_overrides(tmp_path, algorithm__name="fedkd", rounds=3)))
    rows = read_rows(run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert {"loss_ce_mentor", "loss_ce_mentee", "loss_kd", "loss_hidden", "svd_energy", "svd_rank_down",
            "acc_mean", "bytes_up", "bytes_down"} <= set(rows[-1])
    assert "acc_global" not in rows[-1]  # the mentor predicts
    assert rows[0]["bytes_down"] == 0 and all(r["bytes_down"] > 0 for r in rows[1:])  # nothing down in round 1
    dense = 4 * 4 * (64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10)  # 4 clients x the dense mentee, float32
    assert 0 < rows[0]["bytes_up"] < dense  # truncated factors, not the dense mentee
    assert rows[-1]["svd_energy"] == pytest.approx(0.98) and rows[-1]["acc_mean"] > 0.3, rows
