"""The model zoo: small-input stems, any channel count, a common feature width, per-client HETE MLPs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from raysim.config import load_config
from raysim.errors import UserError
from raysim.models import build_model, model_key
from raysim.models.zoo import hete_widths

IMAGE_ARCHS = ["resnet18", "resnet10", "mobilenet_v3_small", "mobilenet_v2", "vgg11_bn"]


@pytest.mark.parametrize("arch", IMAGE_ARCHS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_image_backbones_end_in_feature_dim(arch, shape):
    cfg = load_config(None, ["model.feature_dim=24"])
    model = build_model(cfg, arch, shape, num_classes=10).eval()
    x = torch.randn(2, *shape)
    assert model.features(x).shape == (2, 24)
    assert model(x).shape == (2, 10)
    assert {k.split(".")[0] for k in model.state_dict()} == {"backbone", "head"}


def test_same_architecture_same_initial_weights_and_head_is_5130_floats():
    cfg = load_config(None, ["model.feature_dim=512"])
    a = build_model(cfg, "resnet18", (3, 32, 32), 10)
    b = build_model(cfg, "resnet18", (3, 32, 32), 10)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert sum(p.numel() for p in a.head.parameters()) == 5130
    # resnet18's natural width is 512: no adapter; with another width there is one
    assert not any(isinstance(m, torch.nn.Linear) for m in a.backbone.modules())
    c = build_model(load_config(None, ["model.feature_dim=64"]), "resnet18", (3, 32, 32), 10)
    assert isinstance(c.backbone[-1], torch.nn.Linear) and c.backbone[-1].out_features == 64


def test_resnet10_has_one_block_per_stage():
    cfg = load_config(None, ["model.feature_dim=512"])
    net = build_model(cfg, "resnet10", (3, 32, 32), 10).backbone
    assert [len(getattr(net, f"layer{i}")) for i in range(1, 5)] == [1, 1, 1, 1]


def test_non_image_input_is_a_user_error():
    cfg = load_config(None, [])
    with pytest.raises(UserError, match="model.name"):
        build_model(cfg, "resnet18", (30,), 2)


def test_mlp_hete_draws_architectures_per_client_reproducibly():
    cfg = load_config(None, ["model.feature_dim=16", "seed=3"])
    draws = [hete_widths(3, c) for c in range(6)]
    assert draws == [hete_widths(3, c) for c in range(6)]
    assert len({tuple(d) for d in draws}) > 1  # not all the same
    for c in range(3):
        model = build_model(cfg, "mlp_hete", (7,), 2, client_id=c)
        linears = [m for m in model.backbone if isinstance(m, torch.nn.Linear)]
        assert [m.out_features for m in linears] == [*draws[c], 16]
        assert model(torch.randn(4, 7)).shape == (4, 2)
    assert hete_widths(4, 0) != hete_widths(3, 0) or hete_widths(4, 1) != hete_widths(3, 1)


def test_model_key_separates_clients_only_for_per_client_models():
    data = SimpleNamespace(input_shape=lambda c: (5,))
    hete = load_config(None, ["model.name=mlp_hete"])
    plain = load_config(None, ["model.name=mlp"])
    assert model_key(hete, data, 0) != model_key(hete, data, 1)
    assert model_key(plain, data, 0) == model_key(plain, data, 1)


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_cnn_bn_is_cnn_with_batch_norm_after_each_convolution_and_the_feature_layer(shape):
    from raysim.algorithms.base import batchnorm_keys

    cfg = load_config(None, ["model.feature_dim=12", "model.width=4"])
    plain, bn = build_model(cfg, "cnn", shape, 10), build_model(cfg, "cnn_bn", shape, 10)
    norms = [m for m in bn.backbone if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert [m.num_features for m in norms] == [4, 8, 12]
    # the same convolutions and linear layers as cnn, nothing else but the norms
    weights = {k: v.shape for k, v in plain.state_dict().items()}
    assert sorted(weights.values()) == sorted(v.shape for k, v in bn.state_dict().items()
                                              if k not in batchnorm_keys(bn.state_dict()))
    x = torch.randn(3, *shape)
    logits, stages = bn.forward_stages(x)
    assert logits.shape == (3, 10) and [s.shape[1] for s in stages] == [4, 8, 12]
    assert torch.allclose(logits, bn(x))
