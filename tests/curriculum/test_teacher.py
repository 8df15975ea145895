"""The FAPD offline teacher: cached beside the data cache ($RAYSIM_CACHE honoured), trained with the workers'
batches."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from raysim.algorithms.fapd import carve_calibration
from raysim.config import load_config
from raysim.curriculum.teacher import cache_root, offline_teacher_features
from raysim.data import build_federated_data
from raysim.engine.epochs import fit_classifier


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
                             "model.feature_dim=16", "model.hidden=[32]", "algorithm.teacher.epochs=1"])
    data = build_federated_data(cfg)
    calibration = carve_calibration(data, cfg.algorithm.teacher.calibration_fraction, cfg.seed)
    first = offline_teacher_features(cfg, data, calibration)
    assert "offline teacher" in capsys.readouterr().err  # trained
    files = list((tmp_path / "rc" / "fapd-teacher").glob("*.npy"))
    assert len(files) == 1 and not (tmp_path / "xdg").exists()
    assert first.shape == (len(data.domains[0].y), 16) and first.dtype == np.float32
    again = offline_teacher_features(cfg, data, calibration)
    assert capsys.readouterr().err == ""  # read back, not trained again
    assert np.array_equal(first, again)


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
