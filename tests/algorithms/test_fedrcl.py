"""FedRCL: the relaxed contrastive loss by hand, the models' stage features, tiny runs on the shared Ray."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import read_rows, refused_config, tiny_overrides

from raysim.algorithms.base import ClientContext
from raysim.algorithms.fedrcl import relaxed_contrastive_loss
from raysim.config import ConfigError, load_config
from raysim.errors import UserError
from raysim.models import build_model, has_stages
from raysim.registry import get_algorithm


def lse1(*xs: float) -> float:
    """log(1 + Σ e^x)."""
    return math.log(1 + sum(math.exp(x) for x in xs))


# ---------------------------------------------------------------------------------------------- the loss (no Ray)
def test_relaxed_contrastive_loss_by_hand():
    # four unit vectors, classes [0, 0, 1, 1]:
    #   h0 = (1, 0), h1 = (0.8, 0.6), h2 = (-0.6, 0.8), h3 = (0.6, 0.8)
    # cosine similarities s_ij = h_i . h_j:
    #   s01 = 0.8, s02 = -0.6, s03 = 0.6, s12 = -0.48 + 0.48 = 0, s13 = 0.48 + 0.48 = 0.96, s23 = -0.36 + 0.64 = 0.28
    # tau = 0.1, lambda = 0.7, topk_pos = 1, topk_neg = 2; every row is -log softmax([pos, negs]/tau)[0]
    #   = log(1 + sum_n e^{(n - pos)/tau})
    # L_SCL: pos = least similar same-class sample (itself, s_ii = 1, included); negs = 2 most similar other-class
    #   i=0: pos = min(1, .8) = .8; negs {s03, s02} = {.6, -.6}  -> log(1 + e^{-2} + e^{-14})
    #   i=1: pos = .8;               negs {s13, s12} = {.96, 0}   -> log(1 + e^{1.6} + e^{-8})
    #   i=2: pos = min(1, .28) = .28; negs {s12, s02} = {0, -.6}  -> log(1 + e^{-2.8} + e^{-8.8})
    #   i=3: pos = .28;              negs {s13, s03} = {.96, .6}  -> log(1 + e^{6.8} + e^{3.2})
    # L_Div: pos = s_ii = 1; neg = the least similar other same-class sample if >= lambda, else -1
    #   i=0, 1: partner s01 = .8 >= .7 -> log(1 + e^{(.8 - 1)/.1}) = log(1 + e^{-2})
    #   i=2, 3: partner s23 = .28 < .7 -> -1 -> log(1 + e^{(-1 - 1)/.1}) = log(1 + e^{-20})
    h = torch.tensor([[1.0, 0.0], [0.8, 0.6], [-0.6, 0.8], [0.6, 0.8]])
    y = torch.tensor([0, 0, 1, 1])
    scl, div = relaxed_contrastive_loss(h, y, tau=0.1, threshold=0.7, topk_pos=1, topk_neg=2)
    expected_scl = (lse1(-2, -14) + lse1(1.6, -8) + lse1(-2.8, -8.8) + lse1(6.8, 3.2)) / 4
    expected_div = (2 * lse1(-2) + 2 * lse1(-20)) / 4
    assert scl.item() == pytest.approx(expected_scl, rel=1e-5)  # = 2.2373...
    assert div.item() == pytest.approx(expected_div, rel=1e-5)  # = 0.0635...
    # scaling a feature does not change cosines
    scl2, div2 = relaxed_contrastive_loss(h * torch.tensor([[3.0], [1.0], [2.0], [0.5]]), y, 0.1, 0.7)
    assert scl2.item() == pytest.approx(expected_scl, rel=1e-5) and div2.item() == pytest.approx(expected_div, rel=1e-5)
    # topk_neg = 1 keeps only the hardest negative: rows become log(1 + e^{-2}), log(1 + e^{1.6}), log(1 + e^{-2.8}),
    # log(1 + e^{6.8})
    scl1, _ = relaxed_contrastive_loss(h, y, tau=0.1, threshold=0.7, topk_neg=1)
    assert scl1.item() == pytest.approx((lse1(-2) + lse1(1.6) + lse1(-2.8) + lse1(6.8)) / 4, rel=1e-5)


def test_divergence_penalty_acts_only_above_the_threshold():
    torch.manual_seed(0)
    y = torch.tensor([0, 0, 0, 1, 1])
    # same-class features all within a narrow cone: every partner similarity > 0.9
    base = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    h = (base + 0.05 * torch.randn(5, 3)).requires_grad_(True)
    _, div = relaxed_contrastive_loss(h, y, tau=0.05, threshold=0.7)
    div.backward()
    assert div.item() > 0.1 and h.grad.abs().sum() > 0  # collapsed pairs are pushed apart
    h.grad = None
    _, div = relaxed_contrastive_loss(h, y, tau=0.05, threshold=0.999)  # relaxed: nothing is above the threshold
    div.backward()
    assert div.item() < 1e-15 and h.grad.abs().sum() == 0
    # a sample alone in its class has no partner: no penalty, no NaN
    _, div = relaxed_contrastive_loss(torch.randn(3, 4), torch.tensor([0, 1, 2]), 0.05, 0.7)
    assert div.item() < 1e-15 and torch.isfinite(div)


# ---------------------------------------------------------------------------------------------- stage features
@pytest.mark.parametrize("arch,shape,count", [("mlp", (1, 8, 8), 2), ("cnn", (1, 8, 8), 3),
                                              ("resnet10", (3, 16, 16), 5), ("resnet18", (3, 16, 16), 5),
                                              ("mlp_hete", (7,), None)])
def test_stage_features_do_not_change_the_model(arch, shape, count):
    cfg = load_config(None, ["model.feature_dim=24", "model.hidden=[16]"])
    model = build_model(cfg, arch, shape, 5).eval()
    x = torch.randn(3, *shape)
    logits, stages = model.forward_stages(x)
    assert torch.allclose(logits, model(x), atol=1e-6)
    assert has_stages(arch) and all(s.dim() == 2 and len(s) == 3 for s in stages)
    if count is not None:
        assert len(stages) == count
    if arch == "mlp":  # pre-ReLU outputs of both Linear layers: hidden (16), then features (24)
        first = model.backbone[1](x.flatten(1))
        assert torch.equal(stages[0], first) and stages[1].shape == (3, 24)
        assert torch.equal(F.relu(stages[1]), model.features(x))
    if arch.startswith("resnet"):  # widths of the stem and the four layers, the stem before its ReLU
        assert [s.shape[1] for s in stages] == [64, 64, 128, 256, 512]
        net = model.backbone[0]  # feature_dim 24: the ResNet, then its linear adapter
        assert torch.allclose(stages[0], net.bn1(net.conv1(x)).mean(dim=(2, 3)), atol=1e-6)


def test_resnet18_weights_are_torchvisions():
    from torchvision import models as tvm

    from raysim.models import init_seed

    cfg = load_config(None, ["model.feature_dim=512"])
    ours = build_model(cfg, "resnet18", (3, 32, 32), 10).backbone.state_dict()
    torch.manual_seed(init_seed(cfg.seed, "resnet18:(3, 32, 32)"))  # build_model's seed, then the same draws
    theirs = tvm.resnet18(weights=None)
    theirs_sd = {k: v for k, v in theirs.state_dict().items() if not k.startswith(("conv1.", "fc."))}
    assert len(theirs_sd) > 100 and all(torch.equal(ours[k], v) for k, v in theirs_sd.items())


def test_models_without_stages_are_refused():
    cfg = load_config(None, ["model.feature_dim=8"])
    model = build_model(cfg, "vgg11_bn", (3, 16, 16), 5)
    with pytest.raises(UserError, match="model.name"):
        model.stage_features(torch.randn(2, 3, 16, 16))
    assert not has_stages("vgg11_bn") and not has_stages("mobilenet_v3_small")
    algo_cfg = load_config(None, ["algorithm.name=fedrcl", "model.name=vgg11_bn"])
    data = type("D", (), {"num_clients": 1, "input_shape": lambda self, c: (3, 16, 16), "num_classes": 5,
                          "input_shapes": lambda self: {(3, 16, 16)}})()
    with pytest.raises(UserError, match="'model.name': fedrcl needs a backbone with stage features"):
        get_algorithm("fedrcl")(algo_cfg).check(algo_cfg, data)
    algo_cfg = load_config(None, ["algorithm.name=fedrcl", "model.name=mlp", "algorithm.stages=[0,5]"])
    with pytest.raises(UserError, match="'algorithm.stages': mlp has 2 stages"):
        get_algorithm("fedrcl")(algo_cfg).check(algo_cfg, data)


def test_client_loss_is_ce_plus_the_mean_over_stages():
    cfg = load_config(None, ["algorithm.name=fedrcl", "model.hidden=[16]", "model.feature_dim=8",
                             "algorithm.penalty_weight=0.5"])
    algo = get_algorithm("fedrcl")(cfg)
    assert algo.clip_grad_norm == 10.0
    model = build_model(cfg, "mlp", (1, 8, 8), 3, algorithm=algo)
    torch.manual_seed(1)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    ctx = ClientContext(client_id=0, round=1, total_rounds=1, epoch=0, num_epochs=1, payload={})
    loss, parts = algo.client_loss(model, x, y, ctx)
    stages = model.stage_features(x)
    per = [relaxed_contrastive_loss(h, y, 0.05, 0.7, 1, 2) for h in stages]
    scl = sum(p[0] for p in per) / 2
    div = sum(p[1] for p in per) / 2
    ce = F.cross_entropy(model(x), y)
    assert parts["scl"].item() == pytest.approx(scl.item(), rel=1e-6)
    assert parts["div"].item() == pytest.approx(div.item(), rel=1e-6)
    assert loss.item() == pytest.approx(ce.item() + scl.item() + 0.5 * div.item(), rel=1e-6)


@pytest.mark.parametrize("key,value", [("tau", "0"), ("threshold", "2"), ("topk_neg", "0"), ("scl_weight", "-1"),
                                       ("stages", "[]"), ("clip_grad_norm", "0")])
def test_bad_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"'algorithm.{key}'"):
        load_config(None, ["algorithm.name=fedrcl", f"algorithm.{key}={value}"])


def test_cli_bad_threshold_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.threshold", *tiny_overrides(tmp_path), "algorithm.name=fedrcl", "algorithm.threshold=1.5")


# ---------------------------------------------------------------------------------------------- a whole run
def test_fedrcl_run_adds_both_terms_and_learns(tmp_path):
    from raysim.engine.runner import run_experiment

    run_dir, _, _ = run_experiment(load_config(None, tiny_overrides(tmp_path, rounds=2, algorithm__name="fedrcl",
                                                                    train__local_epochs=2)))
    rows = {1: read_rows(run_dir)}
    for r in rows[1]:
        assert {"acc_global", "acc_mean", "loss", "loss_ce", "loss_scl", "loss_div"} <= set(r)
        assert math.isfinite(r["loss"]) and r["loss_scl"] > 0
        assert r["loss"] == pytest.approx(r["loss_ce"] + r["loss_scl"] + r["loss_div"], rel=1e-6)
    assert rows[1][-1]["acc_global"] > 0.25  # chance is 0.1; seeds 0-4 reach 0.46 to 0.70
