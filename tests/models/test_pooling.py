"""Adaptive pooling a deterministic GPU run can train through (raysim.models.pooling): the same averages and
gradients as torch's kernel, and every image model of the zoo trains where that kernel is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raysim.config import load_config
from raysim.models import build_model, pooling
from raysim.models.pooling import DeterministicAdaptiveAvgPool2d, adaptive_avg_pool2d_by_matmul


@pytest.mark.parametrize("shape,out", [((2, 3, 14, 14), 4), ((2, 3, 16, 16), 4), ((1, 5, 7, 7), 1),
                                       ((2, 2, 5, 9), (3, 2)), ((1, 1, 6, 4), (None, 3)), ((1, 2, 3, 3), 5)])
def test_the_matmul_pooling_is_torchs_pooling(shape, out):
    """Uneven, overlapping windows (14 -> 4), even ones, the global mean, rectangles, a kept side, upsampling."""
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    ours, theirs = adaptive_avg_pool2d_by_matmul(x, out), F.adaptive_avg_pool2d(x, out)
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=0, atol=1e-12)
    g = torch.randn_like(theirs)
    (ga,) = torch.autograd.grad(ours, x, g)
    (gb,) = torch.autograd.grad(theirs, x, g)
    assert torch.allclose(ga, gb, rtol=0, atol=1e-12)


def test_on_the_cpu_the_module_is_torchs_kernel_bit_for_bit():
    pool = DeterministicAdaptiveAvgPool2d(4)
    x = torch.randn(2, 3, 14, 14)
    with torch.no_grad():
        assert torch.equal(pool(x), F.adaptive_avg_pool2d(x, 4))  # CPU numbers unchanged, deterministic or not


IMAGE_MODELS = ["cnn", "resnet10", "resnet18", "mobilenet_v2", "mobilenet_v3_small", "vgg11_bn"]


@pytest.mark.parametrize("arch", IMAGE_MODELS)
def test_every_image_model_trains_where_adaptive_pooling_is_refused(arch, monkeypatch):
    """As on a GPU under engine.deterministic: torch's adaptive pooling raises (its CUDA backward has no
    deterministic kernel), and the models built by the engine still take a training step."""
    def refused(*args, **kwargs):
        raise RuntimeError("adaptive_avg_pool2d_backward_cuda does not have a deterministic implementation")

    cfg = load_config(None, [f"model.name={arch}", "model.feature_dim=16"])
    model = build_model(cfg, arch, (3, 28, 28), 10)
    monkeypatch.setattr(F, "adaptive_avg_pool2d", refused)
    monkeypatch.setattr(pooling, "needs_deterministic_pool", lambda x: True)  # what a CUDA tensor would say
    loss = F.cross_entropy(model(torch.randn(2, 3, 28, 28)), torch.tensor([1, 2]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert any(isinstance(m, DeterministicAdaptiveAvgPool2d) for m in model.modules())
