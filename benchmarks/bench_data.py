"""Benchmark-only dataset ``bench_synth``: Gaussian class blobs, as many samples as the scale benchmark needs.

The embedded datasets top out at a few thousand samples, too few for 10,000 clients with ``data.min_samples``
each. This plugin (config key ``plugins: [bench_data]``, with ``benchmarks/`` on every worker's PYTHONPATH) makes
``data.samples_per_domain`` samples (default: 50 per client) of ``BENCH_DIM`` float features in 10 classes,
deterministically from the seed, so the per-client workload stays the same whatever ``clients.num`` is.
"""

from __future__ import annotations

import numpy as np

from raysim.data import federate
from raysim.data.base import Domain, FederatedData
from raysim.registry import register_dataset

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
