"""Datasets and federated partitions. ``build_federated_data(cfg)`` is what the driver calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raysim.data.base import ClientSplit, Domain, FederatedData, OnDemandData, is_indexed
from raysim.data.partition import dirichlet_partition, iid_partition, split_train_test
from raysim.errors import UserError

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

__all__ = ["ClientSplit", "Domain", "FederatedData", "OnDemandData", "build_federated_data", "federate", "is_indexed"]


def federate(domains: list[Domain], cfg, num_classes: int) -> FederatedData:
    """Spread the domains' samples over ``clients.num`` clients by ``data.partition``; reproducible from the seed.

    iid / dirichlet split one domain over all clients; niid1 gives each domain to ``data.clients_per_domain``
    clients (IID within the domain), niid2 does the same with a Dirichlet(alpha) label redistribution.
    """
    data_cfg, num_clients = cfg.data, cfg.clients.num
    rng = np.random.default_rng([cfg.seed, 7919])
    shares: list[tuple[int, np.ndarray]] = []
    if data_cfg.partition in ("iid", "dirichlet"):
        if len(domains) != 1:
            raise UserError(f"config key 'data.partition': {data_cfg.partition} splits one domain, but "
                            f"{data_cfg.name} has {len(domains)} ({', '.join(d.name for d in domains)}); "
                            f"use niid1 or niid2")
        labels = domains[0].y
        if data_cfg.partition == "iid":
            parts = iid_partition(len(labels), num_clients, rng)
        else:
            parts = dirichlet_partition(labels, num_clients, data_cfg.alpha, data_cfg.min_samples, rng)
        shares = [(0, p) for p in parts]
    else:
        per = data_cfg.clients_per_domain
        if num_clients != per * len(domains):
            raise UserError(f"config key 'clients.num': {data_cfg.partition} with {len(domains)} domains and "
                            f"data.clients_per_domain={per} needs clients.num={per * len(domains)}, got {num_clients}")
        for d, domain in enumerate(domains):
            if data_cfg.partition == "niid1":
                parts = iid_partition(len(domain.y), per, rng)
            else:
                parts = dirichlet_partition(domain.y, per, data_cfg.alpha, data_cfg.min_samples, rng)
            shares.extend((d, p) for p in parts)
    clients = []
    for d, part in shares:
        train, test = split_train_test(part, data_cfg.test_fraction, rng)
        clients.append(ClientSplit(domain=d, train=train, test=test))
    return FederatedData(domains=domains, clients=clients, num_classes=num_classes)


def build_federated_data(cfg: ExperimentConfig) -> FederatedData | OnDemandData:
    from raysim.registry import get_dataset

    data = get_dataset(cfg.data.name)(cfg)
    for cid, split in enumerate(getattr(data, "clients", ())):  # an on-demand dataset has no splits to check
        if len(split.train) == 0:
            raise UserError(f"client {cid} has no training samples (lower clients.num or raise data.min_samples)")
    return data
