"""The federated dataset that the driver builds once and puts into the Ray object store.

Arrays stay compact (images as uint8) and are normalised on the fly when a worker materialises one client's
split; a job carries a client id, never pixels. ``OnDemandData`` is the other kind: it holds no samples at all, and
each client's are made from (seed, client id) on the worker that trains it, so a million-client federation costs
nothing until a client is sampled.
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
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
    groups: Optional[np.ndarray] = None  # a natural client id per sample (a writer, a speaker): data.partition=natural

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
    # data.server_holdout: the training samples taken from each client (indices into its domain), for every method
    # alike; ``holdout`` joins them when there is one domain (FAPD's calibration split)
    holdout_by_client: Optional[list[np.ndarray]] = None
    holdout: Optional[np.ndarray] = None

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

    def input_shapes(self) -> set[tuple[int, ...]]:
        """Every client's input shape, once each (algorithms that average a whole model need exactly one)."""
        return {self.input_shape(c) for c in range(self.num_clients)}

    def num_train(self, client_id: int) -> int:
        return len(self.split(client_id).train)

    def num_test(self, client_id: int) -> int:
        return len(self.split(client_id).test)  # the server's split too (data.server_client_id)

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
        # canonical strides: a size-1 dimension (one colour channel) may carry any stride, and a 1x8x8 batch whose
        # channel stride is 1 also reads as channels-last, which sends a convolution down another kernel with other
        # rounding. Arrays that crossed a pickle (Ray's object store) have canonical strides; so must these, or a
        # convolutional model's numbers would depend on engine.backend
        x = x.reshape(-1).view(x.shape)
        return x, torch.from_numpy(domain.y[idx]), torch.tensor(np.asarray(idx), dtype=torch.int64)


class OnDemandData:
    """A federation whose clients' samples are made on demand from (seed, client id), never stored for all.

    The object that crosses to the workers holds only the generator's settings; ``client_arrays`` makes one client's
    (x_train, y_train, x_test, y_test) deterministically, and the newest few clients are kept (up to
    ``cache_bytes``) because a client that trains in a round is usually evaluated right after. Subclasses set
    ``num_clients``, ``num_classes`` and ``meta``, and implement ``client_arrays``, ``input_shape`` and ``num_test``.
    Algorithms that index samples of a shared domain (FAPD, FedPCL) need a ``FederatedData`` instead.
    """

    num_clients: int
    num_classes: int
    meta: dict
    cache_bytes: int = 64 * 1024 * 1024

    def client_arrays(self, client_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def input_shape(self, client_id: int) -> tuple[int, ...]:
        raise NotImplementedError

    def num_test(self, client_id: int) -> int:
        raise NotImplementedError

    def input_shapes(self) -> set[tuple[int, ...]]:
        return {self.input_shape(0)}

    def num_train(self, client_id: int) -> int:
        return len(self._arrays(client_id)[1])

    def _arrays(self, client_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        cache: OrderedDict = self.__dict__.setdefault("_cache", OrderedDict())
        if client_id in cache:
            cache.move_to_end(client_id)
            return cache[client_id]
        arrays = self.client_arrays(client_id)
        cache[client_id] = arrays
        while len(cache) > 1 and sum(a.nbytes for v in cache.values() for a in v) > self.cache_bytes:
            cache.popitem(last=False)
        return arrays

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_cache"}  # the settings travel, never samples

    def tensors(self, client_id: int, part: str = "train") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs float32, labels int64, sample indices within this client's split) for one client's split."""
        x_train, y_train, x_test, y_test = self._arrays(client_id)
        x, y = (x_train, y_train) if part == "train" else (x_test, y_test)
        return (torch.from_numpy(np.array(x, dtype=np.float32)), torch.from_numpy(np.array(y, dtype=np.int64)),
                torch.arange(len(y), dtype=torch.int64))


def is_indexed(data: object) -> bool:
    """True for a dataset whose clients hold indices into shared domains (``FederatedData``)."""
    return isinstance(data, FederatedData)


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
