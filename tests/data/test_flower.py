"""Flower Datasets' partitioners over raysim's arrays: the same split a Flower user gets with the same seed."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.config import load_config
from raysim.data import Domain, build_federated_data, federate
from raysim.data.sklearn_sets import load_sklearn_digits
from raysim.errors import UserError


def _cfg(tmp_path, **over: object):
    base = {"data.name": "sklearn_digits", "clients.num": 10, "data.cache_dir": str(tmp_path / "cache")}
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def _shares(data) -> list[list[int]]:
    """Each client's whole share (train and test), sorted."""
    return [sorted(np.concatenate([c.train, c.test]).tolist()) for c in data.clients]


def _flower(partitioner, labels: np.ndarray, seed: int) -> list[list[int]]:
    """What a Flower user gets: FederatedDataset(shuffle=True, seed=seed) shuffles the split, then partitions it."""
    from datasets import Dataset

    partitioner.dataset = Dataset.from_dict({"label": labels, "id": np.arange(len(labels))}).shuffle(seed=seed)
    return [sorted(partitioner.load_partition(i)["id"]) for i in range(partitioner.num_partitions)]


@pytest.mark.parametrize("seed, alpha", [(0, 0.5), (3, 0.3), (7, 2.0)])
def test_dirichlet_is_flowers_dirichlet_partitioner(tmp_path, seed, alpha):
    from flwr_datasets.partitioner import DirichletPartitioner

    _, labels = load_sklearn_digits()
    data = build_federated_data(_cfg(tmp_path, seed=seed, data__alpha=alpha, data__partition="dirichlet"))
    expected = _flower(DirichletPartitioner(num_partitions=10, partition_by="label", alpha=alpha,
                                            min_partition_size=10, seed=seed), labels, seed)
    assert _shares(data) == expected
    again = build_federated_data(_cfg(tmp_path, seed=seed, data__alpha=alpha, data__partition="dirichlet"))
    assert _shares(again) == expected  # from the cache
    assert list((tmp_path / "cache").glob("partition-dirichlet-*.npz"))


@pytest.mark.parametrize("partition, extra, make", [
    ("iid", {}, lambda fp, seed: fp.IidPartitioner(num_partitions=10)),
    ("pathological", {"data.classes_per_client": 3},
     lambda fp, seed: fp.PathologicalPartitioner(num_partitions=10, partition_by="label", num_classes_per_partition=3,
                                                 seed=seed)),
    ("shard", {"data.shards_per_client": 2},
     lambda fp, seed: fp.ShardPartitioner(num_partitions=10, partition_by="label", num_shards_per_partition=2,
                                          seed=seed)),
    ("linear", {}, lambda fp, seed: fp.LinearPartitioner(num_partitions=10)),
    ("square", {}, lambda fp, seed: fp.SquarePartitioner(num_partitions=10)),
    ("exponential", {"clients.num": 5}, lambda fp, seed: fp.ExponentialPartitioner(num_partitions=5)),
    ("inner_dirichlet", {"data.alpha": 0.4},
     lambda fp, seed: fp.InnerDirichletPartitioner(partition_sizes=[180] * 7 + [179] * 3, partition_by="label",
                                                   alpha=0.4, seed=seed)),
])
def test_every_partition_is_flowers(tmp_path, partition, extra, make):
    from flwr_datasets import partitioner as fp

    _, labels = load_sklearn_digits()
    over = {"seed": 4, "data.partition": partition, **extra}
    data = build_federated_data(load_config(None, [
        f"{k}={v}" for k, v in {"data.name": "sklearn_digits", "clients.num": 10,
                               "data.cache_dir": str(tmp_path / "cache"), **over}.items()]))
    assert _shares(data) == _flower(make(fp, 4), labels, 4)
    if partition == "exponential":  # too many clients for its sizes: Flower's refusal, in one line
        with pytest.raises(UserError, match="config key 'clients.num': Flower's exponential partitioner refused"):
            build_federated_data(_cfg(tmp_path, data__partition="exponential"))


def test_partitions_show_their_defining_property(tmp_path):
    _, labels = load_sklearn_digits()
    patho = build_federated_data(_cfg(tmp_path, data__partition="pathological", data__classes_per_client=2))
    assert all(len(np.unique(labels[share])) <= 2 for share in _shares(patho))
    sizes = [len(s) for s in _shares(build_federated_data(_cfg(tmp_path, data__partition="linear")))]
    assert sizes == sorted(sizes) and sizes[-1] > 5 * sizes[0]  # client k holds ~k units
    iid = [len(s) for s in _shares(build_federated_data(_cfg(tmp_path, data__partition="iid")))]
    assert max(iid) - min(iid) <= 1


def test_natural_partition_follows_the_samples_own_client_ids(tmp_path):
    rng = np.random.default_rng(0)
    groups = np.repeat(np.array(["ann", "bob", "cy", "dee"]), [30, 50, 20, 40])
    rng.shuffle(groups)
    domain = Domain("d", rng.random((140, 4)).astype(np.float32), rng.integers(0, 3, 140), groups=groups)
    data = federate([domain], _cfg(tmp_path, clients__num=3, data__partition="natural"), num_classes=3)
    owners = [set(groups[share]) for share in _shares(data)]
    assert all(len(o) == 1 for o in owners) and len(set.union(*owners)) == 3
    with pytest.raises(UserError, match="clients.num.* has 4 natural clients"):
        federate([domain], _cfg(tmp_path, clients__num=5, data__partition="natural"), num_classes=3)
    with pytest.raises(UserError, match="natural needs a dataset whose samples carry natural client ids"):
        build_federated_data(_cfg(tmp_path, data__partition="natural"))


def test_flower_refusals_are_one_line_naming_the_keys(tmp_path):
    with pytest.raises(UserError, match=r"config key 'data.alpha': Flower's DirichletPartitioner found no split") as e:
        build_federated_data(_cfg(tmp_path, clients__num=150, data__alpha=0.01, data__partition="dirichlet"))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="data.partition_sizes"):
        build_federated_data(_cfg(tmp_path, data__partition="inner_dirichlet", data__partition_sizes="[5,5]"))


def test_runs_made_before_flowers_partitions_resume_with_raysims_own(tmp_path):
    import yaml

    from raysim.config import to_yaml
    from raysim.engine.runner import load_resume_config

    run_dir = tmp_path / "old"
    run_dir.mkdir()
    raw = yaml.safe_load(to_yaml(_cfg(tmp_path, data__partition="iid")))
    for key in ("self_balancing", "classes_per_client", "class_assignment", "shards_per_client", "shard_size",
                "keep_incomplete_shard", "partition_sizes"):
        del raw["data"][key]  # a config.yaml written before these keys existed
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    assert load_resume_config(run_dir, []).data.partition == "legacy_iid"
    new = _cfg(tmp_path, data__partition="iid")
    (run_dir / "config.yaml").write_text(to_yaml(new))
    assert load_resume_config(run_dir, []).data.partition == "iid"
