"""Tabular sets sliced by features: disjoint rows, per-client columns, per-client statistics, UCI file readers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.data import tabular as T
from raysim.errors import UserError


def _cfg(name: str, tmp_path: Path | None = None, **over: object):
    base = {"data.name": name, "clients.num": 4, "data.partition": "iid", "data.min_samples": 4}
    if tmp_path is not None:
        base["data.root"] = str(tmp_path)
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def _assert_rows_partitioned(data) -> None:
    held = np.concatenate([np.concatenate([c.train, c.test]) for c in data.clients])
    assert np.array_equal(np.sort(held), np.arange(len(data.domains[0].y)))


# ---------------------------------------------------------------------------------------------------- embedded
@pytest.mark.parametrize("name,rows,features,classes", [("breast_cancer", 569, 30, 2), ("wine", 178, 13, 3),
                                                        ("digits_table", 1797, 64, 10)])
def test_embedded_tables_slice_features_per_client(name, rows, features, classes):
    data = build_federated_data(_cfg(name, data__partition="dirichlet"))
    assert data.num_classes == classes and data.domains[0].x.shape == (rows, features)
    _assert_rows_partitioned(data)
    k = int(round(0.5 * features))
    column_sets = set()
    for cid, c in enumerate(data.clients):
        assert len(c.features) == k and len(np.unique(c.features)) == k
        assert data.input_shape(cid) == (k,)
        column_sets.add(tuple(c.features))
        x, y, _ = data.tensors(cid, "train")
        assert x.shape == (len(c.train), k) and x.dtype == torch.float32
        assert int(y.min()) >= 0 and int(y.max()) < classes
    assert len(column_sets) > 1  # clients see different columns


def test_standardisation_uses_the_clients_own_training_rows_only():
    data = build_federated_data(_cfg("breast_cancer"))
    x_all = data.domains[0].x
    for cid, c in enumerate(data.clients):
        own = x_all[np.ix_(c.train, c.features)].astype(np.float64)
        assert np.allclose(c.shift, own.mean(axis=0), rtol=1e-5)
        assert np.allclose(c.scale, own.std(axis=0), rtol=1e-4)
        x, _, _ = data.tensors(cid, "train")
        assert torch.allclose(x.mean(0), torch.zeros(x.shape[1]), atol=1e-4)
        assert torch.allclose(x.std(0, unbiased=False), torch.ones(x.shape[1]), atol=1e-3)


def test_feature_fraction_one_gives_every_column_and_build_is_reproducible():
    a = build_federated_data(_cfg("wine", data__feature_fraction=1.0))
    b = build_federated_data(_cfg("wine", data__feature_fraction=1.0))
    assert all(np.array_equal(c.features, np.arange(13)) for c in a.clients)
    for ca, cb in zip(a.clients, b.clients):
        assert np.array_equal(ca.train, cb.train) and np.array_equal(ca.shift, cb.shift)


# ---------------------------------------------------------------------------------------------------- UCI files
_WORK = ["Private", "Self-emp-not-inc", "State-gov", "?"]
_EDU = ["Bachelors", "HS-grad", "Masters", "11th"]
_OCC = ["Adm-clerical", "Exec-managerial", "Craft-repair", "?"]
_COUNTRY = ["United-States", "Mexico", "India", "?"]


def _adult_line(i: int, test: bool) -> str:
    label = ">50K" if i % 3 == 0 else "<=50K"
    fields = [str(20 + i), _WORK[i % 4], str(77516 + 997 * i), _EDU[i % 4], str(9 + i % 5),
              "Never-married" if i % 2 else "Married-civ-spouse", _OCC[(i + 1) % 4], "Not-in-family", "White",
              "Male" if i % 2 else "Female", str(2174 * (i % 2)), "0", str(30 + i % 20), _COUNTRY[(i + 2) % 4],
              label + ("." if test else "")]
    return ", ".join(fields)


def _write_adult(folder: Path, n_data: int = 40, n_test: int = 20) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adult.data").write_text("\n".join(_adult_line(i, False) for i in range(n_data)) + "\n\n")
    (folder / "adult.test").write_text("|1x3 Cross validator\n"
                                       + "\n".join(_adult_line(i, True) for i in range(n_data, n_data + n_test))
                                       + "\n")


def test_adult_reads_both_files_one_hot_and_missing_values(tmp_path):
    _write_adult(tmp_path / "adult")
    data = build_federated_data(_cfg("adult", tmp_path, data__feature_fraction=1.0))
    x = data.domains[0].x
    assert data.meta["classes"] == ["<=50K", ">50K"] and len(data.domains[0].y) == 60
    assert data.meta["num_features"] == 14
    columns = data.meta["columns"]
    assert "workclass=Private" in columns and not any(c.endswith("=?") for c in columns)
    work = [i for i, c in enumerate(columns) if c.startswith("workclass=")]
    assert np.all(x[3::4][:, work] == 0)  # '?' is no category: all zeros in its one-hot block
    _assert_rows_partitioned(data)
    for cid, c in enumerate(data.clients):
        onehot = [f for f in c.features if "=" in columns[f]]
        assert np.all(x[np.ix_(c.train, onehot)].sum(axis=0) > 0)  # only categories seen in own training rows
        assert np.all(c.shift[[i for i, f in enumerate(c.features) if "=" in columns[f]]] == 0)
        xt, _, _ = data.tensors(cid, "test")
        assert torch.isfinite(xt).all()


def _write_hcc(path: Path, n: int = 30) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        binary = [str(int(v)) for v in rng.integers(0, 2, 23)]
        numeric = [f"{v:.2f}" for v in rng.normal(50, 10, 26)]
        row = binary + numeric + [str(i % 2)]
        for j in rng.choice(49, size=3, replace=False):
            row[j] = "?"
        lines.append(",".join(row))
    path.write_text("\n".join(lines) + "\n")


def test_hcc_missing_values_become_the_clients_training_mean(tmp_path):
    _write_hcc(tmp_path / "hcc-data.txt")
    data = build_federated_data(_cfg("hcc", tmp_path, clients__num=2, data__feature_fraction=1.0))
    x = data.domains[0].x
    assert x.dtype == np.float32 and np.isnan(x).any()  # stored missing, filled per client
    assert data.num_classes == 2 and data.meta["num_features"] == 49
    for cid, c in enumerate(data.clients):
        numeric = [i for i, f in enumerate(c.features) if "=" not in data.meta["columns"][f]]
        own = x[np.ix_(c.train, c.features[numeric])]
        assert np.allclose(c.shift[numeric], np.nanmean(own, axis=0), rtol=1e-5, atol=1e-5)
        xt, _, _ = data.tensors(cid, "train")
        assert torch.isfinite(xt).all()
        rows, cols = np.nonzero(np.isnan(own))
        assert torch.all(xt[rows, torch.as_tensor(numeric)[cols]] == 0)


@pytest.mark.parametrize("header", [False, True])
def test_ilpd_csv_with_blank_ratio_and_optional_header(tmp_path, header):
    lines = ["Age,Gender,TB,DB,Alkphos,Sgpt,Sgot,TP,ALB,A/G Ratio,Selector"] if header else []
    for i in range(24):
        ratio = "" if i % 7 == 0 else f"{0.5 + i / 50:.2f}"
        lines.append(f"{20 + i},{'Female' if i % 3 else 'Male'},{0.7 + i / 10:.1f},0.1,{180 + i},16,18,6.8,3.3,"
                     f"{ratio},{1 + i % 2}")
    (tmp_path / "Indian Liver Patient Dataset (ILPD).csv").write_text("\n".join(lines) + "\n")
    data = build_federated_data(_cfg("ilpd", tmp_path, clients__num=2))
    assert len(data.domains[0].y) == 24 and data.meta["classes"] == ["1", "2"]
    assert data.meta["features_per_client"] == 5
    for cid in range(2):
        assert torch.isfinite(data.tensors(cid, "train")[0]).all()


def test_malformed_row_names_file_and_line(tmp_path):
    _write_adult(tmp_path)
    with open(tmp_path / "adult.data", "a") as f:
        f.write("39, State-gov, 77516\n")
    with pytest.raises(UserError, match=r"adult.data:42: expected 15"):
        build_federated_data(_cfg("adult", tmp_path))


def test_non_numeric_value_in_numeric_column(tmp_path):
    _write_hcc(tmp_path / "hcc-data.txt")
    text = (tmp_path / "hcc-data.txt").read_text().replace("\n", "\n" + ",".join(["x"] * 50) + "\n", 1)
    (tmp_path / "hcc-data.txt").write_text(text)
    with pytest.raises(UserError, match="not a number"):
        build_federated_data(_cfg("hcc", tmp_path))


@pytest.mark.parametrize("name,layout", [("adult", "adult.data"), ("hcc", "hcc-data.txt"), ("ilpd", "ILPD")])
def test_missing_files_name_the_key_and_layout(tmp_path, name, layout):
    with pytest.raises(UserError) as info:
        build_federated_data(_cfg(name, tmp_path))
    assert "data.root" in str(info.value) and layout in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UserError, match="data.root"):
        build_federated_data(_cfg(name))


def test_encode_puts_numeric_first_then_one_hot_blocks():
    table = T.Table("t", np.array([[1.0], [np.nan], [3.0]], dtype=np.float32), ["a"],
                    np.array([[0], [-1], [1]]), ["b"], [["u", "v"]], np.array([0, 1, 0]), ["p", "q"])
    x, groups, categorical, names = T.encode(table)
    assert names == ["a", "b=u", "b=v"] and categorical == [False, True]
    assert [g.tolist() for g in groups] == [[0], [1, 2]]
    assert np.array_equal(x[:, 1:], [[1, 0], [0, 0], [0, 1]]) and np.isnan(x[1, 0])
