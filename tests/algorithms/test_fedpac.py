"""FedPAC: its statistics, the per-client QP and the centroids worked by hand; the driver hooks without Ray; tiny
runs on the 2-CPU Ray (1 vs 2 workers identical, per-client downloads counted per client); a bad key on the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import read_rows, refused_config, tiny_overrides
from raysim.algorithms.base import ClientUpdate
from raysim.algorithms.fedpac import (class_centroids, combine_heads, feature_statistics, head_combination_weights,
                                      qp_matrix, solve_simplex_qp)
from raysim.config import ConfigError, load_config
from raysim.registry import get_algorithm

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- by hand
def test_feature_statistics_by_hand():
    # class 0: f = (1, 0), (3, 2); class 1: f = (2, 1); class 2: absent.  n = 3, p = (2/3, 1/3, 0)
    # E||f||^2: class 0 (1 + 13) / 2 = 7, class 1 5;  mu_0 = (2, 1), mu_1 = (2, 1), ||mu||^2 = 5 both
    # v = (2/3 * 7 + 1/3 * 5 - (4/9 * 5 + 1/9 * 5)) / 3 = (57/9 - 25/9) / 3 = 32/27
    # h = p_k mu_k: (4/3, 2/3), (2/3, 1/3), (0, 0)
    feats = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 2.0]])
    stats = feature_statistics(feats, torch.tensor([0, 1, 0]), 3)
    assert stats["counts"].tolist() == [2, 1, 0]
    assert torch.allclose(stats["means"], torch.tensor([[2.0, 1.0], [2.0, 1.0], [0.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(stats["h"], torch.tensor([[4 / 3, 2 / 3], [2 / 3, 1 / 3], [0, 0]], dtype=torch.float64))
    assert float(stats["v"]) == pytest.approx(32 / 27)


def _two_alike_one_far(delta_sq: float) -> np.ndarray:
    hs = np.zeros((3, 2, 2))  # clients 0 and 1 identical, client 2 at squared distance delta_sq
    hs[2, 0, 0], hs[2, 1, 1] = 1.0, math.sqrt(delta_sq - 1.0)
    return hs


def test_combination_weights_two_alike_one_far_by_hand():
    # v = (1, 1, 1), ||h_2 - h_0||^2 = D = 3.
    # client 0: P_0 = diag(1, 1, 1) + [[0,0,0],[0,0,0],[0,0,3]]; stationarity 2 a0 = 2 a1 = 8 a2 = lambda:
    #   a0 = a1 = 4 a2, 9 a2 = 1  ->  (4/9, 4/9, 1/9) (client 1 the same)
    # client 2: P_2 = I + 3 [[1,1,0],[1,1,0],[0,0,0]]; a0 = a1 = s/2, f = s^2/2 + 3 s^2 + (1 - s)^2,
    #   f' = 7 s - 2 (1 - s) = 0  ->  s = 2/9  ->  (1/9, 1/9, 7/9)
    hs = _two_alike_one_far(3.0)
    np.testing.assert_allclose(qp_matrix(0, np.ones(3), hs), np.diag([1, 1, 4.0]))
    alphas = head_combination_weights(np.ones(3), hs)
    expected = [[4 / 9, 4 / 9, 1 / 9], [4 / 9, 4 / 9, 1 / 9], [1 / 9, 1 / 9, 7 / 9]]
    for alpha, want in zip(alphas, expected):
        np.testing.assert_allclose(alpha, want, atol=1e-6)
    # the variance scales with 1/n: here only the ratio v/D matters (scale-free QP)
    for alpha, want in zip(head_combination_weights(np.full(3, 1e-4), _two_alike_one_far(3.0) * 1e-2), expected):
        np.testing.assert_allclose(alpha, want, atol=1e-6)


def test_small_weights_are_zeroed_and_heads_combined_by_hand():
    # D = 9999: client 0 gives client 2 a2 = a0 / (1 + D) ~ 5e-5 < eps = 1e-3 -> zeroed; what is left, a0 = a1,
    # combines heads 0 and 1 half and half.
    alpha = head_combination_weights(np.ones(3), _two_alike_one_far(9999.0))[0]
    assert alpha[2] == 0 and alpha[0] == pytest.approx(alpha[1])
    heads = [{"head.weight": torch.tensor([[9.0, 0.0]]), "head.bias": torch.tensor([0.0])},
             {"head.weight": torch.tensor([[0.0, 9.0]]), "head.bias": torch.tensor([9.0])},
             {"head.weight": torch.tensor([[90.0, 90.0]]), "head.bias": torch.tensor([-90.0])}]
    out = combine_heads(heads, alpha)
    assert torch.allclose(out["head.weight"], torch.tensor([[4.5, 4.5]])) and torch.allclose(out["head.bias"],
                                                                                             torch.tensor([4.5]))
    # (4/9, 4/9, 1/9): weight (4 + 0 + 10, 0 + 4 + 10) = (14, 14), bias 0 + 4 - 10 = -6
    out = combine_heads(heads, np.array([4 / 9, 4 / 9, 1 / 9]))
    assert torch.allclose(out["head.weight"], torch.tensor([[14.0, 14.0]])) and float(out["head.bias"]) == \
        pytest.approx(-6.0)


def test_degenerate_problems_leave_the_own_head():
    assert solve_simplex_qp(np.zeros((3, 3))) is None  # v = 0 and identical statistics: nothing to choose
    assert solve_simplex_qp(np.full((2, 2), np.nan)) is None
    np.testing.assert_allclose(solve_simplex_qp(np.array([[2.0]])), [1.0])
    # a far client alone on its side with v = 0: all weight on itself (P_ii = 0)
    np.testing.assert_allclose(head_combination_weights(np.zeros(3), _two_alike_one_far(3.0))[2], [0, 0, 1],
                               atol=1e-6)


def test_class_centroids_by_hand():
    # client A: class 0 mean (1, 1) x2, class 1 mean (0, 2) x1; client B: class 0 mean (4, -2) x1; class 2 nobody.
    # c_0 = (2 (1, 1) + (4, -2)) / 3 = (2, 0); c_1 = (0, 2); class 2 absent
    means = torch.tensor([[[1.0, 1.0], [0.0, 2.0], [0.0, 0.0]], [[4.0, -2.0], [0.0, 0.0], [0.0, 0.0]]])
    counts = torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    cent, present = class_centroids(means, counts)
    assert torch.allclose(cent, torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]])) and present.tolist() == \
        [True, True, False]


# ---------------------------------------------------------------------------------------------- driver hooks
def _algo(tmp_path, *overrides: str):
    cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="fedpac") + list(overrides))
    return get_algorithm("fedpac")(cfg)


def _update(cid: int, n: int, head_w: float, v: float, h: np.ndarray, means, counts) -> ClientUpdate:
    return ClientUpdate(cid, {"model": {"backbone.w": torch.full((2,), float(cid))},
                              "head": {"head.weight": torch.full((1, 2), head_w), "head.bias": torch.zeros(1)},
                              "means": torch.tensor(means, dtype=torch.float32),
                              "counts": torch.tensor(counts, dtype=torch.float32),
                              "v": torch.tensor([v]), "h": torch.tensor(h, dtype=torch.float32)}, n, 0.0)


def test_server_aggregate_and_per_client_payloads(tmp_path):
    algo = _algo(tmp_path)
    state = algo.init_server_state({"backbone.w": torch.zeros(2), "head.weight": torch.zeros(1, 2),
                                    "head.bias": torch.zeros(1)})
    assert set(state["model"]) == {"backbone.w"} and algo.client_payload(state, 0, 1) is None
    assert "centroids" not in algo.server_payload(state, 1)  # round 1: no alignment target yet
    hs = _two_alike_one_far(3.0)
    m = [[[1.0, 1.0], [0.0, 2.0], [0.0, 0.0]], [[4.0, -2.0], [0.0, 0.0], [0.0, 0.0]], [[0.0] * 2] * 3]
    c = [[2, 1, 0], [1, 0, 0], [0, 0, 0]]
    ups = [_update(cid, n, w, 1.0, hs[i], m[i], c[i]) for i, (cid, n, w) in enumerate([(1, 10, 9.0), (3, 30, 0.0),
                                                                                         (7, 60, 90.0)])]
    state = algo.server_aggregate(ups, state, 1)
    assert torch.allclose(state["model"]["backbone.w"], torch.full((2,), (10 + 90 + 420) / 100))  # by samples
    assert torch.allclose(state["centroids"][:2], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    # client 1 (index 0): 4/9 * 9 + 4/9 * 0 + 1/9 * 90 = 14; client 7: (9 + 0 + 7 * 90) / 9 = 71
    assert float(algo.client_payload(state, 1, 2)["head"]["head.weight"][0, 0]) == pytest.approx(14.0, abs=1e-4)
    assert float(algo.client_payload(state, 7, -1)["head"]["head.weight"][0, 0]) == pytest.approx(71.0, abs=1e-4)
    assert algo.client_payload(state, 2, 2) is None  # never sampled: keeps what it has
    assert algo.on_round_end(1, {}, state)["fedpac/self_weight"] == pytest.approx((4 / 9 + 4 / 9 + 7 / 9) / 3,
                                                                                abs=1e-5)
    assert set(algo.server_payload(state, 2)) == {"model", "centroids", "present"}
    # a later round without client 7: its combined head stays for its next download
    state = algo.server_aggregate(ups[:2], state, 2)
    assert float(algo.client_payload(state, 7, 3)["head"]["head.weight"][0, 0]) == pytest.approx(71.0, abs=1e-4)
    torch.save(state, tmp_path / "s.pt")
    assert 7 in torch.load(tmp_path / "s.pt", weights_only=True)["heads"]  # checkpointable



def test_client_hooks_load_own_head_and_align_with_fallback(tmp_path):
    from raysim.algorithms.base import ClientContext
    from raysim.algorithms.fedpac import PRE_KEY
    from raysim.models import build_model

    algo = _algo(tmp_path)
    model = build_model(algo.cfg, "mlp", (64,), 10)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 64, generator=g), torch.tensor([0, 1, 2] * 4)
    backbone = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("backbone.")}
    head = {"head.weight": torch.ones(10, 16), "head.bias": torch.zeros(10)}
    cent = torch.randn(10, 16, generator=g)
    present = torch.zeros(10, dtype=torch.bool)
    present[0] = True  # only class 0 was reported last round: classes 1 and 2 align to the client's own means
    payload = {"model": backbone, "head": head, "centroids": cent, "present": present}
    ctx = ClientContext(client_id=0, round=2, total_rounds=3, epoch=1, num_epochs=2, payload=payload,
                        num_classes=10, train_data=(x, y, torch.arange(12)),
                        state={"head.weight": torch.zeros(10, 16), "head.bias": torch.ones(10)})
    algo.client_setup(model, ctx)
    assert torch.equal(model.head.weight, head["head.weight"]) and torch.equal(model.head.bias, head["head.bias"])
    with torch.no_grad():
        feats = model.features(x)
    own = feature_statistics(feats, y, 10)
    assert torch.allclose(ctx.payload[PRE_KEY]["means"], own["means"])
    loss, parts = algo.client_loss(model, x, y, ctx)
    target = torch.stack([cent[0] if c == 0 else own["means"][c].float() for c in y.tolist()])
    assert float(parts["align"].detach()) == pytest.approx(float(((feats - target) ** 2).mean()), rel=1e-5)
    assert float(loss.detach()) == pytest.approx(float((parts["ce"] + parts["align"]).detach()), rel=1e-6)  # lam 1
    up = algo.client_upload(model, ctx)
    assert set(up) == {"model", "head", "means", "counts", "v", "h"} and up["counts"][:3].tolist() == [4, 4, 4]
    assert set(algo.client_keep(model, ctx)) == {"head.weight", "head.bias"}
    # evaluation: the combined head on the averaged backbone, no statistics pass
    ev = ClientContext(client_id=0, round=-1, total_rounds=3, epoch=0, num_epochs=0, payload={"model": backbone,
                       "head": head}, num_classes=10,
                       state={"head.weight": torch.zeros(10, 16), "head.bias": torch.ones(10)})
    algo.eval_setup(model, ev)
    assert torch.equal(model.head.weight, head["head.weight"]) and PRE_KEY not in ev.payload

def test_config_defaults_and_errors(tmp_path):
    c = _algo(tmp_path).config
    assert (c.lam, c.head_epochs, c.combine_heads, c.weight_eps) == (1.0, 1, True, 1e-3)
    for bad, key in [("algorithm.lam=-1", "algorithm.lam"), ("algorithm.head_epochs=-1", "algorithm.head_epochs"),
                     ("algorithm.weight_eps=1", "algorithm.weight_eps")]:
        with pytest.raises(ConfigError, match=f"'{key}'"):
            _algo(tmp_path, bad)


def test_bad_key_on_the_cli_exits_2_in_one_line(tmp_path):
    refused_config("algorithm.lam", str(ROOT / "experiments/unideal/digits-niid1-cpu/fedpac.yaml"),
                   "algorithm.lam=-0.5", f"log.dir={tmp_path / 'r'}")


def test_experiment_configs_load():
    for setting in ("digits-niid1", "digits-niid1-cpu", "digits-niid2", "digits-niid2-cpu", "tabular-niid1",
                    "tabular-niid2"):
        cfg = load_config(ROOT / "experiments/unideal" / setting / "fedpac.yaml")
        assert cfg.algorithm.name == "fedpac"
        if setting.startswith("digits"):
            assert (cfg.data.image_size, cfg.data.channels) == (32, 3) and not cfg.data.domains  # all three domains
        else:
            assert cfg.data.feature_layout == "shared"  # the sliced columns, in the shared column space


# ---------------------------------------------------------------------------------------------- whole runs
BACKBONE_BYTES = 4 * ((64 * 32 + 32) + (32 * 16 + 16))  # tiny_overrides' mlp: 64 -> 32 -> 16
HEAD_BYTES = 4 * (16 * 10 + 10)
CENTROID_BYTES = 4 * 16 * 10 + 10  # float32 [10, 16] centroids + bool [10] "present"
STATS_BYTES = 4 * (16 * 10 + 10 + 1 + 16 * 10)  # class means, label counts, v, h


def _run(tmp_path: Path, name: str, **extra) -> list[dict]:
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, tiny_overrides(tmp_path / name, algorithm__name="fedpac", rounds=3, clients__fraction=0.5,
                                           data__partition="dirichlet", train__momentum=0.9, **extra))
    run_dir, _, _ = run_experiment(cfg)
    return read_rows(run_dir)


def test_run_learns_and_counts_own_heads_per_client(tmp_path):
    from raysim.engine.sampling import sample_clients

    one = _run(tmp_path, "w1")
    assert all(math.isfinite(r["loss"]) for r in one)
    assert one[-1]["acc_mean"] > 0.3  # chance is 0.1; seeds 0-4 reach 0.32 to 0.76
    assert "acc_global" not in one[-1] and {"loss_ce", "loss_align", "fedpac/self_weight"} <= set(one[-1])
    assert "loss_align" not in one[0]  # no centroids before the first aggregation
    # per round: every sampled client downloads backbone (+ centroids after round 1); those sampled before also
    # download their own combined head, counted once per such client
    seen: set[int] = set()
    for r in one:
        sampled = sample_clients(0, r["round"], 4, 0.5)
        shared = BACKBONE_BYTES + (CENTROID_BYTES if r["round"] > 1 else 0)
        assert r["bytes_down"] == len(sampled) * shared + HEAD_BYTES * len(seen & set(sampled)), r
        assert r["bytes_up"] == len(sampled) * (BACKBONE_BYTES + HEAD_BYTES + STATS_BYTES)
        seen |= set(sampled)
    assert any(seen & set(sample_clients(0, r, 4, 0.5)) for r in (2, 3))  # the test exercises a per-client head
    # without classifier collaboration nothing is sent per client
    own = _run(tmp_path, "own", algorithm__combine_heads="false")
    assert [r["bytes_down"] for r in own] == [len(sample_clients(0, r["round"], 4, 0.5)) *
                                              (BACKBONE_BYTES + (CENTROID_BYTES if r["round"] > 1 else 0))
                                              for r in own]
