"""Every method of a comparison trains on the same client data.

For each comparison directory, ``experiments/unideal/<setting>/`` and ``experiments/fapd/<dataset>-*`` (the
``-cpu`` stand-ins apart), every config's federation is built as a run builds it: the dataset, then the algorithm's
``prepare_data`` (where FAPD takes its calibration split and FedPCL its stand-in's pre-training data). The per-client
training index sets must then be identical across the comparison's methods. Sizes are shrunk alike for every file
of a comparison (a cap on samples per domain, tiny CIFAR/Tiny-ImageNet files in their real layouts); the teacher and
the stand-in backbone are not trained (only the data they are given matters here). No Ray.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.registry import get_algorithm

UNIDEAL = sorted(p for p in (ROOT / "experiments" / "unideal").iterdir() if p.is_dir())
FAPD = ROOT / "experiments" / "fapd"


def _fapd_groups() -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = {}
    for path in sorted(FAPD.glob("*.yaml")):
        dataset = path.stem.split("-")[0]
        key = dataset + ("-cpu" if path.stem.endswith("-cpu") else "")
        groups.setdefault(key, []).append(path)
    return groups


FAPD_GROUPS = _fapd_groups()


def _write_cifar(root: Path, classes: int) -> None:
    rng = np.random.default_rng(0)

    def dump(path: Path, obj: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(obj))

    if classes == 10:
        folder = root / "cifar-10-batches-py"
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            dump(folder / name, {"data": rng.integers(0, 256, (60, 3072), dtype=np.uint8),
                                 "labels": [int(v) for v in rng.integers(0, 10, 60)]})
        dump(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    else:
        folder = root / "cifar-100-python"
        for name, n in (("train", 400), ("test", 50)):
            dump(folder / name, {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                                 "fine_labels": [int(v) for v in rng.integers(0, 100, n)],
                                 "coarse_labels": [0] * n})
        dump(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)],
                               "coarse_label_names": ["c"]})


def _write_tiny(root: Path, classes: int = 10, per_class: int = 30) -> None:
    from PIL import Image

    base = root / "tiny-imagenet-200"
    rng = np.random.default_rng(0)
    wnids = [f"n{i:08d}" for i in range(classes)]
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    lines = []
    for c, wnid in enumerate(wnids):
        folder = base / "train" / wnid / "images"
        folder.mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(folder / f"{wnid}_{i}.JPEG")
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(base / "val" / "images" /
                                                                                f"val_{c}.JPEG")
        lines.append(f"val_{c}.JPEG\t{wnid}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("equal-data")
    _write_cifar(root, 10)
    _write_cifar(root, 100)
    _write_tiny(root)
    return root


@pytest.fixture
def untrained(monkeypatch):
    """FAPD's offline teacher and FedPCL's stand-in backbone, not trained: features of the right width, no weights."""
    from raysim.algorithms import fapd, fedpcl

    def teacher_features(cfg, data, calibration):
        rng = np.random.default_rng(0)
        return rng.normal(size=(len(data.domains[0].y), cfg.model.feature_dim)).astype(np.float32), float("nan")

    monkeypatch.setattr(fapd, "offline_teacher_features", teacher_features)
    monkeypatch.setattr(fedpcl, "stand_in_backbone", lambda *args, **kwargs: {})


def training_sets(path: Path, root: Path) -> list[tuple[int, tuple[int, ...]]]:
    """Each client's (domain, training indices) after the dataset and the algorithm's ``prepare_data``."""
    cfg = load_config(path)
    overrides = [f"data.cache_dir={root / 'cache'}", "data.min_samples=2"]
    if cfg.data.name in ("cifar10", "cifar100", "tinyimagenet"):
        overrides += [f"data.root={root}", "data.samples_per_domain=200"]
    elif cfg.data.name == "digits":
        overrides.append("data.samples_per_domain=200")
    cfg = load_config(path, overrides)
    data = get_algorithm(cfg.algorithm.name)(cfg).prepare_data(build_federated_data(cfg))
    return [(split.domain, tuple(int(i) for i in split.train)) for split in data.clients]


def _assert_equal(paths: list[Path], root: Path) -> None:
    assert len(paths) >= 2, paths
    reference = training_sets(paths[0], root)
    assert reference and all(len(train) for _, train in reference)
    for path in paths[1:]:
        got = training_sets(path, root)
        assert len(got) == len(reference), path.name
        for cid, (want, have) in enumerate(zip(reference, got)):
            assert have == want, (f"{path.name}: client {cid} trains on other samples than "
                                  f"{paths[0].name}'s ({len(have[1])} samples against {len(want[1])})")


@pytest.mark.parametrize("setting", UNIDEAL, ids=[p.name for p in UNIDEAL])
def test_unideal_methods_train_on_the_same_client_data(setting, data_root, untrained):
    methods = sorted(p for p in setting.glob("*.yaml") if p.name != "base.yaml")
    assert any(p.stem == "fedpcl" for p in methods)  # the method whose stand-in once took 10% of the clients' data
    _assert_equal(methods, data_root)


@pytest.mark.parametrize("group", sorted(FAPD_GROUPS), ids=sorted(FAPD_GROUPS))
def test_fapd_methods_train_on_the_same_client_data(group, data_root, untrained):
    paths = FAPD_GROUPS[group]
    assert any("fapd" in p.stem.split("-", 1)[1] for p in paths)  # FAPD takes its calibration split in prepare_data
    _assert_equal(paths, data_root)


def test_every_comparison_directory_is_covered():
    assert len(UNIDEAL) == 12 and all((p / "base.yaml").is_file() for p in UNIDEAL)
    assert set(FAPD_GROUPS) == {"cifar10", "cifar100", "digits", "tinyimagenet", "tinyimagenet-cpu"}
    covered = {p for paths in FAPD_GROUPS.values() for p in paths}
    assert covered == set(FAPD.glob("*.yaml"))


def test_a_method_that_carves_its_own_split_is_caught(data_root, untrained, tmp_path):
    # FAPD with its own calibration split (no server holdout) trains on fewer samples than FedAvg: the check fails
    fedavg, fapd = FAPD / "digits-fedavg.yaml", FAPD / "digits-fapd.yaml"
    own = tmp_path / "digits-fapd-own.yaml"
    own.write_text(f"extends: {fapd}\ndata:\n  server_holdout: 0.0\nalgorithm:\n  teacher:\n"
                   f"    calibration_fraction: 0.2\n")
    nothing_held = tmp_path / "digits-fedavg-all.yaml"
    nothing_held.write_text(f"extends: {fedavg}\ndata:\n  server_holdout: 0.0\n")
    with pytest.raises(AssertionError, match="trains on other samples"):
        _assert_equal([nothing_held, own], data_root)
