"""Benchmark-only dataset ``bench_synth``: Gaussian class blobs, as many samples as the scale benchmark needs.

The embedded datasets top out at a few thousand samples, too few for 10,000 clients with ``data.min_samples``
each. This plugin (config key ``plugins: [bench_data]``, with ``benchmarks/`` on every worker's PYTHONPATH) makes
``data.samples_per_domain`` samples (default: 50 per client) of ``BENCH_DIM`` float features in 10 classes,
deterministically from the seed, so the per-client workload stays the same whatever ``clients.num`` is.

It also registers benchmarks/pfl.py's datasets ``pfl_blobs`` and ``pfl_images`` and its model ``pfl_cnn``, whose
data and layers live in ``_pfl/workloads.py`` (shared with the pfl side and the plain loop, which have no raysim).
"""

from __future__ import annotations

import numpy as np

from raysim.data import federate
from raysim.data.base import ClientSplit, Domain, FederatedData
from raysim.errors import UserError
from raysim.registry import register_dataset, register_model

BENCH_DIM = 32
SAMPLES_PER_CLIENT = 50


@register_dataset("bench_synth")
def bench_synth(cfg) -> FederatedData:
    """10 Gaussian blobs in ``BENCH_DIM`` dimensions, separable enough that accuracy moves within a few rounds."""
    n = int(cfg.data.samples_per_domain or SAMPLES_PER_CLIENT * cfg.clients.num)
    rng = np.random.default_rng([cfg.seed, 4242])
    centres = rng.normal(0.0, 1.0, size=(10, BENCH_DIM)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    x = centres[y] + rng.normal(0.0, 1.0, size=(n, BENCH_DIM)).astype(np.float32)
    return federate([Domain("bench_synth", x.astype(np.float32), y)], cfg, num_classes=10)


# ------------------------------------------------------------------------------------------ benchmarks/pfl.py
@register_dataset("pfl_blobs")
def pfl_blobs(cfg) -> FederatedData:
    """benchmarks/pfl.py's ``tiny`` workload (64 features; ``_pfl/workloads.py``)."""
    return _pfl_federation(cfg, "tiny")


@register_dataset("pfl_images")
def pfl_images(cfg) -> FederatedData:
    """benchmarks/pfl.py's ``cnn`` workload (CIFAR-10-shaped images; ``_pfl/workloads.py``)."""
    return _pfl_federation(cfg, "cnn")


def _pfl_federation(cfg, workload: str) -> FederatedData:
    """Client c trains on rows [c * per_client, (c + 1) * per_client) of the workload's data, exactly as pfl and
    the plain loop slice them; the test rows are the official test split, evaluated once on the global model."""
    from _pfl.workloads import WORKLOADS, make_data

    per = WORKLOADS[workload].per_client
    x, y = make_data(workload, cfg.seed, cfg.clients.num)
    n_train = cfg.clients.num * per
    domain = Domain(f"pfl_{workload}", x, y)
    empty = np.zeros(0, dtype=np.int64)
    clients = [ClientSplit(domain=0, train=np.arange(c * per, (c + 1) * per, dtype=np.int64), test=empty)
               for c in range(cfg.clients.num)]
    test = ClientSplit(domain=0, train=empty, test=np.arange(n_train, len(y), dtype=np.int64))
    return FederatedData(domains=[domain], clients=clients, num_classes=10, server_test=test)


@register_model("pfl_cnn")
def pfl_cnn(*, input_shape: tuple[int, ...], cfg, **_: object):
    """pfl's CIFAR-10 benchmark CNN up to its 128-unit layer; raysim adds the head (model.feature_dim must be 128)."""
    from _pfl.workloads import CNN_FEATURES, pfl_cnn_backbone

    if cfg.feature_dim != CNN_FEATURES or len(input_shape) != 3:
        raise UserError(f"config key 'model.feature_dim': pfl_cnn ends in {CNN_FEATURES} features on image inputs "
                        f"[C, H, W]; got feature_dim={cfg.feature_dim}, input shape {list(input_shape)}")
    return pfl_cnn_backbone(tuple(input_shape))
