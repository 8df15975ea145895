"""FedRoD: balanced softmax by hand, which term trains what, prediction = generic + personal, tiny runs on Ray."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import read_rows, refused_config, tiny_overrides

from raysim.algorithms.base import ClientContext
from raysim.algorithms.fedrod import balanced_softmax_loss, label_prior
from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm


# ---------------------------------------------------------------------------------------------- the math (no Ray)
def test_balanced_softmax_by_hand():
    # logits z = (1, 0, 0), prior pi = (0.5, 0.25, 0.25), label y = 1
    #   z + log pi = (1 + ln 0.5, ln 0.25, ln 0.25)
    #   softmax denominator: pi_c e^{z_c} summed = 0.5 e + 0.25 + 0.25 = 0.5 * 2.718282 + 0.5 = 1.859141
    #   loss = -ln(0.25 * e^0 / 1.859141) = ln(7.436564) = 2.006409
    # plain CE for comparison: -ln(1 / (e + 2)) = ln(4.718282) = 1.551445: the prior moves mass towards class 0
    z, y, pi = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([1]), torch.tensor([0.5, 0.25, 0.25])
    assert balanced_softmax_loss(z, y, pi).item() == pytest.approx(2.006409, abs=1e-5)
    assert F.cross_entropy(z, y).item() == pytest.approx(1.551445, abs=1e-5)
    # a uniform prior is plain CE (log(1/3) shifts every logit equally)
    assert balanced_softmax_loss(z, y, torch.full((3,), 1 / 3)).item() == pytest.approx(1.551445, abs=1e-5)
    # batch mean: the second sample (z = (0, 0, 0), y = 0): -ln(0.5 / 1) = ln 2 = 0.693147 -> mean 1.349778
    z2, y2 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), torch.tensor([1, 0])
    assert balanced_softmax_loss(z2, y2, pi).item() == pytest.approx((2.006409 + math.log(2)) / 2, abs=1e-5)


def test_label_prior_counts_absent_classes_as_1e_12():
    # labels: class 0 twice, class 1 six times, class 2 never -> (2/8, 6/8, ~1.25e-13)
    prior = label_prior(torch.tensor([0, 1, 1, 0, 1, 1, 1, 1]), 3)
    assert prior[:2].tolist() == pytest.approx([0.25, 0.75]) and 0 < prior[2].item() < 1e-12


def _setup(*extra: str):
    cfg = load_config(None, ["algorithm.name=fedrod", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=6",
                             *extra])
    algo = get_algorithm("fedrod")(cfg)
    model = build_model(cfg, "mlp", (5,), 3, algorithm=algo)
    torch.manual_seed(1)
    x, y = torch.randn(6, 5), torch.tensor([0, 0, 0, 0, 1, 2])
    ctx = ClientContext(client_id=0, round=1, total_rounds=1, epoch=0, num_epochs=1, payload={}, num_classes=3,
                        train_data=(x, y, torch.arange(6)))
    return cfg, algo, model, ctx, x, y


def test_the_two_terms_train_disjoint_parts_and_predict_adds_the_heads():
    cfg, algo, model, ctx, x, y = _setup()
    assert torch.equal(model.phead.weight, model.head.weight)  # p_k starts as a copy of the initial generic head
    assert all(not k.startswith("phead.") for k in algo.client_upload(model, ctx))
    assert set(algo.client_keep(model, ctx)) == {"phead.weight", "phead.bias"}
    with torch.no_grad():
        model.phead.weight.add_(0.5)
    loss, parts = algo.client_loss(model, x, y, ctx)
    feats = model.features(x)
    bsm = balanced_softmax_loss(model.head(feats), y, torch.tensor([4 / 6, 1 / 6, 1 / 6]))
    personal = F.cross_entropy(model.head(feats) + model.phead(feats), y)
    assert parts["bsm"].item() == pytest.approx(bsm.item(), rel=1e-6)
    assert parts["personal"].item() == pytest.approx(personal.item(), rel=1e-6)
    assert loss.item() == pytest.approx(bsm.item() + personal.item(), rel=1e-6)
    # the personal term reaches the personal head only; the balanced term never reaches it
    parts["personal"].backward(retain_graph=True)
    assert model.phead.weight.grad is not None and model.head.weight.grad is None
    assert all(p.grad is None for p in model.backbone.parameters())
    model.zero_grad(set_to_none=True)
    parts["bsm"].backward()
    assert model.phead.weight.grad is None and model.head.weight.grad is not None
    # prediction: generic + personal logits; predict=generic: the generic model alone
    with torch.no_grad():
        assert torch.allclose(algo.predict(model, x, ctx), model.head(feats) + model.phead(feats))
        generic = get_algorithm("fedrod")(load_config(None, ["algorithm.name=fedrod", "algorithm.predict=generic"]))
        assert torch.allclose(generic.predict(model, x, ctx), model(x))
    assert not algo.has_global_model and generic.has_global_model


def test_config_default_and_bad_predict():
    assert load_config(None, ["algorithm.name=fedrod"]).algorithm.predict == "personal"
    with pytest.raises(ConfigError, match="'algorithm.predict'"):
        load_config(None, ["algorithm.name=fedrod", "algorithm.predict=both"])


def test_cli_bad_predict_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.predict", *tiny_overrides(tmp_path), "algorithm.name=fedrod", "algorithm.predict=both")


# ---------------------------------------------------------------------------------------------- a whole run
def test_fedrod_run_keeps_the_personal_head_and_learns(tmp_path):
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="fedrod", train__local_epochs=2,
                                           data__partition="dirichlet", data__alpha=0.3))
    run_dir, _, _ = run_experiment(cfg)
    one = read_rows(run_dir)
    assert [r["round"] for r in one] == [1, 2]
    for r in one:
        assert {"acc_mean", "loss", "loss_bsm", "loss_personal", "bytes_up", "bytes_down"} <= set(r)
        assert "acc_global" not in r
        assert r["loss"] == pytest.approx(r["loss_bsm"] + r["loss_personal"], rel=1e-6)
        # body + generic head travel (64*32 + 32 + 32*16 + 16 + 16*10 + 10 floats per client), the personal head not
        assert r["bytes_up"] == r["bytes_down"] == 4 * (64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10) * 4
    assert one[-1]["acc_mean"] > 0.5  # chance is 0.1
