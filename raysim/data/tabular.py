"""Tabular sets sliced by features (UNIDEAL's cross-domain tabular setting).

Each client holds a disjoint set of rows (the usual iid/dirichlet/niid partitions) and sees only a random subset of
the original columns (``data.feature_fraction``), so clients have different input widths; with
``data.feature_layout: shared`` every client's input is instead the whole encoded column space, its own columns at
their global index and the absent ones zero (after standardisation: the column's mean), so averaging methods run
the same sliced setting. Numeric columns are
standardised with the mean/std of that client's own training rows; categorical columns are one-hot encoded over the
categories that occur in that client's own training rows (others encode as all zeros). Missing values are NaN
(numeric: the client's training mean after standardisation) or no category (categorical).

Embedded: scikit-learn's ``breast_cancer``, ``wine`` and ``digits_table`` (8x8 digits as 64 columns). From
``data.root``: ``adult`` (UCI adult.data / adult.test), ``hcc`` (UCI hcc-data.txt), ``ilpd`` (UCI ILPD CSV).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from raysim.data import federate
from raysim.data.base import ClientSplit, Domain, FederatedData, local_root
from raysim.errors import UserError
from raysim.registry import register_dataset

MISSING = {"", "?", "NA", "nan", "NaN"}


@dataclass
class Table:
    """A labelled table before encoding: numeric columns (NaN = missing) and categorical codes (-1 = missing)."""

    name: str
    numeric: np.ndarray  # float32 [N, p]
    numeric_names: list[str]
    categorical: np.ndarray  # int64 [N, q] codes into ``categories[j]``
    categorical_names: list[str]
    categories: list[list[str]]
    y: np.ndarray  # int64 [N]
    classes: list[str]

    def take(self, rows: np.ndarray) -> "Table":
        return Table(self.name, self.numeric[rows], self.numeric_names, self.categorical[rows],
                     self.categorical_names, self.categories, self.y[rows], self.classes)


# ---------------------------------------------------------------------------------------------------- encoding
def encode(table: Table) -> tuple[np.ndarray, list[np.ndarray], list[bool], list[str]]:
    """(matrix float32 [N, D], column indices per original feature, is-categorical per feature, column names).

    Numeric features come first (one column each), then each categorical feature as one column per category.
    """
    n = len(table.y)
    p = table.numeric.shape[1]
    width = p + sum(len(c) for c in table.categories)
    x = np.zeros((n, width), dtype=np.float32)
    x[:, :p] = table.numeric
    groups = [np.array([j], dtype=np.int64) for j in range(p)]
    names = list(table.numeric_names)
    start = p
    for j, cats in enumerate(table.categories):
        codes = table.categorical[:, j]
        rows = np.flatnonzero(codes >= 0)
        x[rows, start + codes[rows]] = 1.0
        groups.append(np.arange(start, start + len(cats), dtype=np.int64))
        names += [f"{table.categorical_names[j]}={c}" for c in cats]
        start += len(cats)
    return x, groups, [False] * p + [True] * len(table.categories), names


def client_view(x: np.ndarray, train: np.ndarray, groups: Sequence[np.ndarray], categorical: Sequence[bool],
                chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(columns, shift, scale) for one client from its own training rows only.

    A categorical feature contributes the one-hot columns of the categories seen in the client's training rows;
    numeric columns get that split's mean/std (NaN-aware; constant or empty columns get scale 1).
    """
    cols, shift, scale = [], [], []
    for f in chosen:
        group = groups[f]
        if categorical[f]:
            present = group[x[np.ix_(train, group)].sum(axis=0) > 0]
            cols.append(present)
            shift.append(np.zeros(len(present)))
            scale.append(np.ones(len(present)))
        else:
            values = x[train, group[0]].astype(np.float64)
            finite = values[np.isfinite(values)]
            mean = finite.mean() if len(finite) else 0.0
            std = finite.std() if len(finite) else 1.0
            cols.append(group)
            shift.append(np.array([mean]))
            scale.append(np.array([std if std > 1e-8 else 1.0]))
    columns = np.concatenate(cols).astype(np.int64)
    return columns, np.concatenate(shift).astype(np.float32), np.concatenate(scale).astype(np.float32)


def feature_federate(table: Table, cfg) -> FederatedData:
    """Partition the rows with the usual ``data.partition``, then give each client its own random column subset."""
    table = _cap(table, cfg.data.samples_per_domain, cfg.seed)
    x, groups, categorical, names = encode(table)
    data = federate([Domain(table.name, x, table.y)], cfg, num_classes=len(table.classes))
    num_features = len(groups)
    k = max(1, int(round(cfg.data.feature_fraction * num_features)))
    shared = cfg.data.feature_layout == "shared"  # every client's row in the whole column space, absent ones zero
    clients = []
    for cid, split in enumerate(data.clients):
        rng = np.random.default_rng([cfg.seed, 104729, cid])
        chosen = np.sort(rng.choice(num_features, size=k, replace=False))
        columns, shift, scale = client_view(x, split.train, groups, categorical, chosen)
        if len(columns) == 0:  # only categorical features whose values are all missing in this client's rows
            numeric = [f for f in range(num_features) if not categorical[f]] or list(range(num_features))
            chosen = np.array([numeric[int(rng.integers(len(numeric)))]])
            columns, shift, scale = client_view(x, split.train, groups, categorical, chosen)
        clients.append(ClientSplit(domain=split.domain, train=split.train, test=split.test, features=columns,
                                   shift=shift, scale=scale, width=x.shape[1] if shared else None))
    data.clients = clients
    data.meta.update({"columns": names, "classes": table.classes, "features_per_client": k,
                      "num_features": num_features})
    return data


