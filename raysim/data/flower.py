"""The field's partitions, from the field's library: Flower Datasets' partitioners over raysim's label arrays.

A raysim partition is exactly what a Flower user gets from ``FederatedDataset(..., shuffle=True, seed=SEED,
partitioners={"train": P})`` on the same samples: the split is shuffled with ``datasets.Dataset.shuffle(seed=SEED)``
(as ``FederatedDataset`` does before partitioning), then partitioner ``P`` (built with ``seed=SEED`` where it takes
one) deals the shuffled rows to the clients. Nothing is downloaded: the dataset handed to the partitioner is an
in-memory ``datasets.Dataset`` of the labels (plus the row index, and the natural id where there is one).

``data.partition``          Flower Datasets partitioner, with the config keys it reads
``iid``                     ``IidPartitioner``
``dirichlet``               ``DirichletPartitioner`` (``data.alpha``, ``data.min_samples`` as its
                            ``min_partition_size``, ``data.self_balancing``)
``pathological``            ``PathologicalPartitioner`` (``data.classes_per_client``, ``data.class_assignment``)
``shard``                   ``ShardPartitioner`` (``data.shards_per_client``, ``data.shard_size``,
                            ``data.keep_incomplete_shard``), McMahan et al.'s sorted-label shards
``natural``                 ``NaturalIdPartitioner`` on a dataset's natural client ids (``Domain.groups``)
``linear``, ``square``,     ``LinearPartitioner``, ``SquarePartitioner``, ``ExponentialPartitioner``: IID samples,
``exponential``             client sizes growing with the client id
``inner_dirichlet``         ``InnerDirichletPartitioner`` (``data.partition_sizes``, else near-equal sizes;
                            ``data.alpha``)

Shard and pathological partitions may leave some samples to no client, as in Flower. raysim's own partitions stay
where Flower has none: ``niid1`` / ``niid2`` (a domain per client group) and tabular column slicing.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Optional

import numpy as np

from raysim.errors import UserError

FLOWER_PARTITIONS = ("iid", "dirichlet", "pathological", "shard", "natural", "linear", "square", "exponential",
                     "inner_dirichlet")


def _partitioner(name: str, data_cfg: Any, num_clients: int, seed: int, num_rows: int) -> Any:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # never post usage events (raysim runs offline)
    from flwr_datasets import partitioner as fp

    if name == "iid":
        return fp.IidPartitioner(num_partitions=num_clients)
    if name == "dirichlet":
        return fp.DirichletPartitioner(num_partitions=num_clients, partition_by="label", alpha=float(data_cfg.alpha),
                                       min_partition_size=data_cfg.min_samples,
                                       self_balancing=data_cfg.self_balancing, seed=seed)
    if name == "pathological":
        return fp.PathologicalPartitioner(num_partitions=num_clients, partition_by="label",
                                          num_classes_per_partition=data_cfg.classes_per_client,
                                          class_assignment_mode=data_cfg.class_assignment, seed=seed)
    if name == "shard":
        return fp.ShardPartitioner(num_partitions=num_clients, partition_by="label",
                                   num_shards_per_partition=data_cfg.shards_per_client,
                                   shard_size=data_cfg.shard_size,
                                   keep_incomplete_shard=data_cfg.keep_incomplete_shard, seed=seed)
    if name == "natural":
        return fp.NaturalIdPartitioner(partition_by="group")
    if name == "linear":
        return fp.LinearPartitioner(num_partitions=num_clients)
    if name == "square":
        return fp.SquarePartitioner(num_partitions=num_clients)
    if name == "exponential":
        return fp.ExponentialPartitioner(num_partitions=num_clients)
    if name == "inner_dirichlet":
        sizes = list(data_cfg.partition_sizes) or [len(part) for part in np.array_split(np.arange(num_rows),
                                                                                       num_clients)]
        if len(sizes) != num_clients:
            raise UserError(f"config key 'data.partition_sizes': {len(sizes)} sizes for clients.num={num_clients}")
        if sum(sizes) != num_rows:
            raise UserError(f"config key 'data.partition_sizes': the sizes add up to {sum(sizes)}, but the split "
                            f"has {num_rows} samples")
        return fp.InnerDirichletPartitioner(partition_sizes=sizes, partition_by="label",
                                            alpha=float(data_cfg.alpha), seed=seed)
    raise UserError(f"config key 'data.partition': {name!r} is not one of {', '.join(FLOWER_PARTITIONS)}")


def flower_partition(labels: np.ndarray, num_clients: int, cfg: Any,
                     groups: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """One int64 index array per client (into ``labels``), as Flower Datasets deals them: see the module docstring.

    ``natural`` makes one client per natural id in ``groups``; the first ``num_clients`` of them are kept. A split is
    a pure function of the labels, the partition's keys, the seed and the two libraries' versions, so it is cached
    (``data.cache_dir``): a run whose split was made before neither imports ``datasets`` and Flower (~2 s in every
    run's driver) nor redoes it."""
    import hashlib
    from importlib.metadata import version

    from raysim.data.cache import cached_arrays

    data_cfg = cfg.data
    labels = np.asarray(labels, dtype=np.int64)
    key = {"partition": data_cfg.partition, "clients": num_clients, "seed": cfg.seed,
           "labels": hashlib.sha256(labels.tobytes()).hexdigest(),
           "groups": None if groups is None else hashlib.sha256(np.asarray(groups).astype(str).tobytes()).hexdigest(),
           "versions": [version("flwr-datasets"), version("datasets")],
           **{k: getattr(data_cfg, k) for k in _KEYS.get(data_cfg.partition, ())}}

    def build() -> dict[str, np.ndarray]:
        parts = _flower_partition(labels, num_clients, data_cfg, cfg.seed, groups)
        return {"indices": np.concatenate(parts), "sizes": np.array([len(p) for p in parts], dtype=np.int64)}

    arrays = cached_arrays(cfg, f"partition-{data_cfg.partition}", key, build)
    return [part.astype(np.int64) for part in np.split(arrays["indices"], np.cumsum(arrays["sizes"])[:-1])]


# the config keys each partition reads (the cache key's part), besides the partition, clients and seed
_KEYS = {"dirichlet": ("alpha", "min_samples", "self_balancing"),
         "pathological": ("classes_per_client", "class_assignment"),
         "shard": ("shards_per_client", "shard_size", "keep_incomplete_shard"),
         "inner_dirichlet": ("alpha", "partition_sizes")}


def _flower_partition(labels: np.ndarray, num_clients: int, data_cfg: Any, seed: int,
                      groups: Optional[np.ndarray]) -> list[np.ndarray]:
    from datasets import Dataset

    name = data_cfg.partition
    columns: dict[str, Any] = {"label": labels, "index": np.arange(len(labels), dtype=np.int64)}
    if name == "natural":
        if groups is None:
            raise UserError(f"config key 'data.partition': natural needs a dataset whose samples carry natural "
                            f"client ids (femnist's writers, shakespeare's speakers); {data_cfg.name} has none")
        columns["group"] = np.asarray(groups)
    if len(labels) < num_clients and name != "natural":
        raise UserError(f"cannot split {len(labels)} samples over {num_clients} clients (clients.num too large)")
    dataset = Dataset.from_dict(columns).shuffle(seed=seed)  # what FederatedDataset(shuffle=True, seed) does
    partitioner = _partitioner(name, data_cfg, num_clients, seed, len(labels))
    partitioner.dataset = dataset
    try:
        with warnings.catch_warnings():  # Dirichlet warns at each redraw; the error below says what to change
            warnings.simplefilter("ignore")
            available = partitioner.num_partitions
            if name == "natural" and available < num_clients:
                raise UserError(f"config key 'clients.num': {data_cfg.name} has {available} natural clients, "
                                f"fewer than clients.num={num_clients}")
            parts = [partitioner.load_partition(i).with_format("arrow")[:]["index"].to_numpy().astype(np.int64)
                     for i in range(num_clients)]
    except ValueError as exc:
        raise UserError(_explain(name, data_cfg, num_clients, len(labels), exc)) from None
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise UserError(f"config key 'data.partition': {name} left client {empty[0]} without samples "
                        f"({len(empty)} clients in all); lower clients.num or change the partition's keys")
    return parts


def _explain(name: str, data_cfg: Any, num_clients: int, num_rows: int, exc: ValueError) -> str:
    """Flower's own ValueError, as one line that names the raysim keys to change."""
    cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if name == "dirichlet":
        return (f"config key 'data.alpha': Flower's DirichletPartitioner found no split of {num_rows} samples giving "
                f"each of clients.num={num_clients} clients data.min_samples={data_cfg.min_samples} in 11 draws at "
                f"alpha={data_cfg.alpha}; raise data.alpha, or lower clients.num or data.min_samples ({cause})")
    keys = {"pathological": "data.classes_per_client", "shard": "data.shards_per_client",
            "inner_dirichlet": "data.partition_sizes"}.get(name, "clients.num")
    return f"config key '{keys}': Flower's {name} partitioner refused the split of {num_rows} samples over " \
           f"{num_clients} clients: {cause}"
