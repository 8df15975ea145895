"""Built datasets kept in a process (``raysim.data.memo``): built once per config, each caller gets its own copy, and
only datasets that depend on the config alone are kept."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.config import load_config
from raysim.data import build_federated_data, memo
from raysim.registry import get_dataset, register_dataset


@pytest.fixture
def fresh_memo():
    memo.forget()
    yield memo.stats
    memo.forget()


def _cfg(*overrides: str):
    return load_config(None, ["data.name=sklearn_digits", "clients.num=4", "data.partition=dirichlet", *overrides])


def test_a_dataset_is_built_once_per_config_and_each_run_gets_its_own_copy(fresh_memo):
    before = dict(fresh_memo)
    first = build_federated_data(_cfg())
    second = build_federated_data(_cfg("train.lr=0.5", "rounds=7"))  # what the data does not read may differ
    assert fresh_memo["built"] - before["built"] == 1 and fresh_memo["reused"] - before["reused"] == 1
    assert first is not second and first.domains[0].x is not second.domains[0].x
    for a, b in zip(first.clients, second.clients):
        assert np.array_equal(a.train, b.train) and np.array_equal(a.test, b.test)

    # what a run (or an algorithm's prepare_data, as FAPD's) changes in its copy never reaches the next run
    second.domains[0].x[:] = 0
    second.clients[0].train[:] = 0
    second.meta["teacher"] = "attached"
    third = build_federated_data(_cfg())
    assert np.array_equal(third.domains[0].x, first.domains[0].x) and "teacher" not in third.meta
    assert np.array_equal(third.clients[0].train, first.clients[0].train)

    # everything the builder reads is in the key: another seed, clients.num or data key builds again
    for other in (["seed=1"], ["clients.num=5"], ["data.alpha=0.1"], ["data.test_fraction=0.3"]):
        built = fresh_memo["built"]
        data = build_federated_data(_cfg(*other))
        assert fresh_memo["built"] == built + 1, other
        if other == ["seed=1"]:
            assert not all(np.array_equal(a.train, b.train) for a, b in zip(first.clients, data.clients))


def test_only_datasets_of_the_config_alone_are_kept(fresh_memo):
    # one that reads the user's files (data.root) may change between runs: rebuilt every time (from the disk cache)
    assert memo.memo_key(load_config(None, ["data.name=mnist"]), get_dataset("mnist")) is None
    assert memo.memo_key(_cfg(), get_dataset("sklearn_digits")) is not None

    calls = []

    @register_dataset("memo_probe")
    def probe(cfg):  # a plugin's dataset may read anything: never kept
        calls.append(cfg.seed)
        return get_dataset("sklearn_digits")(cfg)

    cfg = load_config(None, ["data.name=memo_probe", "clients.num=4"])
    build_federated_data(cfg)
    build_federated_data(cfg)
    assert calls == [0, 0]

    # a plugin that registers a built-in name replaces raysim's builder: not kept either
    assert memo.memo_key(_cfg(), probe) is None
