"""Local epochs: how a client's (or the server's) samples are cut into mini-batches, in one place.

The workers, FedBABU's fine-tuning, the FAPD offline teacher and FedPCL's stand-in backbones all draw one
permutation per epoch and cut it with :func:`batch_bounds`, so they share one batch policy: a trailing one-sample
batch joins the one before (BatchNorm cannot train on one sample).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """Batch [start, end) pairs; a trailing one-sample batch joins the one before (BatchNorm can't train on one)."""
    bounds = [(b, min(b + batch_size, n)) for b in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def epoch_batches(n: int, batch_size: int, generator: Optional[torch.Generator],
                  device: torch.device | str) -> Iterator[torch.Tensor]:
    """One epoch's mini-batches of sample positions: a permutation drawn from ``generator`` (None: torch's global
    generator), on ``device``, cut by :func:`batch_bounds`."""
    order = torch.randperm(n, generator=generator).to(device)
    for b, e in batch_bounds(n, batch_size):
        yield order[b:e]


def fit_classifier(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float, batch_size: int,
                   generator: torch.Generator) -> None:
    """Central training with the workers' batches: cross-entropy, SGD with momentum 0.9, in place (the offline
    teacher and FedPCL's stand-in backbones, through :func:`raysim.engine.central.train_classifier`)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for _ in range(epochs):
        for bi in epoch_batches(len(y), batch_size, generator, x.device):
            loss = F.cross_entropy(model(x[bi]), y[bi])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


@contextlib.contextmanager
def torch_threads(cpus: float) -> Iterator[None]:
    """Run torch on as many threads as a worker gets (``engine.cpus_per_worker``), then restore the count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(math.floor(cpus))))
    try:
        yield
    finally:
        torch.set_num_threads(threads)
