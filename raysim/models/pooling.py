"""Adaptive average pooling that a deterministic GPU run can train through.

Under ``torch.use_deterministic_algorithms`` (``engine.deterministic``, the default on a GPU) CUDA's backward of
``adaptive_avg_pool2d`` raises, for want of a deterministic kernel: ResNets, MobileNets, VGG and the small CNN all
end in one. :func:`deterministic_pooling` makes every ``nn.AdaptiveAvgPool2d`` of a built model a
:class:`DeterministicAdaptiveAvgPool2d`, which pools by two small matrix products there (a mean for the usual 1x1
output) and keeps torch's own kernel everywhere else, so CPU numbers do not change. The values are the same averages
(equal up to float rounding); gradients then come from matmuls, which cuBLAS computes deterministically.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def needs_deterministic_pool(x: torch.Tensor) -> bool:
    """Where torch's adaptive pooling cannot be trained through: deterministic algorithms on, input off the CPU."""
    return x.device.type != "cpu" and torch.are_deterministic_algorithms_enabled()


def pooling_matrix(n_in: int, n_out: int, like: torch.Tensor) -> torch.Tensor:
    """[n_out, n_in]: row i averages the inputs of adaptive pooling's window i, floor(i·n/m) to ceil((i+1)·n/m)."""
    rows = torch.zeros(n_out, n_in, dtype=like.dtype, device=like.device)
    for i in range(n_out):
        start, end = (i * n_in) // n_out, math.ceil((i + 1) * n_in / n_out)
        rows[i, start:end] = 1.0 / (end - start)
    return rows


def adaptive_avg_pool2d_by_matmul(x: torch.Tensor, output_size) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, output_size)`` as ``P_h @ x @ P_wᵀ`` (a mean over the last two dimensions for a
    1x1 output)."""
    h, w = x.shape[-2:]
    oh, ow = output_size if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    oh, ow = oh if oh is not None else h, ow if ow is not None else w
    if (oh, ow) == (1, 1):
        return x.mean(dim=(-2, -1), keepdim=True)
    return pooling_matrix(h, oh, x) @ x @ pooling_matrix(w, ow, x).T


class DeterministicAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` (same output size, no parameters) that a deterministic GPU run trains through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if needs_deterministic_pool(x):
            return adaptive_avg_pool2d_by_matmul(x, self.output_size)
        return super().forward(x)


def deterministic_pooling(model: nn.Module) -> nn.Module:
    """``model`` with each of its ``nn.AdaptiveAvgPool2d`` modules a :class:`DeterministicAdaptiveAvgPool2d`."""
    for module in model.modules():
        if type(module) is nn.AdaptiveAvgPool2d:
            module.__class__ = DeterministicAdaptiveAvgPool2d
    return model
