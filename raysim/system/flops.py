"""A model's training FLOPs per sample, for client speeds in FLOP/s (``system.speed_unit: flops``).

A job's compute time is then samples x epochs x FLOPs per sample / the client's FLOP/s, so a ResNet costs what it
costs and an MLP what it costs, on the same devices (as EvoFed scales FedScale's per-sample latencies by the model's
FLOPs, github.com/evofed/FedScale, evofed/client/client_perf.py). The FLOPs are counted, not estimated: one forward
and backward pass of a batch of ``train.batch_size`` of the client's own training samples through the model the run
builds (``raysim.models.build_model``, with the algorithm's ``adapt_model``), under ``torch.utils.flop_counter``
(which counts the matrix products and convolutions, 2 FLOPs a multiply-add), divided by the batch's size. Measured
once per architecture and input shape on the driver before round 1, kept for the process's later runs, and with
the random number generators as they were before (building a model reseeds them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MEASURED: dict[tuple, float] = {}  # (model config, architecture, input shape, classes, algorithm, batch) -> FLOPs


def training_flops_per_sample(cfg: Any, data: Any, algorithm: Any, client: int) -> float:
    """FLOPs of one training sample of ``client``'s model: a forward and backward pass of a batch of its training
    data with the cross-entropy loss, over the batch's size."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from raysim.models import build_model

    arch, shape = cfg.model.for_client(client), tuple(data.input_shape(client))
    x, y, _ = data.tensors(client, "train")
    batch = max(1, min(int(cfg.train.batch_size), len(x)))
    key = (repr(cfg.model), arch, shape, int(data.num_classes), type(algorithm).__name__, batch)
    if key in _MEASURED:
        return _MEASURED[key]
    if len(x) == 0:  # a client without training data: a batch of zeros of its shape (the FLOPs do not read values)
        x, y = torch.zeros((1, *shape)), torch.zeros(1, dtype=torch.int64)
    from raysim.config import ConfigError

    with torch.random.fork_rng(devices=[]):
        model = build_model(cfg, arch, shape, data.num_classes, client, algorithm)
        model.train()
        try:
            with FlopCounterMode(display=False) as counter:
                F.cross_entropy(model(x[:batch]), y[:batch]).backward()
        except (RuntimeError, TypeError, ValueError) as exc:  # a model whose forward is not logits of x
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"config key 'system.speed_unit': flops counts a forward and backward pass of {arch}, "
                              f"which failed ({type(exc).__name__}: {first}); use speed_unit=samples") from None
    flops = counter.get_total_flops() / batch
    if not flops > 0:
        raise ConfigError(f"config key 'system.speed_unit': flops needs a model whose training FLOPs can be counted; "
                          f"torch.utils.flop_counter counted none for {arch} (use speed_unit=samples)")
    _MEASURED[key] = float(flops)
    return _MEASURED[key]


def sample_costs(cfg: Any, data: Any, algorithm: Any) -> float | np.ndarray:
    """Each client's training FLOPs per sample: one number when every client has the same architecture and input
    shape, else one per client (HETE's per-client models, several input domains)."""
    if len(cfg.model.names()) == 1 and len(data.input_shapes()) == 1:
        return training_flops_per_sample(cfg, data, algorithm, 0)
    first: dict[tuple, int] = {}
    for c in range(cfg.clients.num):
        first.setdefault((cfg.model.for_client(c), tuple(data.input_shape(c))), c)
    cost = {k: training_flops_per_sample(cfg, data, algorithm, c) for k, c in first.items()}
    return np.array([cost[(cfg.model.for_client(c), tuple(data.input_shape(c)))] for c in range(cfg.clients.num)])
