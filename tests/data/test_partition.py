"""Partitions: every sample lands in exactly one client's train or test set, reproducibly, and fast at scale."""

from __future__ import annotations


import numpy as np
import pytest

from raysim.config import load_config
from raysim.data import Domain, federate
from raysim.data.partition import dirichlet_partition, iid_partition, split_train_test
from raysim.errors import UserError


def _cfg(**over: object):
    base = {"clients.num": 6, "data.partition": "niid1", "data.clients_per_domain": 2, "data.min_samples": 5}
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def _domains(sizes=(300, 200, 250)) -> list[Domain]:
    rng = np.random.default_rng(0)
    return [Domain(f"d{i}", rng.integers(0, 255, size=(n, 1, 4, 4), dtype=np.uint8), rng.integers(0, 10, size=n))
            for i, n in enumerate(sizes)]


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert joined.dtype == np.int64
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


def test_iid_covers_each_sample_once_in_near_equal_shares():
    parts = iid_partition(1003, 7, np.random.default_rng(1))
    _assert_exact_cover(parts, 1003)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_iid_refuses_more_clients_than_samples():
    with pytest.raises(UserError, match="clients.num"):
        iid_partition(3, 5, np.random.default_rng(0))


def test_dirichlet_alpha_01_with_1000_clients():
    """(Its time is measured by benchmarks/data_build.py.)"""
    labels = np.random.default_rng(0).integers(0, 10, size=60_000)
    parts = dirichlet_partition(labels, 1000, 0.1, 10, np.random.default_rng(1))
    assert len(parts) == 1000
    _assert_exact_cover(parts, len(labels))
    assert min(map(len, parts)) >= 10


def test_dirichlet_small_alpha_skews_labels():
    labels = np.repeat(np.arange(10), 200)
    parts = dirichlet_partition(labels, 20, 0.1, 5, np.random.default_rng(2))
    _assert_exact_cover(parts, len(labels))
    dominant = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    assert np.median(dominant) > 0.5  # most clients are dominated by one class at alpha=0.1


def test_dirichlet_refuses_impossible_minimum():
    with pytest.raises(UserError, match="min_samples"):
        dirichlet_partition(np.zeros(50, dtype=np.int64), 10, 0.5, 10, np.random.default_rng(0))


def test_train_test_split_keeps_both_sides_and_everything():
    idx = np.arange(100, 137)
    train, test = split_train_test(idx, 0.2, np.random.default_rng(0))
    assert len(test) == 7 and len(train) == 30
    assert np.array_equal(np.sort(np.concatenate([train, test])), idx)
    tr, te = split_train_test(np.array([4, 9]), 0.01, np.random.default_rng(0))
    assert len(tr) == 1 and len(te) == 1


@pytest.mark.parametrize("partition", ["niid1", "niid2"])
def test_niid_gives_each_domain_to_its_clients_and_covers_it_once(partition):
    domains = _domains()
    data = federate(domains, _cfg(data__partition=partition, data__alpha=0.3), num_classes=10)
    assert data.num_clients == 6
    assert [c.domain for c in data.clients] == [0, 0, 1, 1, 2, 2]
    for d, domain in enumerate(domains):
        held = [np.concatenate([c.train, c.test]) for c in data.clients if c.domain == d]
        _assert_exact_cover(held, len(domain.y))
        for c in data.clients:
            assert len(np.intersect1d(c.train, c.test)) == 0


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_single_domain_partitions_cover_once(partition):
    (domain,) = _domains((500,))
    data = federate([domain], _cfg(data__partition=partition, clients__num=9), num_classes=10)
    _assert_exact_cover([np.concatenate([c.train, c.test]) for c in data.clients], 500)
    assert all(len(c.test) >= 1 and len(c.train) >= 1 for c in data.clients)


def test_partitions_are_reproducible_from_the_seed():
    def splits(seed: int):
        data = federate(_domains(), _cfg(data__partition="niid2", seed=seed), num_classes=10)
        return [(c.train.tolist(), c.test.tolist()) for c in data.clients]

    assert splits(3) == splits(3)
    assert splits(3) != splits(4)


def test_niid_client_count_mismatch_names_the_key():
    with pytest.raises(UserError, match="clients.num"):
        federate(_domains(), _cfg(clients__num=5), num_classes=10)


def test_iid_over_several_domains_is_refused():
    with pytest.raises(UserError, match="data.partition"):
        federate(_domains(), _cfg(data__partition="iid"), num_classes=10)
