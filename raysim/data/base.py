"""The federated dataset that the driver builds once and puts into the Ray object store.

Arrays stay compact (images as uint8) and are normalised on the fly when a worker materialises one client's
split; a job carries a client id, never pixels.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


def installed_package_dir(name: str) -> Optional[Path]:
    """Folder of an installed package, found without importing it (importing sklearn costs ~1.5 s), or None."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@dataclass
class Domain:
    """One source of samples with its own input shape (MNIST, MNIST-M, a tabular set ...)."""

    name: str
    x: np.ndarray  # uint8 images [N, C, H, W] (scaled by 1/255 on the fly) or float32 [N, ...]
    y: np.ndarray  # int64 labels [N]
    mean: Optional[np.ndarray] = None  # per-channel (images) or per-column (tables) normalisation
    std: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        self.y = np.asarray(self.y, dtype=np.int64)
        if len(self.x) != len(self.y):
            raise ValueError(f"domain {self.name}: {len(self.x)} inputs but {len(self.y)} labels")


@dataclass
class ClientSplit:
    """What one virtual client holds: indices into one domain, and optionally a column subset."""

    domain: int
    train: np.ndarray  # int64 indices into the domain
    test: np.ndarray
    features: Optional[np.ndarray] = None  # tabular feature slicing: the columns this client sees
    shift: Optional[np.ndarray] = None  # per-client standardisation from its own training split
    scale: Optional[np.ndarray] = None


@dataclass
class FederatedData:
    domains: list[Domain]
    clients: list[ClientSplit]
    num_classes: int
    meta: dict = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def input_shape(self, client_id: int) -> tuple[int, ...]:
        split = self.clients[client_id]
        shape = tuple(self.domains[split.domain].x.shape[1:])
        if split.features is not None:
            shape = (len(split.features),)
        return shape

    def num_train(self, client_id: int) -> int:
        return len(self.clients[client_id].train)

    def tensors(self, client_id: int, part: str = "train") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs float32, labels int64, sample indices into the domain) for one client's split."""
        split = self.clients[client_id]
        domain = self.domains[split.domain]
        idx = split.train if part == "train" else split.test
        raw = domain.x[idx]
        if split.features is not None:
            raw = raw[:, split.features]
        x = torch.from_numpy(np.ascontiguousarray(raw))
        x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
        if domain.mean is not None and split.features is None:
            shape = (1, -1) + (1,) * (x.dim() - 2)
            x = (x - _vector(domain.mean).view(shape)) / _vector(domain.std).view(shape)
        if split.shift is not None:
            x = (x - _vector(split.shift)) / _vector(split.scale)
            x = torch.nan_to_num_(x, nan=0.0)  # a missing value (NaN) becomes the client's own training mean
        return x, torch.from_numpy(domain.y[idx]), torch.tensor(np.asarray(idx), dtype=torch.int64)


def _vector(a: np.ndarray) -> torch.Tensor:
    """A float32 copy (arrays from the object store are read-only, which torch.from_numpy warns about)."""
    return torch.tensor(np.asarray(a), dtype=torch.float32)


def channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean/std of uint8 images [N, C, H, W] on the 0..1 scale the worker divides by.

    Accumulated in chunks, so a Tiny-ImageNet-sized array never gets a float copy.
    """
    channels = x.shape[1]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    for start in range(0, len(x), chunk):
        block = x[start:start + chunk].astype(np.float64) / 255.0
        total += block.sum(axis=(0, 2, 3))
        squares += np.square(block).sum(axis=(0, 2, 3))
    count = max(len(x), 1) * x.shape[2] * x.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean ** 2, 1e-12))
    return mean.astype(np.float32), std.astype(np.float32)


def subset_indices(n: int, cap: Optional[int], rng: np.random.Generator) -> np.ndarray:
    """A seeded random subset of at most ``cap`` of ``n`` indices (``data.samples_per_domain``), in source order."""
    if cap is None or cap >= n:
        return np.arange(n)
    return np.sort(rng.choice(n, size=cap, replace=False))


def local_root(cfg: ExperimentConfig, dataset: str, layout: str) -> Path:
    """``data.root`` for a dataset read from local files; a one-line error naming the key when it is not set."""
    if not cfg.data.root:
        from raysim.errors import UserError

        raise UserError(f"config key 'data.root': {dataset} is read from local files; set data.root to a "
                        f"directory holding {layout}")
    return Path(cfg.data.root).expanduser()
