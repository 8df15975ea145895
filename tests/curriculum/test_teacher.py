"""The FAPD offline teacher: cached beside the data cache ($RAYSIM_CACHE honoured), trained with the workers'
batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.fapd import carve_calibration
from raysim.config import load_config
from raysim.curriculum.teacher import cache_root, offline_teacher_features, teacher_model_config
from raysim.data import build_federated_data
from raysim.algorithms.training import fit_classifier


def test_cache_root_follows_the_data_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "rc"))
    assert cache_root(load_config(None, ["algorithm.name=fapd"])) == tmp_path / "rc" / "fapd-teacher"
    cfg = load_config(None, ["algorithm.name=fapd", f"data.cache_dir={tmp_path / 'dc'}"])
    assert cache_root(cfg) == tmp_path / "dc" / "fapd-teacher"
    cfg = load_config(None, ["algorithm.name=fapd", f"algorithm.teacher.cache_dir={tmp_path / 'own'}"])
    assert cache_root(cfg) == tmp_path / "own"


def test_teacher_features_are_cached_under_raysim_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "rc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cfg = load_config(None, ["algorithm.name=fapd", "data.name=sklearn_digits", "clients.num=4",
                             "model.feature_dim=16", "model.hidden=[32]", "algorithm.teacher.epochs=10"])
    data = build_federated_data(cfg)
    calibration = carve_calibration(data, cfg.algorithm.teacher.calibration_fraction, cfg.seed)
    first, accuracy = offline_teacher_features(cfg, data, calibration)
    err = capsys.readouterr().err
    assert "offline teacher" in err and f"{accuracy:.4f}" in err  # trained; the accuracy it printed is returned
    assert accuracy > 0.6  # on the samples outside its split; chance is 0.1, seeds 0-4 give 0.75 to 0.85
    files = list((tmp_path / "rc" / "fapd-teacher").glob("*.pt"))
    # nothing under the default cache (XDG's raysim/; matplotlib may keep its font list beside it)
    assert len(files) == 1 and not (tmp_path / "xdg" / "raysim").exists()
    assert first.shape == (len(data.domains[0].y), 16) and first.dtype == np.float32
    again, accuracy_again = offline_teacher_features(cfg, data, calibration)
    assert capsys.readouterr().err == ""  # read back, not trained again
    assert np.array_equal(first, again) and accuracy_again == accuracy


def test_a_larger_teacher_keeps_the_feature_width_and_has_its_own_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "rc"))
    base = ["algorithm.name=fapd", "data.name=sklearn_digits", "clients.num=4", "model.feature_dim=16",
            "model.hidden=[32]", "algorithm.teacher.epochs=1"]
    small = load_config(None, base)
    large = load_config(None, base + ["algorithm.teacher.hidden=[256,128]"])
    assert teacher_model_config(small) == small.model
    assert teacher_model_config(large).hidden == [256, 128] and teacher_model_config(large).feature_dim == 16
    data = build_federated_data(small)
    calibration = carve_calibration(data, small.algorithm.teacher.calibration_fraction, small.seed)
    f_small, _ = offline_teacher_features(small, data, calibration)
    f_large, _ = offline_teacher_features(large, data, calibration)
    assert f_large.shape == f_small.shape and not np.allclose(f_large, f_small)
    assert len(list((tmp_path / "rc" / "fapd-teacher").glob("*.pt"))) == 2


class _Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(len(x))
        return self.fc(x)


def test_central_training_merges_a_trailing_single_sample_like_the_workers():
    model = _Recorder()
    x, y = torch.randn(9, 3), torch.randint(0, 2, (9,))
    fit_classifier(model, x, y, epochs=2, lr=0.1, batch_size=4, generator=torch.Generator().manual_seed(0))
    assert model.batches == [4, 5, 4, 5]  # 9 = 4 + 4 + 1: the lone sample joins the batch before, none is skipped


def test_the_device_is_not_part_of_the_cache_identity(tmp_path, monkeypatch, capsys):
    """Features trained on the CPU are the teacher's on a GPU worker too: the same entry is read, nothing retrained
    (a miss would hand the training to the run's reserved job, here one that says it would train on CUDA)."""
    from raysim.algorithms.central import reserved_jobs

    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "rc"))
    cfg = load_config(None, ["algorithm.name=fapd", "data.name=sklearn_digits", "clients.num=4",
                             "model.feature_dim=16", "model.hidden=[32]", "algorithm.teacher.epochs=1"])
    data = build_federated_data(cfg)
    calibration = carve_calibration(data, cfg.algorithm.teacher.calibration_fraction, cfg.seed)
    on_cpu, _ = offline_teacher_features(cfg, data, calibration)
    assert "offline teacher (mlp, " in capsys.readouterr().err
    on_gpu_worker: list = []
    with reserved_jobs(lambda train: on_gpu_worker.append(train) or pytest.fail("retrained on a cache hit")):
        again, _ = offline_teacher_features(cfg, data, calibration)
    assert not on_gpu_worker and capsys.readouterr().err == "" and np.array_equal(on_cpu, again)