def _cap(table: Table, cap: Optional[int], seed: int) -> Table:
    if cap is None or cap >= len(table.y):
        return table
    rows = np.sort(np.random.default_rng([seed, 4]).choice(len(table.y), size=cap, replace=False))
    return table.take(rows)


def _labels(raw: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    classes = sorted(set(raw))
    lookup = {c: i for i, c in enumerate(classes)}
    return np.array([lookup[v] for v in raw], dtype=np.int64), classes


def _numeric_table(name: str, x: np.ndarray, y: np.ndarray, names: Sequence[str], classes: Sequence) -> Table:
    return Table(name, np.asarray(x, dtype=np.float32), list(names), np.zeros((len(y), 0), dtype=np.int64), [], [],
                 np.asarray(y, dtype=np.int64), [str(c) for c in classes])


# ---------------------------------------------------------------------------------------------------- UCI files
def _find(cfg, dataset: str, filenames: Sequence[str], subdirs: Sequence[str], layout: str) -> Path:
    root = local_root(cfg, dataset, layout)
    for folder in [root, *(root / s for s in subdirs)]:
        for fname in filenames:
            if (folder / fname).is_file():
                return folder / fname
    raise UserError(f"config key 'data.root': {root} has no {dataset} (expected {layout})")


def _rows(path: Path, width: int, skip: Callable[[list[str]], bool] = lambda r: False) -> list[list[str]]:
    """Comma-separated rows with surrounding spaces stripped; blank lines skipped; every row must have ``width``."""
    rows = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        for lineno, row in enumerate(csv.reader(f, skipinitialspace=True), start=1):
            row = [v.strip() for v in row]
            if not row or all(v == "" for v in row) or skip(row):
                continue
            if len(row) != width:
                raise UserError(f"{path}:{lineno}: expected {width} comma-separated fields, found {len(row)}")
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no data rows")
    return rows


def _to_float(path: Path, rows: list[list[str]], col: int, name: str) -> np.ndarray:
    out = np.empty(len(rows), dtype=np.float32)
    for i, row in enumerate(rows):
        v = row[col]
        if v in MISSING:
            out[i] = np.nan
            continue
        try:
            out[i] = float(v)
        except ValueError:
            raise UserError(f"{path}: column {name!r} holds {v!r}, not a number") from None
    return out


def _to_codes(rows: list[list[str]], col: int) -> tuple[np.ndarray, list[str]]:
    values = [row[col] for row in rows]
    cats = sorted({v for v in values if v not in MISSING})
    lookup = {c: i for i, c in enumerate(cats)}
    return np.array([lookup.get(v, -1) for v in values], dtype=np.int64), cats


def _table_from_rows(name: str, path: Path, rows: list[list[str]], columns: Sequence[tuple[str, str]],
                     label_col: int, label_map: Callable[[str], str] = lambda v: v) -> Table:
    """columns: (name, 'num' | 'cat') for every field except the label."""
    numeric, num_names, codes, cat_names, cats = [], [], [], [], []
    feature_cols = [c for c in range(len(columns) + 1) if c != label_col]
    for col, (cname, kind) in zip(feature_cols, columns):
        if kind == "num":
            numeric.append(_to_float(path, rows, col, cname))
            num_names.append(cname)
        else:
            c, values = _to_codes(rows, col)
            codes.append(c)
            cat_names.append(cname)
            cats.append(values)
    raw_labels = [label_map(r[label_col]) for r in rows]
    if any(v in MISSING for v in raw_labels):
        raise UserError(f"{path}: some rows have no class label")
    y, classes = _labels(raw_labels)
    n = len(rows)
    return Table(name, np.stack(numeric, axis=1) if numeric else np.zeros((n, 0), np.float32), num_names,
                 np.stack(codes, axis=1) if codes else np.zeros((n, 0), np.int64), cat_names, cats, y, classes)


ADULT_COLUMNS = [("age", "num"), ("workclass", "cat"), ("fnlwgt", "num"), ("education", "cat"),
                 ("education-num", "num"), ("marital-status", "cat"), ("occupation", "cat"), ("relationship", "cat"),
                 ("race", "cat"), ("sex", "cat"), ("capital-gain", "num"), ("capital-loss", "num"),
                 ("hours-per-week", "num"), ("native-country", "cat")]
ADULT_LAYOUT = "<data.root>/adult.data and optionally adult.test (UCI Adult), directly or in <data.root>/adult/"


def read_adult(data_path: Path, test_path: Optional[Path] = None) -> Table:
    """UCI Adult: 14 features + income; adult.test starts with a '|1x3 Cross validator' line and ends labels '.'."""
    rows = _rows(data_path, 15)
    if test_path is not None and test_path.is_file():
        rows += _rows(test_path, 15, skip=lambda r: r[0].startswith("|"))
    return _table_from_rows("adult", data_path, rows, ADULT_COLUMNS, 14, lambda v: v.rstrip("."))


HCC_BINARY = ["gender", "symptoms", "alcohol", "hbsag", "hbeag", "hbcab", "hcvab", "cirrhosis", "endemic", "smoking",
              "diabetes", "obesity", "hemochro", "aht", "cri", "hiv", "nash", "varices", "spleno", "pht", "pvt",
              "metastasis", "hallmark"]
HCC_NUMERIC = ["age", "grams_day", "packs_year", "ps", "encephalopathy", "ascites", "inr", "afp", "hemoglobin", "mcv",
               "leucocytes", "platelets", "albumin", "total_bil", "alt", "ast", "ggt", "alp", "tp", "creatinine",
               "nodules", "major_dim", "dir_bil", "iron", "sat", "ferritin"]
HCC_LAYOUT = "<data.root>/hcc-data.txt (UCI HCC Survival: 49 comma-separated features + class, '?' = missing)"


def read_hcc(path: Path) -> Table:
    """UCI HCC Survival: 23 binary nominal features (one-hot), 26 numeric/ordinal ones, class 0 = dies, 1 = lives."""
    rows = _rows(path, 50)
    columns = [(c, "cat") for c in HCC_BINARY] + [(c, "num") for c in HCC_NUMERIC]
    return _table_from_rows("hcc", path, rows, columns, 49)


ILPD_COLUMNS = [("age", "num"), ("gender", "cat"), ("tb", "num"), ("db", "num"), ("alkphos", "num"), ("sgpt", "num"),
                ("sgot", "num"), ("tp", "num"), ("alb", "num"), ("ag_ratio", "num")]
ILPD_FILES = ("Indian Liver Patient Dataset (ILPD).csv", "ilpd.csv", "ILPD.csv", "indian_liver_patient.csv")
ILPD_LAYOUT = "<data.root>/Indian Liver Patient Dataset (ILPD).csv (UCI ILPD: 10 features + selector 1/2)"


def read_ilpd(path: Path) -> Table:
    """UCI ILPD: age, gender, 8 lab values (A/G ratio has blanks), selector 1 = patient, 2 = not; a header is
    skipped when present (Kaggle's copy has one).
    """
    rows = _rows(path, 11, skip=lambda r: not _is_number(r[0]))
    return _table_from_rows("ilpd", path, rows, ILPD_COLUMNS, 10)


def _is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------------- registry
def _sklearn(loader: str, name: str) -> Table:
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, loader)()
    names = [str(n) for n in getattr(bunch, "feature_names", [f"x{i}" for i in range(bunch.data.shape[1])])]
    classes = [str(c) for c in getattr(bunch, "target_names", range(int(bunch.target.max()) + 1))]
    return _numeric_table(name, bunch.data, bunch.target, names, classes)


