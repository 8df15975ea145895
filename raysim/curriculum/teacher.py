"""FAPD's offline teacher: trained centrally on the server's calibration split, its features of every sample cached.

Stands in for a pretrained teacher (``algorithm.teacher.features``) when there is none. Small and deterministic
from the seed (one model, a few epochs, on the driver), trained by the central trainer
(:mod:`raysim.algorithms.central`, the workers' batch policy); the features are cached on disk under a hash of the
data, the split and the recipe, beside the data cache (``algorithm.teacher.cache_dir``, else ``data.cache_dir``,
``$RAYSIM_CACHE``, ``~/.cache/raysim``), so sweeps and resumed runs reuse them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.config import ExperimentConfig, ModelConfig
from raysim.data.base import ClientSplit, FederatedData
from raysim.algorithms.central import cached, derived_seed, recipe_key, require_finite, train_classifier

# 2: the teacher trains on a trailing one-sample batch (merged into the one before, as the workers do); v1 skipped it.
# 3: one cache entry (a .pt of features and accuracy) keyed by raysim.algorithms.central.recipe_key, without the device
CACHE_VERSION = 3


def class_means(feats: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-class mean features, the offline stand-in for text class embeddings (zeros for an absent class)."""
    out = np.zeros((num_classes, feats.shape[1]), dtype=np.float32)
    for c in range(num_classes):
        members = feats[labels == c]
        if len(members):
            out[c] = members.mean(axis=0)
    return out


def _teacher(cfg: ExperimentConfig) -> Any:
    """FAPD's ``algorithm.teacher`` section (``raysim.algorithms.fapd.TeacherConfig``)."""
    return cfg.algorithm.teacher  # type: ignore[attr-defined]  # the algorithm's own Config dataclass


def cache_root(cfg: ExperimentConfig) -> Path:
    """``algorithm.teacher.cache_dir``, else the data cache (``data.cache_dir``, ``$RAYSIM_CACHE``, ...)."""
    own = _teacher(cfg).cache_dir
    if own:
        return Path(own)
    from raysim.data.cache import cache_dir

    return cache_dir(cfg) / "fapd-teacher"


def teacher_model_config(cfg: ExperimentConfig) -> ModelConfig:
    """The students' model section with the teacher's own size (``algorithm.teacher.hidden`` / ``.width``) applied:
    a teacher larger than its students keeps their feature width D, which PCA and the distillation need."""
    t = _teacher(cfg)
    return replace(cfg.model, hidden=list(t.hidden) if t.hidden is not None else cfg.model.hidden,
                   width=t.width if t.width is not None else cfg.model.width)


def cache_key(cfg: ExperimentConfig, data: FederatedData, calibration: np.ndarray, arch: str) -> str:
    """Everything the teacher's features depend on: the samples, the split, the recipe, and the software (not the
    device: the features are the teacher's wherever it trained)."""
    t = _teacher(cfg)
    recipe = {
        "v": CACHE_VERSION,
        "arch": arch,
        "model": asdict(teacher_model_config(cfg)),
        "epochs": t.epochs,
        "lr": t.lr,
        "batch_size": t.batch_size,
        "seed": cfg.seed,
        "classes": data.num_classes,
    }
    domain = data.domains[0]
    return recipe_key(recipe, (domain.x, domain.y, domain.mean, domain.std, calibration))


def offline_teacher_features(cfg: ExperimentConfig, data: FederatedData,
                             calibration: np.ndarray) -> tuple[np.ndarray, float]:
    """Train a teacher centrally on the calibration split; return its features of every domain sample and its
    accuracy on the samples outside the split (both cached)."""
    from raysim.algorithms.training import torch_threads
    from raysim.registry import get_model

    t = _teacher(cfg)
    arch = t.model or cfg.model.for_client(0)
    path = cache_root(cfg) / f"{cache_key(cfg, data, calibration, arch)}.pt"
    n = len(data.domains[0].y)

    def usable(entry: dict[str, torch.Tensor]) -> bool:
        feats = entry.get("features")
        return (entry.keys() == {"features", "accuracy"} and feats is not None
                and tuple(feats.shape) == (n, cfg.model.feature_dim) and bool(torch.isfinite(feats).all()))

    def train(device: torch.device) -> dict[str, torch.Tensor]:  # a reserved job: on a worker, on its device
        start = time.perf_counter()
        view = FederatedData(domains=data.domains, num_classes=data.num_classes,
                             clients=[ClientSplit(domain=0, train=calibration, test=np.arange(n, dtype=np.int64))])
        x, y, _ = view.tensors(0, "train")
        with torch_threads(cfg.engine.cpus_per_worker):
            model = train_classifier(
                lambda: get_model(arch)(input_shape=tuple(x.shape[1:]), cfg=teacher_model_config(cfg), client_id=0,
                                        seed=cfg.seed),
                x, y, feature_dim=cfg.model.feature_dim, num_classes=data.num_classes, epochs=t.epochs, lr=t.lr,
                batch_size=t.batch_size, seed=derived_seed(cfg.seed, 0x7EAC4E5), device=device)
            model.eval()
            all_x, all_y, _ = view.tensors(0, "test")
            feats, hits = [], []
            with torch.no_grad():
                for b in range(0, n, 1024):
                    f = model.features(all_x[b:b + 1024].to(device))
                    hits.append((model.head(f).argmax(1).cpu() == all_y[b:b + 1024]).numpy())
                    feats.append(f.float().cpu())
            out = torch.cat(feats)
            held_out: np.ndarray = np.ones(n, dtype=bool)
            held_out[calibration] = False
            accuracy = float(np.concatenate(hits)[held_out].mean()) if held_out.any() else float("nan")
        require_finite([out], key="algorithm.teacher.lr", what="the offline teacher diverged (NaN features)")
        print(f"raysim: fapd: offline teacher ({arch}, {len(calibration)} calibration samples, {t.epochs} epochs) "
              f"trained on {device.type} in {time.perf_counter() - start:.1f}s; accuracy on the other "
              f"{int(held_out.sum())} samples "
              f"{accuracy:.4f}",
              file=sys.stderr, flush=True)
        return {"features": out, "accuracy": torch.tensor(accuracy, dtype=torch.float64)}

    entry = cached(path, train, accept=usable, who="fapd", what="teacher features",
                   dir_key="algorithm.teacher.cache_dir")
    return entry["features"].numpy(), float(entry["accuracy"])
