"""Image sets read from local files under ``data.root``: CIFAR-10/100 (python pickle batches) and Tiny-ImageNet.

Nothing is downloaded. Train and test parts are pooled into one domain, because every client draws its own
train/test split from its share (``data.test_fraction``). Pixels stay uint8 [N, 3, H, W]; per-channel mean/std
normalise them on the fly.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from raysim.data import federate
from raysim.data.base import Domain, FederatedData, channel_stats, local_root, subset_indices
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


# ---------------------------------------------------------------------------------------------------- CIFAR
def _local_cifar(base: type) -> type:
    """torchvision's CIFAR reader minus its md5 checks, so a partial or re-pickled copy (and a test's tiny
    batches) load; a real archive reads identically.
    """

    class Local(base):  # type: ignore[misc, valid-type]
        def _check_integrity(self) -> bool:
            folder = os.path.join(self.root, self.base_folder)
            return all(os.path.isfile(os.path.join(folder, f)) for f, _ in self.train_list + self.test_list)

        def _load_meta(self) -> None:
            with open(os.path.join(self.root, self.base_folder, self.meta["filename"]), "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    Local.__name__ = f"Local{base.__name__}"
    return Local


def load_cifar(root: Path, hundred: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(uint8 [N, 3, 32, 32], int64 labels, class names) of train + test, via torchvision with download=False."""
    from torchvision.datasets import CIFAR10, CIFAR100

    base, name, layout = (CIFAR100, "CIFAR-100", CIFAR100_LAYOUT) if hundred else (CIFAR10, "CIFAR-10", CIFAR10_LAYOUT)
    if root.name == base.base_folder:  # data.root points at the extracted folder itself
        root = root.parent
    folder = root / base.base_folder
    if not folder.is_dir():
        raise UserError(f"config key 'data.root': {root} has no {name} (expected {layout})")
    reader = _local_cifar(base)
    xs, ys = [], []
    try:
        for train in (True, False):
            ds = reader(str(root), train=train, download=False)
            xs.append(np.asarray(ds.data, dtype=np.uint8).transpose(0, 3, 1, 2))
            ys.append(np.asarray(ds.targets, dtype=np.int64))
        classes = list(ds.classes)
    except RuntimeError:
        raise UserError(f"config key 'data.root': {folder} is incomplete (expected {layout})") from None
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, OSError) as exc:
        raise UserError(f"config key 'data.root': {folder} holds a malformed {name} file "
                        f"({type(exc).__name__}: {str(exc)[:80]}; expected {layout})") from None
    x, y = np.concatenate(xs), np.concatenate(ys)
    num_classes = 100 if hundred else 10
    if len(classes) != num_classes or len(y) == 0 or y.min() < 0 or y.max() >= num_classes:
        raise UserError(f"config key 'data.root': {folder} is not {name} ({len(classes)} class names, labels "
                        f"{y.min() if len(y) else '-'}..{y.max() if len(y) else '-'}; expected {layout})")
    return x, y, classes


def _cifar(cfg, hundred: bool) -> FederatedData:
    root = local_root(cfg, "cifar100" if hundred else "cifar10", CIFAR100_LAYOUT if hundred else CIFAR10_LAYOUT)
    x, y, classes = load_cifar(root, hundred)
    keep = subset_indices(len(y), cfg.data.samples_per_domain, np.random.default_rng([cfg.seed, 5]))
    data = federate([_domain("cifar100" if hundred else "cifar10", x[keep], y[keep])], cfg,
                    num_classes=len(classes))
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
def tinyimagenet_files(root: Path) -> tuple[list[Path], np.ndarray, list[str]]:
    """(image paths, labels, wnids) of train + val from the standard folder layout, checked before any decoding."""
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
    return files, np.asarray(labels, dtype=np.int64), wnids


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
    """Tiny-ImageNet (200 classes, 64x64; train + val pooled) from data.root; decoded once, then cached."""
    root = local_root(cfg, "tinyimagenet", TINY_LAYOUT)
    files, labels, wnids = tinyimagenet_files(root)
    keep = subset_indices(len(labels), cfg.data.samples_per_domain, np.random.default_rng([cfg.seed, 5]))
    chosen = [files[i] for i in keep]
    stamp = [str(root.resolve()), len(files), int(max(p.stat().st_mtime for p in (chosen[0], chosen[-1])))]
    key = {"source": stamp, "keep": int(len(keep)), "cap": cfg.data.samples_per_domain,
           "seed": cfg.seed if cfg.data.samples_per_domain else None}

    def build() -> dict[str, np.ndarray]:
        x = load_tinyimagenet(chosen)
        mean, std = channel_stats(x)
        return {"x": x, "y": labels[keep], "mean": mean, "std": std}

    arrays = cached_arrays(cfg, "tinyimagenet", key, build)
    domain = Domain("tinyimagenet", arrays["x"], arrays["y"], mean=arrays["mean"], std=arrays["std"])
    data = federate([domain], cfg, num_classes=len(wnids))
    data.meta["classes"] = wnids
    return data
