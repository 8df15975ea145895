"""A synthetic dataset plugin with its own config section (``data.blobs.*``): Gaussian class clusters.

    raysim run experiments/smoke.yaml plugins=[blobs] data.name=blobs model.name=mlp data.blobs.features=8
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim import register_dataset
from raysim.config import ConfigError
from raysim.data import federate
from raysim.data.base import Domain


@dataclass
class BlobsConfig:
    samples: int = 600  # samples in all (split over the clients by data.partition)
    features: int = 10  # input columns
    classes: int = 4  # clusters, one per class
    spread: float = 1.5  # standard deviation of each cluster; larger is harder

    def validate(self) -> None:
        if self.samples < 10 or self.features < 1 or self.classes < 2 or self.spread <= 0:
            raise ConfigError("config key 'data.blobs': need samples >= 10, features >= 1, classes >= 2, spread > 0")


@register_dataset("blobs", config=BlobsConfig)
def blobs(cfg):
    """Gaussian class clusters in data.blobs.features dimensions (an example plugin with its own keys)."""
    opts = cfg.data.blobs
    rng = np.random.default_rng([cfg.seed, 2024])
    centres = rng.normal(0.0, 3.0, size=(opts.classes, opts.features))
    y = rng.integers(0, opts.classes, size=opts.samples)
    x = (centres[y] + rng.normal(0.0, opts.spread, size=(opts.samples, opts.features))).astype(np.float32)
    domain = Domain("blobs", x, y.astype(np.int64), mean=x.mean(0), std=x.std(0) + 1e-6)
    return federate([domain], cfg, num_classes=opts.classes)
