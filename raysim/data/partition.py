"""Pure partitioning functions over label arrays: no Ray, no I/O, deterministic for a given generator.

Every function returns one int64 index array per client; together they cover their input exactly once.
"""

from __future__ import annotations

import numpy as np

from raysim.errors import UserError


def iid_partition(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal the samples into near-equal shares."""
    if num_samples < num_clients:
        raise UserError(f"cannot split {num_samples} samples over {num_clients} clients (clients.num too large)")
    order = rng.permutation(num_samples)
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, num_clients)]


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, min_samples: int,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Label-skew split: each class is spread over clients with proportions ~ Dirichlet(alpha).

    Unlike the common "resample until every client has enough" loop (which can spin for ever at small alpha and
    many clients), clients left under ``min_samples`` are topped up once with random samples taken from the
    clients with the largest surplus, so the split always finishes in O(N + K log K).
    """
    labels = np.asarray(labels)
    n = len(labels)
    if n < num_clients * min_samples:
        raise UserError(f"{n} samples cannot give {num_clients} clients {min_samples} each "
                        f"(lower clients.num or data.min_samples)")
    owner = np.empty(n, dtype=np.int64)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        counts = rng.multinomial(len(idx), proportions)
        owner[idx] = np.repeat(np.arange(num_clients), counts)
    sizes = np.bincount(owner, minlength=num_clients)
    need = np.maximum(min_samples - sizes, 0)
    if need.sum() > 0:
        surplus = sizes - min_samples
        donors = np.argsort(-surplus, kind="stable")
        pool: list[np.ndarray] = []
        remaining = int(need.sum())
        for d in donors:
            if remaining == 0 or surplus[d] <= 0:
                break
            take = int(min(surplus[d], remaining))
            mine = np.flatnonzero(owner == d)
            pool.append(rng.choice(mine, size=take, replace=False))
            remaining -= take
        moved = np.concatenate(pool)
        owner[moved] = np.repeat(np.arange(num_clients), need)
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return [part.astype(np.int64) for part in np.split(order, bounds)]


def split_train_test(indices: np.ndarray, test_fraction: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A client's own held-out split; at least one sample on each side when the client has two or more."""
    indices = rng.permutation(np.asarray(indices, dtype=np.int64))
    n_test = int(round(len(indices) * test_fraction))
    if len(indices) >= 2:
        n_test = min(max(n_test, 1), len(indices) - 1)
    return np.sort(indices[n_test:]), np.sort(indices[:n_test])
