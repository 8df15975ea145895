"""Standard image augmentation on training batches (``data.augment``): random crop with 4 pixels of padding, and
a horizontal flip with probability 1/2, drawn per sample.

torchvision's v2 transforms draw one set of parameters per call, i.e. per batch; the standard recipe draws per
image. So the padding is torchvision's (``v2.functional.pad``, filled with the colour of a black pixel after
normalisation, as if the raw image had been padded with zeros before normalising), and the per-sample offsets and
flips come from a ``torch.Generator`` that the worker seeds from (seed, client, round): the same draws whichever
worker runs the job, so runs stay deterministic for any ``engine.num_workers``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

PADDING = 4


class BatchAugment:
    """Random crop (padding 4) + horizontal flip of a normalised [B, C, H, W] batch, per sample."""

    def __init__(self, mean: Optional[Sequence[float]], std: Optional[Sequence[float]], padding: int = PADDING):
        self.padding = padding
        if mean is None:
            self.fill: Optional[list[float]] = None  # inputs not normalised: zeros are black already
        else:
            self.fill = [float(-m / s) for m, s in zip(mean, std)]

    def __call__(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        b, c, h, w = x.shape
        p = self.padding
        fill = self.fill if self.fill is None or len(self.fill) == c else self.fill[:1] * c
        padded = F.pad(x, [p], fill=fill if fill is not None else 0.0)
        dy = torch.randint(0, 2 * p + 1, (b,), generator=gen)
        dx = torch.randint(0, 2 * p + 1, (b,), generator=gen)
        flip = torch.rand(b, generator=gen) < 0.5
        rows = (dy[:, None] + torch.arange(h)[None, :]).to(x.device)  # [B, H]
        cols = (dx[:, None] + torch.arange(w)[None, :])  # [B, W]
        cols = torch.where(flip[:, None], cols.flip(1), cols).to(x.device)
        batch = torch.arange(b, device=x.device)[:, None, None]
        # out[i, :, r, q] = padded[i, :, rows[i, r], cols[i, q]]
        out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]
        return out.permute(0, 3, 1, 2).contiguous()
