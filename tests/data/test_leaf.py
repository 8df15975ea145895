"""LEAF's FEMNIST and Shakespeare from generated folders in LEAF's published JSON layout: users become clients with
LEAF's own train/test split, and FedAvg runs on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import raysim
from raysim.cli import main
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.data.leaf import LETTERS
from raysim.errors import UserError


def write_leaf(root: Path, name: str, users: dict[str, dict[str, tuple[list, list]]], per_file: int = 2) -> None:
    """``root/<name>/data/{train,test}/*.json`` as LEAF's split_data.py writes them: users spread over files of at
    most ``per_file`` users, each file {"users", "num_samples", "user_data"}."""
    names = list(users)
    for part in ("train", "test"):
        folder = root / name / "data" / part
        folder.mkdir(parents=True)
        for f, start in enumerate(range(0, len(names), per_file)):
            chunk = names[start:start + per_file]
            doc = {"users": chunk, "num_samples": [len(users[u][part][1]) for u in chunk],
                   "user_data": {u: {"x": users[u][part][0], "y": users[u][part][1]} for u in chunk}}
            (folder / f"all_data_{f}_niid_0_keep_0_{part}_9.json").write_text(json.dumps(doc))


def femnist_users(rng: np.random.Generator, sizes: dict[str, tuple[int, int]]) -> dict:
    """Writers with images of k/255 pixel values (as LEAF stores them) and labels in 0..61."""
    def samples(n: int) -> tuple[list, list]:
        return ((rng.integers(0, 256, size=(n, 784)) / 255).tolist(), rng.integers(0, 62, size=n).tolist())

    return {u: {"train": samples(a), "test": samples(b)} for u, (a, b) in sizes.items()}


FEMNIST_SIZES = {"f0000_14": (24, 4), "f0001_41": (17, 3), "f0002_07": (30, 5), "f0003_33": (12, 2),
                 "f0004_12": (20, 3)}


@pytest.fixture
def femnist_root(tmp_path) -> tuple[Path, dict]:
    users = femnist_users(np.random.default_rng(0), FEMNIST_SIZES)
    write_leaf(tmp_path / "leaf", "femnist", users)
    return tmp_path / "leaf", users


def _cfg(root: Path, tmp_path: Path, name: str = "femnist", **over: object):
    base = {"data.name": name, "data.root": str(root), "data.partition": "natural", "clients.num": 5,
            "data.cache_dir": str(tmp_path / "cache")}
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def test_femnist_writers_are_the_clients_with_leafs_own_split(femnist_root, tmp_path):
    root, users = femnist_root
    data = build_federated_data(_cfg(root, tmp_path))
    assert data.num_clients == 5 and data.num_classes == 62
    assert data.meta["users"] == list(FEMNIST_SIZES)
    x_all, y_all = data.domains[0].x, data.domains[0].y
    assert x_all.dtype == np.uint8 and x_all.shape[1:] == (1, 28, 28)
    for cid, user in enumerate(FEMNIST_SIZES):
        split = data.clients[cid]
        for part, idx in (("train", split.train), ("test", split.test)):
            x, y = users[user][part]
            assert len(idx) == len(y)
            assert y_all[idx].tolist() == y  # the writer's own samples, in LEAF's order
            assert np.array_equal(x_all[idx].reshape(len(idx), -1), np.rint(np.array(x) * 255).astype(np.uint8))
    fewer = build_federated_data(_cfg(root, tmp_path, clients__num=3))
    assert fewer.num_clients == 3 and fewer.meta["users"] == list(FEMNIST_SIZES)[:3]


def test_femnist_fedavg_two_rounds_with_the_writers_as_clients(femnist_root, tmp_path):
    root, _ = femnist_root
    result = raysim.run(None, *[f"data.{k}={v}" for k, v in (("name", "femnist"), ("root", root),
                                                              ("partition", "natural"),
                                                              ("cache_dir", tmp_path / "cache"))],
                        "clients.num=5", "rounds=2", "algorithm.name=fedavg", "model.name=cnn", "model.width=8",
                        "model.feature_dim=16", "engine.backend=inline", f"log.dir={tmp_path / 'run'}")
    assert list(result.metrics["round"]) == [1, 2]
    assert result.metrics["acc_mean"].notna().all()
    evaluated = [json.loads(line) for line in (result.run_dir / "client_metrics.jsonl").read_text().splitlines()]
    assert evaluated[-1]["client"] == [0, 1, 2, 3, 4]
    assert evaluated[-1]["total"] == [test for _, test in FEMNIST_SIZES.values()]  # each writer's LEAF test split


def test_other_partitions_pool_the_writers_with_leafs_test_split_held_by_the_evaluation(femnist_root, tmp_path):
    root, _ = femnist_root
    data = build_federated_data(_cfg(root, tmp_path, data__partition="iid", clients__num=4))
    n_train = sum(a for a, _ in FEMNIST_SIZES.values())
    assert sum(data.num_train(c) + data.num_test(c) for c in range(4)) == n_train
    assert len(data.server_test.test) == sum(b for _, b in FEMNIST_SIZES.values())


def test_leaf_errors_are_one_line_and_say_where_to_get_the_data(femnist_root, tmp_path):
    root, _ = femnist_root
    with pytest.raises(UserError, match="holds no LEAF femnist .*github.com/TalwalkarLab/leaf"):
        build_federated_data(_cfg(tmp_path / "nothing", tmp_path))
    with pytest.raises(UserError, match="config key 'data.root': femnist is read from local files"):
        build_federated_data(load_config(None, ["data.name=femnist", "data.partition=natural"]))
    with pytest.raises(UserError, match="holds 5 femnist users, fewer than clients.num=6"):
        build_federated_data(_cfg(root, tmp_path, clients__num=6))
    (root / "femnist" / "data" / "train" / "broken.json").write_text("{\"users\": [\"a\"]}")
    with pytest.raises(UserError, match="broken.json is not a LEAF femnist file"):
        build_federated_data(_cfg(root, tmp_path, data__cache_dir=tmp_path / "other-cache"))


def test_cli_refuses_a_missing_leaf_folder_in_one_line(tmp_path, capsys):
    assert main(["run", "data.name=femnist", f"data.root={tmp_path}", "data.partition=natural",
                 "engine.backend=inline", f"log.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "femnist/data/train/*.json" in err and not (tmp_path / "run").exists()


def _speakers(rng: np.random.Generator, sizes: dict[str, tuple[int, int]]) -> dict:
    text = "".join(rng.choice(list(LETTERS[1:]), size=4000))

    def samples(n: int) -> tuple[list, list]:
        starts = rng.integers(0, len(text) - 81, size=n)
        return [text[s:s + 80] for s in starts], [text[s + 80] for s in starts]

    return {u: {"train": samples(a), "test": samples(b)} for u, (a, b) in sizes.items()}


def test_shakespeare_speakers_and_the_char_lstm(tmp_path):
    users = _speakers(np.random.default_rng(1), {"THE_TEMPEST_PROSPERO": (40, 6), "HAMLET_HORATIO": (25, 4),
                                                 "KING_LEAR_FOOL": (30, 5)})
    write_leaf(tmp_path / "leaf", "shakespeare", users)
    data = build_federated_data(_cfg(tmp_path / "leaf", tmp_path, name="shakespeare", clients__num=3))
    assert data.num_classes == 80 and data.input_shape(0) == (80,)
    x, y, _ = data.tensors(1, "train")
    first = users["HAMLET_HORATIO"]["train"]
    assert "".join(LETTERS[int(i)] for i in x[0]) == first[0][0] and LETTERS[int(y[0])] == first[1][0]
    result = raysim.run(None, "data.name=shakespeare", f"data.root={tmp_path / 'leaf'}", "data.partition=natural",
                        f"data.cache_dir={tmp_path / 'cache'}", "clients.num=3", "rounds=1", "model.name=char_lstm",
                        "model.feature_dim=16", "train.batch_size=10", "engine.backend=inline",
                        f"log.dir={tmp_path / 'run'}")
    assert len(result.metrics) == 1 and 0.0 <= result.metrics["acc_mean"].iloc[0] <= 1.0


def test_char_lstm_is_leafs_stacked_lstm():
    import torch

    from raysim.models import build_model

    cfg = load_config(None, ["model.name=char_lstm", "model.feature_dim=256"])
    model = build_model(cfg, "char_lstm", (80,), 80)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["backbone.embed.weight"] == (80, 8)
    assert shapes["backbone.lstm.weight_ih_l0"] == (4 * 256, 8) and shapes["backbone.lstm.weight_hh_l1"] == (1024, 256)
    assert shapes["head.weight"] == (80, 256)
    x = torch.randint(0, 80, (3, 80)).float()  # indices, as the data layer hands them over
    assert model(x).shape == (3, 80)
