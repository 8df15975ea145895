"""LEAF's natural federations from local files: FEMNIST (handwriting, its writers as clients) and Shakespeare
(next-character prediction, each play's speaking role as a client). Caldas et al., "LEAF: A Benchmark for Federated
Settings" (2018); the data and its preprocessing: github.com/TalwalkarLab/leaf, ``data/femnist`` and
``data/shakespeare``.

Nothing is downloaded. ``data.root`` holds LEAF's published JSON layout, as its ``preprocess.sh`` writes it with
``-t sample`` (each user's samples split into train and test): ``<root>/<set>/data/train/*.json`` and
``<root>/<set>/data/test/*.json`` (or those two folders right under ``data.root``). Every file is
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`` (Shakespeare's may add
``"hierarchies"``). FEMNIST's ``x`` is a 28x28 image flattened to 784 values ``k/255`` (stored here as uint8), ``y`` a
class in 0..61 (digits, upper case, lower case); Shakespeare's ``x`` is 80 characters and ``y`` the next one, both
read as indices into LEAF's 80-letter alphabet (``language_utils.ALL_LETTERS``; a character outside it, which LEAF's
preprocessing does not produce, reads as a space).

``data.partition: natural`` (the shipped configs): client i is the i-th user in LEAF's files (sorted by file name,
then in file order), the first ``clients.num`` of them, each with LEAF's own train/test split. Any other partition
pools the users' training samples and deals them out as usual, LEAF's test samples being the official test split
held by the evaluation (``data.test_split``). The parsed arrays are cached (``data.cache_dir``), keyed by the files'
names, sizes and times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from raysim.data import federate
from raysim.data.base import ClientSplit, Domain, FederatedData, channel_stats, local_root
from raysim.data.cache import cached_arrays
from raysim.errors import UserError
from raysim.registry import register_dataset

# LEAF's models/utils/language_utils.py: the Shakespeare alphabet (also its 80 classes)
LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ_LEN = 80
FEMNIST_CLASSES = 62
GET = "made by LEAF's preprocess.sh with -t sample: github.com/TalwalkarLab/leaf"


def layout(name: str) -> str:
    return (f"<data.root>/{name}/data/train/*.json and <data.root>/{name}/data/test/*.json, LEAF's JSON layout "
            f"({GET}, data/{name})")


def leaf_folders(cfg, name: str) -> tuple[Path, Path]:
    """The ``train`` and ``test`` folders of LEAF set ``name`` under ``data.root``."""
    root = local_root(cfg, name, layout(name))
    for base in (root / name / "data", root / name, root / "data", root):
        if (base / "train").is_dir() and (base / "test").is_dir():
            return base / "train", base / "test"
    raise UserError(f"config key 'data.root': {root} holds no LEAF {name} (expected {layout(name)})")


def read_users(folder: Path, name: str) -> dict[str, tuple[list, list]]:
    """user -> (x, y) over every ``*.json`` of ``folder``, in LEAF's order (files by name, then users in a file)."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise UserError(f"config key 'data.root': {folder} holds no *.json (expected {layout(name)})")
    users: dict[str, tuple[list, list]] = {}
    for path in files:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            order, data = raw["users"], raw["user_data"]
            for user in order:
                xs, ys = data[user]["x"], data[user]["y"]
                if len(xs) != len(ys):
                    raise ValueError(f"user {user!r} has {len(xs)} inputs and {len(ys)} labels")
                have = users.setdefault(str(user), ([], []))
                have[0].extend(xs)
                have[1].extend(ys)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"config key 'data.root': {path} is not a LEAF {name} file ({type(exc).__name__}: "
                            f"{str(exc)[:80]}; expected {layout(name)})") from None
    return users


def _files_key(*folders: Path) -> list:
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for f in folders for p in sorted(f.glob("*.json"))]


def _parsed(cfg, name: str, encode: Callable[[list, list, str], tuple[np.ndarray, np.ndarray]]) -> dict:
    """LEAF's train and test files as arrays (cached): x, y, the user index of each sample, train (0) or test (1),
    and the user names."""
    train_dir, test_dir = leaf_folders(cfg, name)

    def build() -> dict[str, np.ndarray]:
        train, test = read_users(train_dir, name), read_users(test_dir, name)
        users = list(train)
        xs, ys, owner, split = [], [], [], []
        for part, table in ((0, train), (1, test)):
            for i, user in enumerate(users):
                x, y = table.get(user, ([], []))
                if not y:
                    continue
                xa, ya = encode(x, y, f"{name} user {user!r}")
                xs.append(xa)
                ys.append(ya)
                owner.append(np.full(len(ya), i, dtype=np.int64))
                split.append(np.full(len(ya), part, dtype=np.int8))
        return {"x": np.concatenate(xs), "y": np.concatenate(ys), "owner": np.concatenate(owner),
                "split": np.concatenate(split), "users": np.array(users, dtype=str)}

    return cached_arrays(cfg, f"leaf-{name}", {"files": _files_key(train_dir, test_dir)}, build)


