"""The compressors, one tensor at a time: each returns the tensor as the receiver decodes it (same shape and dtype)
and the exact bytes of its encoding on the wire, values, indices and scales at their real widths. The simulation
encodes and decodes where the client trained, as FLSim's channels do (``flsim/channels/``), so that the rest of
the round (the one sum, secure aggregation, the server step) sees what the server would.

- :func:`top_k` (Aji and Heafield, EMNLP 2017, "Sparse Communication for Distributed Gradient Descent"): the k
  largest magnitudes, k = ceil(ratio x entries) (ties to the lower index); the values at the tensor's width and
  their positions as the smaller of int32 indices and a one-bit-an-entry mask (FLSim's ``SparseMaskChannel``
  counts COO or bitmask); none when k is every entry.
- :func:`random_k` (the random mask of Konečný et al. 2016; Stich, Cordonnier and Jaggi, NeurIPS 2018, with
  memory): k coordinates drawn from the job's generator, unscaled as in Stich et al.; the values only, since the
  server draws the same positions from the seed (8 bytes, counted once an upload by the stage).
- :func:`qsgd` (Alistarh et al., NeurIPS 2017, "QSGD"): each bucket of coordinates scaled by its L2 norm (a
  float32) and rounded stochastically to one of s + 1 levels with its sign, unbiased; ``bits`` a coordinate hold
  the 2s + 1 values -s..s, s = 2**(bits-1) - 1. With a ``scale`` shared by every client (under secure
  aggregation, where the levels are summed in the ring) no norm is sent.
- :func:`scaled_sign` (Karimireddy et al., ICML 2019, "Error Feedback Fixes SignSGD"): (||x||_1 / d) sign(x), one
  bit an entry and the scale as a float32 (sign(0) = +1).
- :func:`half`: float16 values (FLSim's ``HalfPrecisionChannel``), for the download.

A non-floating tensor (a batch norm's counter) is sent as it is.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from raysim.sections.compression import qsgd_levels

SCALE_BYTES = 4  # a norm or scale travels as a float32
INDEX_BYTES = 4  # an int32 position (every tensor here has fewer than 2**31 entries)


class Encoded(NamedTuple):
    value: torch.Tensor  # the tensor as decoded, its shape and dtype
    nbytes: int  # its encoding's bytes on the wire


def as_sent(x: torch.Tensor) -> Encoded:
    """A tensor sent as it is."""
    return Encoded(x, x.numel() * x.element_size())


def keep_count(ratio: float, entries: int) -> int:
    """k = ceil(ratio x entries), at least 1 (a product that lands on a whole number is that number)."""
    return min(entries, max(1, math.ceil(round(ratio * entries, 9))))


def index_bytes(k: int, entries: int) -> int:
    """The positions of k of ``entries``: the smaller of k int32 indices and a one-bit-an-entry mask; none when every
    entry is sent."""
    return 0 if k >= entries else min(INDEX_BYTES * k, math.ceil(entries / 8))


def _sparse(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    flat = x.detach().reshape(-1)
    out = torch.zeros_like(flat)
    out[idx] = flat[idx]
    return out.view(x.shape)


def top_k(x: torch.Tensor, ratio: float) -> Encoded:
    """The k largest magnitudes of ``x`` (ties to the lower index), the rest zero."""
    d = x.numel()
    if not x.is_floating_point() or d == 0:
        return as_sent(x)
    k = keep_count(ratio, d)
    order = torch.argsort(x.detach().reshape(-1).abs(), descending=True, stable=True)
    return Encoded(_sparse(x, order[:k]), k * x.element_size() + index_bytes(k, d))


def random_k(x: torch.Tensor, ratio: float, gen: torch.Generator) -> Encoded:
    """k coordinates of ``x`` drawn from ``gen`` (unscaled), the rest zero; the positions travel as the seed."""
    d = x.numel()
    if not x.is_floating_point() or d == 0:
        return as_sent(x)
    k = keep_count(ratio, d)
    idx = torch.randperm(d, generator=gen)[:k]
    return Encoded(_sparse(x, idx), k * x.element_size())


def _float32(values: torch.Tensor) -> torch.Tensor:
    """float64 values as a float32 carries them (a scale on the wire)."""
    return values.to(torch.float32).to(torch.float64)


def qsgd(x: torch.Tensor, bits: int, bucket: int, gen: Optional[torch.Generator] = None, *,
         scale: Optional[float] = None, uniform: Optional[torch.Tensor] = None) -> Encoded:
    """QSGD at ``bits`` a coordinate: |x_i| / norm x s rounded down or up to a whole level l, up with probability
    the remainder (``uniform``: the draws in [0, 1), else from ``gen``), sent as sign(x_i) l; decoded as
    norm sign(x_i) l / s. The norm is each bucket's (a float32 each), or the shared ``scale`` (|x_i| clamped to it;
    nothing sent for it)."""
    d = x.numel()
    if not x.is_floating_point() or d == 0:
        return as_sent(x)
    s = qsgd_levels(bits)
    flat = x.detach().reshape(-1).to(torch.float64)
    if uniform is None:
        assert gen is not None
        uniform = torch.rand(d, generator=gen, dtype=torch.float64)
    if scale is None:
        buckets = math.ceil(d / bucket)
        padded = torch.zeros(buckets * bucket, dtype=torch.float64)
        padded[:d] = flat
        norms = _float32(padded.view(buckets, bucket).pow(2).sum(dim=1).sqrt())
        norm = norms.repeat_interleave(bucket)[:d]
        scale_bytes = buckets * SCALE_BYTES
    else:
        norm = torch.full((d,), float(scale), dtype=torch.float64)
        scale_bytes = 0
    ratio = torch.where(norm > 0, flat.abs() / torch.where(norm > 0, norm, 1.0), 0.0).clamp(max=1.0) * s
    low = ratio.floor()
    level = low + (uniform < ratio - low).to(torch.float64)
    sign = torch.where(flat < 0, -1.0, 1.0)
    value = (sign * norm * level / s).to(x.dtype).view(x.shape)
    return Encoded(value, scale_bytes + math.ceil(d * bits / 8))


def scaled_sign(x: torch.Tensor) -> Encoded:
    """(||x||_1 / d) sign(x): one bit an entry and the scale (a float32); sign(0) = +1."""
    d = x.numel()
    if not x.is_floating_point() or d == 0:
        return as_sent(x)
    flat = x.detach().reshape(-1).to(torch.float64)
    scale = float(_float32(flat.abs().sum() / d))
    value = torch.where(flat < 0, -scale, scale).to(x.dtype).view(x.shape)
    return Encoded(value, SCALE_BYTES + math.ceil(d / 8))


def half(x: torch.Tensor) -> Encoded:
    """float16 values (2 bytes an entry)."""
    if not x.is_floating_point():
        return as_sent(x)
    return Encoded(x.detach().to(torch.float16).to(x.dtype), 2 * x.numel())
