"""Ditto: the proximal personal step by hand, one optimiser step on the joint loss = the authors' two steps, what
travels and what stays, prediction, bad values, and a run on Ray (one vs two workers with one killed: the personal
model is client state)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import context, killed_worker_matches_inline, refused_config, tiny_overrides

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


def test_defaults_and_bad_values(tmp_path):
    a = load_config(None, ["algorithm.name=ditto"]).algorithm
    assert (a.lam, a.predict) == (1.0, "personal")
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
