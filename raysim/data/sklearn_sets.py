"""Datasets shipped inside scikit-learn: always available, nothing to download."""

from __future__ import annotations

import numpy as np

from raysim.data import federate
from raysim.data.base import Domain, FederatedData
from raysim.registry import register_dataset


@register_dataset("sklearn_digits")
def sklearn_digits(cfg) -> FederatedData:
    """scikit-learn's 1,797 real 8x8 handwritten digits (pixel values 0..16), as 1x8x8 images."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    domain = Domain("sklearn_digits", x, bunch.target, mean=np.array([x.mean()], dtype=np.float32),
                    std=np.array([x.std()], dtype=np.float32))
    return federate([domain], cfg, num_classes=10)
