"""Ditto: the proximal personal step by hand, one optimiser step on the joint loss = the authors' two steps, what
travels and what stays, prediction, the per-client λ selection by hand (and the held-out split and the step it
chooses), bad values, and a run on Ray (one vs two workers with one killed: the personal model is client state)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import context, killed_worker_matches_inline, refused_config, tiny_overrides

import raysim
from raysim.algorithms.ditto import VALIDATION, select_lam
from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm


def _setup(*extra: str):
    cfg = load_config(None, ["algorithm.name=ditto", "model.name=mlp", "model.hidden=[4]", "model.feature_dim=3",
                             *extra])
    algo = get_algorithm("ditto")(cfg)
    return algo, build_model(cfg, "mlp", (2,), 2, algorithm=algo)


def test_personal_model_starts_as_the_initial_model_and_stays_on_the_client():
    algo, model = _setup()
    glob = {k: v for k, v in model.state_dict().items() if not k.startswith("personal.")}
    assert all(torch.equal(model.state_dict()[f"personal.{k}"], v) for k, v in glob.items())
    ctx = context()
    assert set(algo.client_upload(model, ctx)) == set(glob)
    assert set(algo.client_keep(model, ctx)) == {f"personal.{k}" for k in glob}
    assert set(algo.init_server_state(model.state_dict())["model"]) == set(glob)


def test_the_proximal_personal_step_by_hand():
    # The personal model v is the download w^t except for its head, moved by d (below). λ = 2:
    #   (λ/2)‖v − w^t‖² = ‖d‖² = 0.5² + 0.5² + 0.25² + 0.1² + 0.1² = 0.25 + 0.25 + 0.0625 + 0.01 + 0.01 = 0.5825
    #   its gradient in v is λ·d = 2d (the head's bias: (0.2, -0.2)), in w^t nothing
    algo, model = _setup("algorithm.lam=2")
    download = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("personal.")}
    d = {"head.weight": torch.tensor([[0.5, 0.0, -0.5], [0.0, 0.25, 0.0]]), "head.bias": torch.tensor([0.1, -0.1])}
    with torch.no_grad():
        for name, delta in d.items():
            model.personal.get_parameter(name).add_(delta)
    x, y = torch.tensor([[1.0, -1.0], [0.5, 2.0]]), torch.tensor([0, 1])
    ctx = context(payload={"model": download})
    loss, parts = algo.client_loss(model, x, y, ctx)
    assert parts["prox"].item() == pytest.approx(0.5825, abs=1e-6)
    assert parts["ce"].item() == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-6)
    assert parts["personal"].item() == pytest.approx(F.cross_entropy(model.personal(x), y).item(), rel=1e-6)
    assert loss.item() == pytest.approx(parts["ce"].item() + parts["personal"].item() + 0.5825, rel=1e-6)

    # one SGD step (lr 0.1) on the joint loss = the authors' two steps on the same batch:
    #   v ← v − 0.1·(∇CE(v) + λ(v − w^t)),   w ← w − 0.1·∇CE(w)   (w^t fixed: the download is never changed)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    grads_v = torch.autograd.grad(F.cross_entropy(model.personal(x), y), list(model.personal.parameters()))
    grads_w = torch.autograd.grad(F.cross_entropy(model(x), y), [p for k, p in model.named_parameters()
                                                                 if not k.startswith("personal.")])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    for (name, p), g in zip(model.personal.named_parameters(), grads_v):
        expected = before[f"personal.{name}"] - 0.1 * (g + 2 * (before[f"personal.{name}"] - download[name]))
        assert torch.allclose(p, expected, atol=1e-6), name
    for (name, p), g in zip([(k, p) for k, p in model.named_parameters() if not k.startswith("personal.")], grads_w):
        assert torch.allclose(p, before[name] - 0.1 * g, atol=1e-6), name
    assert all(torch.equal(ctx.payload["model"][k], v) for k, v in download.items())
    bias_grad = grads_v[[n for n, _ in model.personal.named_parameters()].index("head.bias")]
    assert torch.allclose(model.personal.head.bias, before["personal.head.bias"]
                          - 0.1 * (bias_grad + torch.tensor([0.2, -0.2])), atol=1e-6)


def test_prediction_personal_or_global():
    algo, model = _setup()
    with torch.no_grad():
        model.personal.head.bias.add_(5.0)
    x = torch.randn(3, 2)
    assert torch.allclose(algo.predict(model, x, context()), model.personal(x))
    glob, _ = _setup("algorithm.predict=global")
    assert torch.allclose(glob.predict(model, x, context()), model(x))
    assert not algo.has_global_model and glob.has_global_model


def test_lam_selection_by_hand():
    # One personal parameter v = 2, the download w^t = 0, its gradient g = 1, lr = 0.5; candidates 0.1, 1, 2:
    #   look-ahead v' = 2 - 0.5·(1 + λ·2) = 1.4, 0.5, -0.5
    #   validation loss (v' - 0.6)² = 0.64, 0.01, 1.21 -> λ = 1;  (v' + 1)² = 5.76, 2.25, 0.25 -> λ = 2
    v, w, g = {"a": torch.tensor([2.0])}, {"a": torch.tensor([0.0])}, [torch.tensor([1.0])]
    lam, losses = select_lam(v, g, w, [0.1, 1.0, 2.0], 0.5, lambda p: ((p["a"] - 0.6) ** 2).sum())
    assert lam == 1.0 and losses == pytest.approx([0.64, 0.01, 1.21])
    assert select_lam(v, g, w, [0.1, 1.0, 2.0], 0.5, lambda p: ((p["a"] + 1) ** 2).sum())[0] == 2.0
    # ties keep the earlier candidate (the authors' strict <); a NaN loss never wins
    assert select_lam(v, g, w, [0.1, 1.0, 2.0], 0.5, lambda p: torch.tensor(3.0))[0] == 0.1
    nan_first = lambda p: torch.tensor(float("nan")) if p["a"].item() > 1 else ((p["a"] + 1) ** 2).sum()  # noqa: E731
    assert select_lam(v, g, w, [0.1, 1.0, 2.0], 0.5, nan_first)[0] == 2.0


def test_selected_lam_holds_out_the_tail_and_the_sgd_step_is_the_chosen_look_ahead():
    algo, model = _setup("algorithm.select_lam=true", "train.lr=0.5", "train.momentum=0", "train.weight_decay=0")
    torch.manual_seed(3)
    download = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("personal.")}
    with torch.no_grad():
        for p in model.personal.parameters():
            p.add_(0.5 * torch.randn_like(p))
    x, y = torch.randn(50, 2), torch.randint(0, 2, (50,))
    ctx = context(payload={"model": download}, train_data=(x, y, torch.arange(50)))
    algo.client_setup(model, ctx)
    # the last 10 % held out (the authors' train_data[int(0.9·n):]), the first 45 left to train on
    assert len(ctx.train_data[1]) == 45 and torch.equal(ctx.scratch[VALIDATION][0], x[45:])
    # the λ the loss uses is the candidate whose look-ahead has the least validation loss, computed here apart
    personal = model.personal
    before = {k: p.detach().clone() for k, p in personal.named_parameters()}
    xb, yb = ctx.train_data[0][:8], ctx.train_data[1][:8]
    grads = torch.autograd.grad(F.cross_entropy(personal(xb), yb), list(personal.parameters()))
    ahead = {lam: {k: v - 0.5 * (g + lam * (v - download[k])) for (k, v), g in zip(before.items(), grads)}
             for lam in (0.1, 1.0, 2.0)}
    personal.eval()
    val = {lam: F.cross_entropy(torch.func.functional_call(personal, a, (x[45:],)), y[45:]).item()
           for lam, a in ahead.items()}
    personal.train()
    chosen = min(val, key=val.get)
    loss, parts = algo.client_loss(model, xb, yb, ctx)
    dist = sum(((before[k] - download[k]) ** 2).sum() for k in before)
    assert parts["prox"].item() == pytest.approx(chosen / 2 * dist.item(), rel=1e-5)
    # one plain SGD step on the joint loss moves v to the chosen look-ahead
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert all(torch.allclose(p, ahead[chosen][k], atol=1e-6) for k, p in personal.named_parameters())


def test_too_few_held_out_samples_keep_the_fixed_lam():
    # 30 samples: 27 to train on, 3 held out (< 4): λ = algorithm.lam (the paper's fallback), no look-ahead
    algo, model = _setup("algorithm.select_lam=true", "algorithm.lam=0.7")
    download = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("personal.")}
    x, y = torch.randn(30, 2), torch.randint(0, 2, (30,))
    ctx = context(payload={"model": download}, train_data=(x, y, torch.arange(30)))
    algo.client_setup(model, ctx)
    assert len(ctx.train_data[1]) == 27 and VALIDATION not in ctx.scratch
    assert algo.client_lam(model.personal, F.cross_entropy(model.personal(x), y), ctx) == 0.7


def test_selected_lam_runs_and_learns_and_refuses_cohorts(tmp_path):
    rows = raysim.run(None, *tiny_overrides(tmp_path, rounds=3), "algorithm.name=ditto", "algorithm.select_lam=true",
                      progress=False).metrics
    # (fixed λ = 1 here: acc_mean 0.15, 0.29, 0.38; with the selection 0.16, 0.24, 0.36; chance 0.1)
    assert rows["acc_mean"].is_monotonic_increasing and rows["acc_mean"].iloc[-1] > 0.25
    assert (rows["loss_prox"] > 0).all()
    refused_config("algorithm.select_lam", *tiny_overrides(tmp_path / "v"), "algorithm.name=ditto",
                   "algorithm.select_lam=true", "engine.vectorize=4")


def test_defaults_and_bad_values(tmp_path):
    a = load_config(None, ["algorithm.name=ditto"]).algorithm
    assert (a.lam, a.predict, a.select_lam, a.lam_candidates, a.val_fraction) == (1.0, "personal", False,
                                                                                  [0.1, 1.0, 2.0], 0.1)
    for override, key in (("algorithm.lam_candidates=[]", "algorithm.lam_candidates"),
                          ("algorithm.lam_candidates=[-1]", "algorithm.lam_candidates"),
                          ("algorithm.val_fraction=1", "algorithm.val_fraction")):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            load_config(None, ["algorithm.name=ditto", override])
    with pytest.raises(ConfigError, match="'algorithm.predict'"):
        load_config(None, ["algorithm.name=ditto", "algorithm.predict=both"])
    refused_config("algorithm.lam", *tiny_overrides(tmp_path), "algorithm.name=ditto", "algorithm.lam=-1")
    assert not (tmp_path / "run").exists()


def test_ditto_on_ray_matches_one_worker_with_a_worker_killed(ray_cluster, tmp_path):
    rows = killed_worker_matches_inline(tmp_path, algorithm__name="ditto")
    for r in rows:
        assert "acc_global" not in r and r["loss_prox"] > 0
        assert r["loss"] == pytest.approx(r["loss_ce"] + r["loss_personal"] + r["loss_prox"], rel=1e-6)
    assert rows[-1]["acc_mean"] > 0.2
