"""Datasets and federated partitions. ``build_federated_data(cfg)`` is what the driver calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from raysim.data.base import ClientSplit, Domain, FederatedData, OnDemandData, is_indexed
from raysim.data.partition import dirichlet_partition, iid_partition, split_train_test
from raysim.errors import UserError

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

__all__ = ["ClientSplit", "Domain", "FederatedData", "OnDemandData", "build_federated_data", "federate", "is_indexed"]


def federate(domains: list[Domain], cfg, num_classes: int, pools: Optional[list[np.ndarray]] = None) -> FederatedData:
    """Spread the domains' samples over ``clients.num`` clients by ``data.partition``; reproducible from the seed.

    Flower Datasets' partitions (iid, dirichlet, pathological, shard, natural, linear, square, exponential,
    inner_dirichlet: ``raysim.data.flower``) split one domain over all clients exactly as Flower does with the same
    seed. raysim's own: niid1 gives each domain to ``data.clients_per_domain`` clients (IID within the domain),
    niid2 does the same with a Dirichlet(alpha) label redistribution: among the domain's clients
    (``data.label_skew: split``) or within each client's share (``subsample``); legacy_iid / legacy_dirichlet are
    raysim's one-domain splits from before, kept so that runs made with them resume identically.
    ``pools`` (one index array per domain) limits what is dealt out, e.g. to an official training split.
    Each client then draws its own train/test split from its share (``data.test_fraction``).
    """
    from raysim.data.flower import FLOWER_PARTITIONS, flower_partition

    data_cfg, num_clients = cfg.data, cfg.clients.num
    rng = np.random.default_rng([cfg.seed, 7919])
    shares: list[tuple[int, np.ndarray]] = []

    def labels(d: int) -> np.ndarray:
        return domains[d].y if pools is None else domains[d].y[pools[d]]

    def indices(d: int, part: np.ndarray) -> np.ndarray:
        return part if pools is None else np.sort(np.asarray(pools[d], dtype=np.int64)[part])

    if data_cfg.partition in FLOWER_PARTITIONS + ("legacy_iid", "legacy_dirichlet"):
        if len(domains) != 1:
            raise UserError(f"config key 'data.partition': {data_cfg.partition} splits one domain, but "
                            f"{data_cfg.name} has {len(domains)} ({', '.join(d.name for d in domains)}); "
                            f"use niid1 or niid2")
        if data_cfg.partition == "legacy_iid":
            parts = iid_partition(len(labels(0)), num_clients, rng)
        elif data_cfg.partition == "legacy_dirichlet":
            parts = dirichlet_partition(labels(0), num_clients, data_cfg.alpha, data_cfg.min_samples, rng)
        else:
            groups = domains[0].groups
            if groups is not None and pools is not None:
                groups = groups[pools[0]]
            parts = flower_partition(labels(0), num_clients, cfg, groups)
        shares = [(0, indices(0, p)) for p in parts]
    else:
        per = data_cfg.clients_per_domain
        if num_clients != per * len(domains):
            raise UserError(f"config key 'clients.num': {data_cfg.partition} with {len(domains)} domains and "
                            f"data.clients_per_domain={per} needs clients.num={per * len(domains)}, got {num_clients}")
        subsample = data_cfg.partition == "niid2" and data_cfg.label_skew == "subsample"
        for d in range(len(domains)):
            if data_cfg.partition == "niid1" or subsample:
                parts = iid_partition(len(labels(d)), per, rng)
            else:
                parts = dirichlet_partition(labels(d), per, data_cfg.alpha, data_cfg.min_samples, rng)
            if subsample:
                parts = [label_skewed_subset(p, labels(d)[p], num_classes, data_cfg.alpha, data_cfg.min_samples, rng)
                         for p in parts]
            shares.extend((d, indices(d, p)) for p in parts)
    clients = []
    for d, part in shares:
        train, test = split_train_test(part, data_cfg.test_fraction, rng)
        clients.append(ClientSplit(domain=d, train=train, test=test))
    return FederatedData(domains=domains, clients=clients, num_classes=num_classes)


def build_federated_data(cfg: ExperimentConfig) -> FederatedData | OnDemandData:
    """The dataset's federation, then the settings every dataset shares: one input shape (``data.image_size``,
    ``data.channels``) and the server's holdout (``data.server_holdout``). Built once per process and config where
    the data depends on the config alone (``raysim.data.memo``); every caller gets its own copy."""
    from raysim.data.memo import built_once
    from raysim.registry import get_dataset

    builder = get_dataset(cfg.data.name)
    return built_once(cfg, builder, lambda: _build(cfg, builder))


def _build(cfg: ExperimentConfig, builder) -> FederatedData | OnDemandData:
    from raysim.data.shape import common_shape

    data = builder(cfg)
    if not is_indexed(data):  # made on demand per client: nothing stored to reshape, hold out or check
        for key, set_ in (("data.image_size", cfg.data.image_size is not None),
                          ("data.channels", cfg.data.channels is not None), ("data.augment", cfg.data.augment),
                          ("data.server_holdout", cfg.data.server_holdout > 0)):
            if set_:
                raise UserError(f"config key '{key}': {cfg.data.name} makes each client's data on demand; "
                                f"leave {key} at its default")
        return data
    if cfg.data.image_size is not None or cfg.data.channels is not None:
        common_shape(data, cfg.data.image_size, cfg.data.channels, cfg.data.name)
    if cfg.data.augment and any(d.x.ndim != 4 for d in data.domains):
        raise UserError(f"config key 'data.augment': random crops and flips need images, and {cfg.data.name} "
                        f"holds inputs of shape {list(data.domains[0].x.shape[1:])}")
    if cfg.data.server_holdout > 0:
        data.holdout_by_client = hold_out_by_client(data, cfg.data.server_holdout, cfg.seed)
        if len(data.domains) == 1:
            data.holdout = _joined(data.holdout_by_client)
    for cid, split in enumerate(data.clients):
        if len(split.train) == 0:
            raise UserError(f"client {cid} has no training samples (lower clients.num or raise data.min_samples)")
    return data


def hold_out_by_client(data: FederatedData, fraction: float, seed: int) -> list[np.ndarray]:
    """Move ``fraction`` of every client's training samples (keeping at least one) to the server; returns what was
    taken from each client (indices into its domain, sorted), in client order.

    Taking the same share from every client makes the split follow the federation's overall label mix however
    skewed the clients are. Deterministic from the seed (the stream FAPD's calibration split has always used), and
    independent of the algorithm, so every method run on one config trains on the same client data.
    """
    if fraction <= 0:
        return [np.zeros(0, dtype=np.int64) for _ in data.clients]
    rng = np.random.default_rng([seed, 0xFA9D])
    taken = []
    for split in data.clients:
        n = len(split.train)
        m = min(int(round(fraction * n)), n - 1)
        mask = np.zeros(n, dtype=bool)
        mask[rng.choice(n, size=max(m, 0), replace=False)] = True
        taken.append(np.sort(split.train[mask]).astype(np.int64))
        split.train = split.train[~mask]
    return taken


def hold_out(data: FederatedData, fraction: float, seed: int) -> np.ndarray:
    """``hold_out_by_client`` of a one-domain federation, as one sorted index array (FAPD's calibration split)."""
    return _joined(hold_out_by_client(data, fraction, seed))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def label_skewed_subset(share: np.ndarray, labels: np.ndarray, num_classes: int, alpha: float, min_samples: int,
                        rng: np.random.Generator) -> np.ndarray:
    """The largest subset of ``share`` whose class mix is a Dirichlet(alpha) draw (``data.label_skew: subsample``).

    With one client per domain there is nobody to move samples to, so the skew is imposed by dropping: class c keeps
    ``floor(n * q_c)`` samples, n as large as the scarcest class (relative to q) allows.
    """
    counts = np.bincount(labels, minlength=num_classes)
    q = rng.dirichlet(np.full(num_classes, alpha)) * (counts > 0)
    q = q / q.sum()
    n = min(counts[c] / q[c] for c in np.flatnonzero(q > 0))
    keep = np.minimum(np.floor(n * q + 1e-9).astype(np.int64), counts)
    if keep.sum() < min_samples:
        raise UserError(f"config key 'data.label_skew': a client keeps {int(keep.sum())} samples of its "
                        f"{len(share)} after the Dirichlet({alpha}) subsample, under data.min_samples={min_samples} "
                        f"(raise data.alpha or data.samples_per_domain)")
    chosen = [rng.choice(share[labels == c], size=int(keep[c]), replace=False) for c in np.flatnonzero(keep)]
    return np.sort(np.concatenate(chosen)).astype(np.int64)
