"""One input shape for every domain (``data.image_size``, ``data.channels``), applied once when the data is built.

Averaging methods (FedAvg, FedRep, ...) need every client's input to have one shape; the Digits domains differ
(MNIST 1x28x28, MNIST-M and SynthDigits 3x32x32). torchvision's transforms resize the uint8 pixels (bilinear,
antialiased) and repeat a grey channel into RGB (or reduce RGB to grey), then the per-channel statistics are
recomputed, so workers normalise the new pixels exactly as they would native ones.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from raysim.data.base import Domain, FederatedData, channel_stats
from raysim.errors import UserError

_CHUNK = 4096  # images converted at once (bounds the float copies resize makes)


def reshape_images(x: np.ndarray, size: Optional[int], channels: Optional[int]) -> np.ndarray:
    """[N, C, H, W] (uint8 or float) -> [N, channels, size, size] in the same dtype; None keeps that dimension."""
    from torchvision.transforms.v2 import functional as F

    n, c, h, w = x.shape
    out_c = channels or c
    side = (size, size) if size else (h, w)
    if out_c == c and side == (h, w):
        return x
    out = np.empty((n, out_c, *side), dtype=x.dtype)
    for start in range(0, n, _CHUNK):
        t = torch.from_numpy(np.ascontiguousarray(x[start:start + _CHUNK]))
        if side != (h, w):
            t = F.resize(t, list(side), antialias=True)
        if out_c != c:
            t = F.grayscale_to_rgb(t) if out_c == 3 else F.rgb_to_grayscale(t)
        out[start:start + _CHUNK] = t.numpy()
    return out


def _stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if x.dtype == np.uint8:
        return channel_stats(x)
    flat = x.transpose(1, 0, 2, 3).reshape(x.shape[1], -1).astype(np.float64)
    return flat.mean(axis=1).astype(np.float32), np.maximum(flat.std(axis=1), 1e-6).astype(np.float32)


def common_shape(data: FederatedData, size: Optional[int], channels: Optional[int], dataset: str) -> None:
    """Give every image domain of ``data`` the shape [channels, size, size] in place; tables are an error."""
    key = "data.image_size" if size is not None else "data.channels"
    for i, domain in enumerate(data.domains):
        if domain.x.ndim != 4:
            raise UserError(f"config key '{key}': {dataset} has no images (domain {domain.name} holds inputs of "
                            f"shape {list(domain.x.shape[1:])}); set {key} only for image datasets")
        x = reshape_images(domain.x, size, channels)
        if x is domain.x:
            continue
        mean, std = domain.mean, domain.std
        if mean is not None:
            rows = np.ones(len(x), dtype=bool)  # statistics of what clients may train on, not the official test
            if data.server_test is not None and data.server_test.domain == i:
                rows[data.server_test.test] = False
            mean, std = _stats(x[rows] if not rows.all() else x)
        data.domains[i] = Domain(domain.name, x, domain.y, mean=mean, std=std)
