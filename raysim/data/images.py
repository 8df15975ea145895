"""Image sets read from local files under ``data.root``: CIFAR-10/100 (python pickle batches) and Tiny-ImageNet.

Nothing is downloaded. One domain holds the training split, then the official test split (CIFAR's test batch,
Tiny-ImageNet's val/). With ``data.test_split: official`` (the default) clients partition only the training split,
each drawing its own train/test split from its share (``data.test_fraction``), and the official test split is held
by the evaluation (``FederatedData.server_test``: ``acc_global`` is measured on it); with ``pooled`` both splits are
pooled and dealt out to the clients, as before. Pixels stay uint8 [N, 3, H, W]; per-channel mean/std (of the
training split under ``official``) normalise them on the fly.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from raysim.data import federate
from raysim.data.base import ClientSplit, Domain, FederatedData, channel_stats, local_root, subset_indices
from raysim.data.cache import cached_arrays
from raysim.errors import UserError
from raysim.registry import register_dataset

CIFAR10_LAYOUT = ("<data.root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} "
                  "(CIFAR-10 python version, extracted)")
CIFAR100_LAYOUT = "<data.root>/cifar-100-python/{train,test,meta} (CIFAR-100 python version, extracted)"
TINY_LAYOUT = ("<data.root>/tiny-imagenet-200/ with train/<wnid>/images/*.JPEG, val/images/*.JPEG and "
               "val/val_annotations.txt (optional wnids.txt)")


def _domain(name: str, x: np.ndarray, y: np.ndarray) -> Domain:
    mean, std = channel_stats(x)
    return Domain(name, x, y, mean=mean, std=std)


def official_keep(cfg, n_train: int, n_test: int) -> tuple[np.ndarray, int]:
    """(rows to load, how many of them are training rows) of a train-then-test array: ``data.samples_per_domain``
    caps the training split, and the official test split in proportion."""
    cap = cfg.data.samples_per_domain
    keep_train = subset_indices(n_train, cap, np.random.default_rng([cfg.seed, 5]))
    test_cap = None if cap is None or cap >= n_train else max(1, int(round(cap * n_test / max(n_train, 1))))
    keep_test = n_train + subset_indices(n_test, test_cap, np.random.default_rng([cfg.seed + 1, 5]))
    return np.concatenate([keep_train, keep_test]), len(keep_train)


def federate_official(cfg, domain: Domain, n_train: int, num_classes: int) -> FederatedData:
    """Clients partition the domain's first ``n_train`` rows (the training split); the rest, the official test
    split, is ``server_test``, held by the evaluation."""
    train = np.arange(n_train, dtype=np.int64)
    data = federate([domain], cfg, num_classes=num_classes, pools=[train])
    data.server_test = ClientSplit(domain=0, train=np.zeros(0, dtype=np.int64),
                                   test=np.arange(n_train, len(domain.y), dtype=np.int64))
    return data


# ---------------------------------------------------------------------------------------------------- CIFAR
class BatchUnpickler(pickle.Unpickler):
    """Unpickles what a CIFAR batch holds (dicts, lists, bytes, numbers, numpy arrays) and nothing else: a pickle
    that names any other callable (``os.system``, ``builtins.eval``, a class of some package) is refused before
    anything runs, so a data file cannot run code."""

    ALLOWED = frozenset({
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
        *(("builtins", n) for n in ("bytes", "bytearray", "list", "dict", "tuple", "set", "frozenset", "int",
                                    "float", "str", "bool", "complex")),
        *(("__builtin__", n) for n in ("bytes", "bytearray", "list", "dict", "tuple", "set", "frozenset", "int",
                                       "float", "str", "bool", "complex")),
    })

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused {module}.{name} (a CIFAR batch holds only arrays, lists and dicts)")


def read_batch(path: Path) -> dict:
    """One CIFAR pickle (a batch or the meta file), read with :class:`BatchUnpickler`."""
    with open(path, "rb") as f:
        entry = BatchUnpickler(f, encoding="latin1").load()
    if not isinstance(entry, dict):
        raise ValueError(f"{path.name} holds a {type(entry).__name__}, not a dict")
    return entry


def load_cifar(root: Path, hundred: bool) -> tuple[np.ndarray, np.ndarray, list[str], int]:
    """(uint8 [N, 3, 32, 32], int64 labels, class names, N_train) of train then test, read as torchvision's CIFAR
    reader reads them (its file lists, without its md5 checks, so a partial or re-pickled copy and a test's tiny
    batches load) but through :class:`BatchUnpickler`: rows ``[:N_train]`` are the training batches, the rest the
    test batch."""
    from torchvision.datasets import CIFAR10, CIFAR100

    base, name, layout = (CIFAR100, "CIFAR-100", CIFAR100_LAYOUT) if hundred else (CIFAR10, "CIFAR-10", CIFAR10_LAYOUT)
    if root.name == base.base_folder:  # data.root points at the extracted folder itself
        root = root.parent
    folder = root / base.base_folder
    if not folder.is_dir():
        raise UserError(f"config key 'data.root': {root} has no {name} (expected {layout})")
    if not all((folder / f).is_file() for f, _ in base.train_list + base.test_list + [(base.meta["filename"], 0)]):
        raise UserError(f"config key 'data.root': {folder} is incomplete (expected {layout})")
    xs, ys = [], []
    current = ""
    try:
        for files in (base.train_list, base.test_list):
            data, targets = [], []
            for current, _ in files:
                entry = read_batch(folder / current)
                data.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                targets.extend(entry["labels"] if "labels" in entry else entry["fine_labels"])
            xs.append(np.concatenate(data))
            ys.append(np.asarray(targets, dtype=np.int64))
        current = base.meta["filename"]
        classes = [str(c) for c in read_batch(folder / current)[base.meta["key"]]]
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, OSError, AttributeError,
            IndexError) as exc:
        raise UserError(f"config key 'data.root': {folder / current} is a malformed {name} file "
                        f"({type(exc).__name__}: {str(exc)[:100]}; expected {layout})") from None
    x, y, n_train = np.concatenate(xs), np.concatenate(ys), len(ys[0])
    num_classes = 100 if hundred else 10
    if len(classes) != num_classes or len(y) == 0 or y.min() < 0 or y.max() >= num_classes:
        raise UserError(f"config key 'data.root': {folder} is not {name} ({len(classes)} class names, labels "
                        f"{y.min() if len(y) else '-'}..{y.max() if len(y) else '-'}; expected {layout})")
    return x, y, classes, n_train


def _cifar(cfg, hundred: bool) -> FederatedData:
    root = local_root(cfg, "cifar100" if hundred else "cifar10", CIFAR100_LAYOUT if hundred else CIFAR10_LAYOUT)
    x, y, classes, n_train = load_cifar(root, hundred)
    name = "cifar100" if hundred else "cifar10"
    if cfg.data.test_split == "official":
        keep, n_kept = official_keep(cfg, n_train, len(y) - n_train)
        mean, std = channel_stats(x[keep[:n_kept]])  # the training split's statistics
        data = federate_official(cfg, Domain(name, x[keep], y[keep], mean=mean, std=std), n_kept, len(classes))
    else:
        keep = subset_indices(len(y), cfg.data.samples_per_domain, np.random.default_rng([cfg.seed, 5]))
        data = federate([_domain(name, x[keep], y[keep])], cfg, num_classes=len(classes))
    data.meta["classes"] = classes
    return data


@register_dataset("cifar10")
def cifar10(cfg) -> FederatedData:
    """CIFAR-10 (60,000 32x32 colour images, 10 classes) from data.root."""
    return _cifar(cfg, hundred=False)


@register_dataset("cifar100")
def cifar100(cfg) -> FederatedData:
    """CIFAR-100 (60,000 32x32 colour images, 100 fine classes) from data.root."""
    return _cifar(cfg, hundred=True)


# ---------------------------------------------------------------------------------------------------- Tiny-ImageNet
def tinyimagenet_files(root: Path) -> tuple[list[Path], np.ndarray, list[str], int]:
    """(image paths, labels, wnids, N_train) of train then val from the standard folder layout, checked before any
    decoding: the first N_train paths are train/'s."""
    base = root if (root / "train").is_dir() else root / "tiny-imagenet-200"
    train, val = base / "train", base / "val"
    annotations = val / "val_annotations.txt"
    if not train.is_dir() or not (val / "images").is_dir() or not annotations.is_file():
        raise UserError(f"config key 'data.root': {root} is not Tiny-ImageNet (expected {TINY_LAYOUT})")
    if (base / "wnids.txt").is_file():
        wnids = [w.strip() for w in (base / "wnids.txt").read_text().split() if w.strip()]
    else:
        wnids = sorted(p.name for p in train.iterdir() if p.is_dir())
    if not wnids:
        raise UserError(f"config key 'data.root': {train} holds no class folders (expected {TINY_LAYOUT})")
    index = {w: i for i, w in enumerate(wnids)}
    files: list[Path] = []
    labels: list[int] = []
    for wnid in wnids:
        images = sorted((train / wnid / "images").glob("*.JPEG"))
        if not images:
            raise UserError(f"config key 'data.root': no {train / wnid / 'images'}/*.JPEG (expected {TINY_LAYOUT})")
        files += images
        labels += [index[wnid]] * len(images)
    n_train = len(files)
    for lineno, line in enumerate(annotations.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2 or parts[1] not in index:
            raise UserError(f"{annotations}:{lineno}: expected '<file>\\t<wnid>\\t...' with a wnid of train/, "
                            f"got {line[:60]!r}")
        path = val / "images" / parts[0]
        if not path.is_file():
            raise UserError(f"{annotations}:{lineno}: {path} does not exist")
        files.append(path)
        labels.append(index[parts[1]])
    return files, np.asarray(labels, dtype=np.int64), wnids, n_train


def _decode(path: Path, size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            rgb = im.convert("RGB")  # a few Tiny-ImageNet images are greyscale
    except OSError as exc:
        raise UserError(f"unreadable image {path} ({exc})") from None
    if rgb.size != (size, size):
        raise UserError(f"{path} is {rgb.size[0]}x{rgb.size[1]}, Tiny-ImageNet images are {size}x{size}")
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def load_tinyimagenet(files: list[Path], size: int = 64) -> np.ndarray:
    """Decode the JPEGs into uint8 [N, 3, size, size]; threads, since Pillow releases the GIL while decoding."""
    out = np.empty((len(files), 3, size, size), dtype=np.uint8)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for i, pixels in enumerate(pool.map(lambda p: _decode(p, size), files, chunksize=64)):
            out[i] = pixels
    return out


@register_dataset("tinyimagenet")
def tinyimagenet(cfg) -> FederatedData:
    """Tiny-ImageNet (200 classes, 64x64; train/ for the clients and val/ as the official test split, or both
    pooled with data.test_split=pooled) from data.root; decoded once, then cached."""
    root = local_root(cfg, "tinyimagenet", TINY_LAYOUT)
    files, labels, wnids, n_train = tinyimagenet_files(root)
    official = cfg.data.test_split == "official"
    if official:
        keep, n_kept = official_keep(cfg, n_train, len(labels) - n_train)
    else:
        keep = subset_indices(len(labels), cfg.data.samples_per_domain, np.random.default_rng([cfg.seed, 5]))
        n_kept = None
    chosen = [files[i] for i in keep]
    stamp = [str(root.resolve()), len(files), int(max(p.stat().st_mtime for p in (chosen[0], chosen[-1])))]
    key = {"source": stamp, "keep": int(len(keep)), "cap": cfg.data.samples_per_domain,
           "seed": cfg.seed if cfg.data.samples_per_domain else None}
    if official:
        key["official_train"] = n_kept

    def build() -> dict[str, np.ndarray]:
        x = load_tinyimagenet(chosen)
        mean, std = channel_stats(x[:n_kept] if official else x)
        return {"x": x, "y": labels[keep], "mean": mean, "std": std}

    arrays = cached_arrays(cfg, "tinyimagenet", key, build)
    domain = Domain("tinyimagenet", arrays["x"], arrays["y"], mean=arrays["mean"], std=arrays["std"])
    if official:
        data = federate_official(cfg, domain, n_kept, len(wnids))
    else:
        data = federate([domain], cfg, num_classes=len(wnids))
    data.meta["classes"] = wnids
    return data
