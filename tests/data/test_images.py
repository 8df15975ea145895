"""CIFAR-10/100 and Tiny-ImageNet from tiny files in their real on-disk layouts; bad layouts are one-line errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.data import images as I
from raysim.errors import UserError


def _cfg(name: str, root: Path, **over: object):
    base = {"data.name": name, "data.root": str(root), "clients.num": 2, "data.partition": "iid",
            "data.min_samples": 2, "data.cache_dir": str(root / "_cache")}
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def _pickle(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def _write_cifar10(root: Path, per_batch: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The python version: data_batch_1..5 and test_batch hold {'data': uint8 [n, 3072] (R, G, B planes),
    'labels': [...]}; batches.meta holds 'label_names'."""
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        _pickle(folder / name, {"batch_label": name, "data": data, "labels": labels,
                                "filenames": [f"{name}_{i}.png" for i in range(per_batch)]})
        xs.append(data)
        ys += labels
    _pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)], "num_vis": 3072})
    return np.concatenate(xs).reshape(-1, 3, 32, 32), np.array(ys)


def test_cifar10_from_python_batches(tmp_path):
    x, y = _write_cifar10(tmp_path)
    data = build_federated_data(_cfg("cifar10", tmp_path))
    domain = data.domains[0]
    assert domain.x.shape == (18, 3, 32, 32) and domain.x.dtype == np.uint8
    assert np.array_equal(domain.x, x) and np.array_equal(domain.y, y)  # channel planes land in the right place
    assert data.num_classes == 10 and domain.mean.shape == (3,)
    assert data.meta["classes"][0] == "class0"
    # data.test_split=official (the default): clients deal out the five training batches only; test_batch (the
    # last 3 rows) is held by the evaluation, addressed as client id num_clients
    held = np.concatenate([np.concatenate([c.train, c.test]) for c in data.clients])
    assert np.array_equal(np.sort(held), np.arange(15))
    assert np.array_equal(data.server_test.test, np.arange(15, 18)) and len(data.server_test.train) == 0
    xs, ys, _ = data.tensors(data.server_client_id, "test")
    assert np.array_equal(ys.numpy(), y[15:]) and xs.shape == (3, 3, 32, 32)
    assert np.allclose(domain.mean, x[:15].reshape(15, 3, -1).transpose(1, 0, 2).reshape(3, -1).mean(1) / 255,
                       atol=1e-5)  # normalised by the training split's statistics
    xt, yt, _ = data.tensors(0)
    assert xt.shape[1:] == (3, 32, 32) and int(yt.max()) < 10
    pooled = build_federated_data(_cfg("cifar10", tmp_path, data__test_split="pooled"))
    held = np.concatenate([np.concatenate([c.train, c.test]) for c in pooled.clients])
    assert np.array_equal(np.sort(held), np.arange(18)) and pooled.server_test is None


def test_cifar10_root_may_be_the_extracted_folder_itself(tmp_path):
    _write_cifar10(tmp_path)
    data = build_federated_data(_cfg("cifar10", tmp_path / "cifar-10-batches-py"))
    assert len(data.domains[0].y) == 18


def test_cifar100_fine_labels(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-100-python"
    xs, fine = [], []
    for name, n in (("train", 8), ("test", 4)):
        x, labels = rng.integers(0, 256, (n, 3072), dtype=np.uint8), [int(v) for v in rng.integers(20, 100, n)]
        _pickle(folder / name, {"data": x, "fine_labels": labels,
                                "coarse_labels": [int(v) for v in rng.integers(0, 20, n)]})  # never a fine label
        xs.append(x)
        fine += labels
    _pickle(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)],
                              "coarse_label_names": [f"c{i}" for i in range(20)]})
    data = build_federated_data(_cfg("cifar100", tmp_path))
    assert data.num_classes == 100 and data.meta["classes"][:2] == ["f0", "f1"]
    assert np.array_equal(data.domains[0].y, fine)  # the fine labels, training split then test split
    assert np.array_equal(data.domains[0].x, np.concatenate(xs).reshape(-1, 3, 32, 32))