def _federation(cfg, name: str, arrays: dict, domain: Domain, num_classes: int) -> FederatedData:
    if cfg.data.samples_per_domain is not None:
        raise UserError(f"config key 'data.samples_per_domain': {name} is LEAF's federation as published; choose "
                        f"fewer users with clients.num instead")
    owner, split, users = arrays["owner"], arrays["split"], arrays["users"]
    if cfg.data.partition == "natural":
        num = cfg.clients.num
        if num > len(users):
            raise UserError(f"config key 'clients.num': {cfg.data.root} holds {len(users)} {name} users, fewer "
                            f"than clients.num={num}")
        order = np.lexsort((np.arange(len(owner)), split, owner))  # by user, train before test, in file order
        bounds = np.searchsorted(owner[order], np.arange(len(users) + 1))
        clients = []
        for i in range(num):
            rows = order[bounds[i]:bounds[i + 1]]
            train, test = rows[split[rows] == 0], rows[split[rows] == 1]
            if len(test) == 0:
                raise UserError(f"config key 'data.root': {name} user {users[i]!r} has no test samples; raysim "
                                f"needs LEAF's per-user split (preprocess.sh -t sample), not -t user")
            clients.append(ClientSplit(domain=0, train=np.sort(train).astype(np.int64),
                                       test=np.sort(test).astype(np.int64)))
        data = FederatedData(domains=[domain], clients=clients, num_classes=num_classes)
    else:
        train = np.flatnonzero(split == 0).astype(np.int64)
        if cfg.data.test_split == "official":
            data = federate([domain], cfg, num_classes=num_classes, pools=[train])
            data.server_test = ClientSplit(domain=0, train=np.zeros(0, dtype=np.int64),
                                           test=np.flatnonzero(split == 1).astype(np.int64))
        else:
            data = federate([domain], cfg, num_classes=num_classes)
    data.meta["users"] = [str(u) for u in users[:data.num_clients]] if cfg.data.partition == "natural" else []
    return data


# ---------------------------------------------------------------------------------------------------- FEMNIST
def _femnist_arrays(x: list, y: list, who: str) -> tuple[np.ndarray, np.ndarray]:
    pixels = np.asarray(x, dtype=np.float32)
    labels = np.asarray(y, dtype=np.int64)
    if pixels.ndim != 2 or pixels.shape[1] != 28 * 28:
        raise UserError(f"config key 'data.root': {who} has inputs of shape {list(pixels.shape[1:])}, not 784 "
                        f"pixels (expected {layout('femnist')})")
    if labels.min() < 0 or labels.max() >= FEMNIST_CLASSES:
        raise UserError(f"config key 'data.root': {who} has labels outside 0..61 (expected {layout('femnist')})")
    return np.rint(np.clip(pixels, 0.0, 1.0) * 255).astype(np.uint8).reshape(-1, 1, 28, 28), labels


@register_dataset("femnist")
def femnist(cfg) -> FederatedData:
    """LEAF's FEMNIST from data.root (its JSON layout): 28x28 handwritten digits and letters, 62 classes, its
    writers as clients (data.partition=natural)."""
    arrays = _parsed(cfg, "femnist", _femnist_arrays)
    x = arrays["x"]
    train = arrays["split"] == 0
    mean, std = channel_stats(x[train])
    domain = Domain("femnist", x, arrays["y"], mean=mean, std=std, groups=arrays["owner"])
    return _federation(cfg, "femnist", arrays, domain, FEMNIST_CLASSES)


# ---------------------------------------------------------------------------------------------------- Shakespeare
_INDEX = np.full(128, LETTERS.index(" "), dtype=np.int16)  # LEAF's alphabet is ASCII; anything else: a space
_INDEX[[ord(c) for c in LETTERS]] = np.arange(len(LETTERS), dtype=np.int16)


def encode_text(texts: list[str]) -> np.ndarray:
    """Characters -> indices into LEAF's alphabet (int16; others read as a space)."""
    codes = np.array([[ord(c) for c in t] for t in texts], dtype=np.int64).reshape(len(texts), -1)
    return _INDEX[np.minimum(codes, 127)]


def _shakespeare_arrays(x: list, y: list, who: str) -> tuple[np.ndarray, np.ndarray]:
    if any(not isinstance(t, str) or len(t) != SEQ_LEN for t in x) or any(
            not isinstance(c, str) or len(c) != 1 for c in y):
        raise UserError(f"config key 'data.root': {who} does not hold {SEQ_LEN}-character inputs and one-character "
                        f"labels (expected {layout('shakespeare')})")
    return encode_text(x), encode_text(y)[:, 0].astype(np.int64)


@register_dataset("shakespeare")
def shakespeare(cfg) -> FederatedData:
    """LEAF's Shakespeare from data.root (its JSON layout): the next character after 80, 80 classes, each play's
    speaking roles as clients (data.partition=natural); model.name=char_lstm is LEAF's model."""
    arrays = _parsed(cfg, "shakespeare", _shakespeare_arrays)
    domain = Domain("shakespeare", arrays["x"], arrays["y"], groups=arrays["owner"])
    return _federation(cfg, "shakespeare", arrays, domain, len(LETTERS))
