"""Datasets shipped inside scikit-learn: always available, nothing to download."""

from __future__ import annotations

import functools

import numpy as np

from raysim.data import federate
from raysim.data.base import Domain, FederatedData, installed_package_dir
from raysim.registry import register_dataset


@register_dataset("sklearn_digits")
def sklearn_digits(cfg) -> FederatedData:
    """scikit-learn's 1,797 real 8x8 handwritten digits (pixel values 0..16), as 1x8x8 images."""
    images, target = load_sklearn_digits()
    x = (images.astype(np.float32) / 16.0)[:, None, :, :]
    domain = Domain("sklearn_digits", x, target, mean=np.array([x.mean()], dtype=np.float32),
                    std=np.array([x.std()], dtype=np.float32))
    return federate([domain], cfg, num_classes=10)


def load_sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float64, target (1797,) int) read straight from scikit-learn's ``digits.csv.gz``: the
    same arrays as ``sklearn.datasets.load_digits()`` without ``import sklearn`` (~1.5 s in every run's driver).
    Parsed once a process (~20 ms of text each time otherwise: a notebook's or a seed set's runs); every caller
    gets its own copies."""
    images, target = _digits_table()
    return images.copy(), target.copy()


@functools.lru_cache(maxsize=1)
def _digits_table() -> tuple[np.ndarray, np.ndarray]:
    sklearn_dir = installed_package_dir("sklearn")
    path = sklearn_dir / "datasets" / "data" / "digits.csv.gz" if sklearn_dir else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)