@pytest.mark.parametrize("name,folder", [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")])
def test_missing_cifar_names_the_expected_layout(tmp_path, name, folder):
    with pytest.raises(UserError) as info:
        build_federated_data(_cfg(name, tmp_path))
    message = str(info.value)
    assert "data.root" in message and folder in message and "\n" not in message


def test_incomplete_or_malformed_cifar_is_a_user_error(tmp_path):
    _write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(UserError, match="incomplete"):
        build_federated_data(_cfg("cifar10", tmp_path))
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"this is no pickle")
    with pytest.raises(UserError, match="malformed"):
        build_federated_data(_cfg("cifar10", tmp_path))


def _write_tiny(root: Path, wnids=("n01443537", "n01629819", "n01641577"), per_class: int = 4) -> Path:
    from PIL import Image

    base = root / "tiny-imagenet-200"
    rng = np.random.default_rng(0)
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for wnid in wnids:
        folder = base / "train" / wnid / "images"
        folder.mkdir(parents=True)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for i in range(per_class):
            mode = "L" if i == 0 else "RGB"  # Tiny-ImageNet has a few greyscale JPEGs
            shape = (64, 64) if mode == "L" else (64, 64, 3)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / f"{wnid}_{i}.JPEG")
    lines = []
    for i, wnid in enumerate(wnids * 2):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(base / "val" / "images" /
                                                                                f"val_{i}.JPEG")
        lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return base


def test_tinyimagenet_from_folder_layout(tmp_path):
    _write_tiny(tmp_path)
    data = build_federated_data(_cfg("tinyimagenet", tmp_path))
    domain = data.domains[0]
    assert domain.x.shape == (18, 3, 64, 64) and domain.x.dtype == np.uint8
    assert data.num_classes == 3 and np.array_equal(np.bincount(domain.y), [6, 6, 6])
    assert data.meta["classes"] == ["n01443537", "n01629819", "n01641577"]
    assert len(list((tmp_path / "_cache").glob("tinyimagenet-*.npz"))) == 1
    # official split: clients hold train/ (the first 12 rows), the evaluation val/ (the last 6)
    held = np.concatenate([np.concatenate([c.train, c.test]) for c in data.clients])
    assert np.array_equal(np.sort(held), np.arange(12)) and np.array_equal(data.server_test.test, np.arange(12, 18))
    again = build_federated_data(_cfg("tinyimagenet", tmp_path / "tiny-imagenet-200"))  # root = the folder itself
    assert np.array_equal(again.domains[0].x, domain.x)


def test_tinyimagenet_malformed_layouts(tmp_path):
    base = _write_tiny(tmp_path)
    annotations = base / "val" / "val_annotations.txt"
    good = annotations.read_text()
    annotations.write_text(good + "val_0.JPEG\tn99999999\t0\t0\t1\t1\n")
    with pytest.raises(UserError, match="val_annotations.txt:7"):
        build_federated_data(_cfg("tinyimagenet", tmp_path))
    annotations.unlink()
    with pytest.raises(UserError) as info:
        build_federated_data(_cfg("tinyimagenet", tmp_path))
    assert "data.root" in str(info.value) and "train/<wnid>/images" in str(info.value)
    with pytest.raises(UserError, match="data.root"):
        build_federated_data(_cfg("tinyimagenet", tmp_path / "nowhere"))


def test_tinyimagenet_wrong_image_size_names_the_file(tmp_path):
    from PIL import Image

    base = _write_tiny(tmp_path)
    bad = base / "train" / "n01443537" / "images" / "n01443537_1.JPEG"
    Image.new("RGB", (32, 32)).save(bad)
    with pytest.raises(UserError, match="n01443537_1.JPEG is 32x32"):
        I.load_tinyimagenet([bad])
