"""The federated dataset that the driver builds once and puts into the Ray object store.

Arrays stay compact (images as uint8) and are normalised on the fly when a worker materialises one client's
split; a job carries a client id, never pixels.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch


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
    width: Optional[int] = None  # data.feature_layout=shared: the columns land at their index in a row this wide


@dataclass
class FederatedData:
    domains: list[Domain]
    clients: list[ClientSplit]
    num_classes: int
    meta: dict = field(default_factory=dict)
    # the official test split (data.test_split=official), held by the evaluation, not by a client: its samples are
    # ``server_test.test``; the evaluation addresses it as client id ``num_clients`` (``server_client_id``)
    server_test: Optional[ClientSplit] = None
    holdout: Optional[np.ndarray] = None  # data.server_holdout: training samples taken from the clients (indices)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def server_client_id(self) -> int:
        """The id under which workers evaluate ``server_test`` (one past the last client)."""
        return len(self.clients)

    def split(self, client_id: int) -> ClientSplit:
        if client_id == len(self.clients) and self.server_test is not None:
            return self.server_test
        return self.clients[client_id]

    def input_shape(self, client_id: int) -> tuple[int, ...]:
        split = self.split(client_id)
        shape = tuple(self.domains[split.domain].x.shape[1:])
        if split.features is not None:
            shape = (split.width or len(split.features),)
        return shape

    def num_train(self, client_id: int) -> int:
        return len(self.split(client_id).train)

    def tensors(self, client_id: int, part: str = "train") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs float32, labels int64, sample indices into the domain) for one client's split."""
        split = self.split(client_id)
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
        if split.width is not None:  # shared layout: own columns at their global index, absent ones zero
            wide = torch.zeros((x.shape[0], split.width), dtype=x.dtype)
            wide[:, torch.from_numpy(np.asarray(split.features, dtype=np.int64))] = x
            x = wide
        return x, torch.from_numpy(domain.y[idx]), torch.tensor(np.asarray(idx), dtype=torch.int64)


def _vector(a: np.ndarray) -> torch.Tensor:
    """A float32 copy (arrays from the object store are read-only, which torch.from_numpy warns about)."""
    return torch.tensor(np.asarray(a), dtype=torch.float32)