@register_dataset("breast_cancer")
def breast_cancer(cfg) -> FederatedData:
    """scikit-learn's Wisconsin breast cancer table: 569 rows, 30 numeric columns, 2 classes."""
    return feature_federate(_sklearn("load_breast_cancer", "breast_cancer"), cfg)


@register_dataset("wine")
def wine(cfg) -> FederatedData:
    """scikit-learn's wine table: 178 rows, 13 numeric columns, 3 classes."""
    return feature_federate(_sklearn("load_wine", "wine"), cfg)


@register_dataset("digits_table")
def digits_table(cfg) -> FederatedData:
    """scikit-learn's 8x8 digits as a 64-column table: 1,797 rows, 10 classes."""
    return feature_federate(_sklearn("load_digits", "digits_table"), cfg)


@register_dataset("adult")
def adult(cfg) -> FederatedData:
    """UCI Adult (income > 50K) from data.root: 6 numeric and 8 categorical columns, '?' = missing."""
    path = _find(cfg, "adult", ["adult.data"], ["adult"], ADULT_LAYOUT)
    return feature_federate(read_adult(path, path.parent / "adult.test"), cfg)


@register_dataset("hcc")
def hcc(cfg) -> FederatedData:
    """UCI HCC Survival from data.root: 165 rows, 49 features, many missing."""
    path = _find(cfg, "hcc", ["hcc-data.txt"], ["hcc", "hcc-survival", "hcc+survival"], HCC_LAYOUT)
    return feature_federate(read_hcc(path), cfg)


@register_dataset("ilpd")
def ilpd(cfg) -> FederatedData:
    """UCI Indian Liver Patient Dataset from data.root: 583 rows, 10 features."""
    path = _find(cfg, "ilpd", ILPD_FILES, ["ilpd", "ILPD"], ILPD_LAYOUT)
    return feature_federate(read_ilpd(path), cfg)
