"""FAPD's offline teacher: trained centrally on the server's calibration split, its features of every sample cached.

Stands in for a pretrained teacher (``algorithm.teacher.features``) when there is none. Small and deterministic
from the seed (one model, a few epochs, on the driver), trained with the workers' batch policy
(:func:`raysim.engine.epochs.fit_classifier`); the features are cached on disk under a hash of the data, the split
and the recipe, beside the data cache (``algorithm.teacher.cache_dir``, else ``data.cache_dir``,
``$RAYSIM_CACHE``, ``~/.cache/raysim``), so sweeps and resumed runs reuse them.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.config import ExperimentConfig, ModelConfig
from raysim.data.base import ClientSplit, FederatedData
from raysim.errors import UserError

# 2: the teacher trains on a trailing one-sample batch (merged into the one before, as the workers do); v1 skipped it
CACHE_VERSION = 2


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


def cache_key(cfg: ExperimentConfig, data: FederatedData, calibration: np.ndarray, arch: str, device: str) -> str:
    """Everything the teacher's features depend on: the samples, the split, the recipe, and the software."""
    t = _teacher(cfg)
    h = hashlib.blake2b(digest_size=16)
    recipe = {"v": CACHE_VERSION, "arch": arch, "model": asdict(teacher_model_config(cfg)), "epochs": t.epochs,
              "lr": t.lr, "batch_size": t.batch_size, "seed": cfg.seed, "classes": data.num_classes,
              "device": device, "torch": torch.__version__}
    h.update(json.dumps(recipe, sort_keys=True, default=str).encode())
    domain = data.domains[0]
    for arr in (domain.x, domain.y, domain.mean, domain.std, calibration):
        if arr is not None:
            a = np.ascontiguousarray(arr)
            h.update(str((a.dtype, a.shape)).encode())
            h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def offline_teacher_features(cfg: ExperimentConfig, data: FederatedData,
                             calibration: np.ndarray) -> tuple[np.ndarray, float]:
    """Train a teacher centrally on the calibration split; return its features of every domain sample and its
    accuracy on the samples outside the split (both cached; NaN accuracy for a cache entry older than the record)."""
    from raysim.engine.epochs import fit_classifier, torch_threads
    from raysim.models import ClassifierModel
    from raysim.registry import get_model

    t = _teacher(cfg)
    arch = t.model or cfg.model.for_client(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = cache_root(cfg) / f"{cache_key(cfg, data, calibration, arch, device.type)}.npy"
    n = len(data.domains[0].y)
    if path.is_file():
        try:
            cached = np.load(path, allow_pickle=False)
            if cached.shape == (n, cfg.model.feature_dim) and np.isfinite(cached).all():
                return cached.astype(np.float32, copy=False), _stored_accuracy(path)
        except (OSError, ValueError):
            pass  # damaged: train again and overwrite
    start = time.perf_counter()
    view = FederatedData(domains=data.domains, num_classes=data.num_classes,
                         clients=[ClientSplit(domain=0, train=calibration, test=np.arange(n, dtype=np.int64))])
    x, y, _ = view.tensors(0, "train")
    with torch_threads(cfg.engine.cpus_per_worker):
        seed = int(np.random.SeedSequence([cfg.seed, 0x7EAC4E5]).generate_state(1)[0])
        torch.manual_seed(seed)
        backbone = get_model(arch)(input_shape=tuple(x.shape[1:]), cfg=teacher_model_config(cfg), client_id=0,
                                   seed=cfg.seed)
        model = ClassifierModel(backbone, cfg.model.feature_dim, data.num_classes).to(device)
        fit_classifier(model, x.to(device), y.to(device), epochs=t.epochs, lr=t.lr, batch_size=t.batch_size,
                       generator=torch.Generator().manual_seed(seed))
        model.eval()
        all_x, all_y, _ = view.tensors(0, "test")
        feats, hits = [], []
        with torch.no_grad():
            for b in range(0, n, 1024):
                f = model.features(all_x[b:b + 1024].to(device))
                hits.append((model.head(f).argmax(1).cpu() == all_y[b:b + 1024]).numpy())
                feats.append(f.float().cpu())
        out = torch.cat(feats).numpy().astype(np.float32)
        held_out: np.ndarray = np.ones(n, dtype=bool)
        held_out[calibration] = False
        accuracy = float(np.concatenate(hits)[held_out].mean()) if held_out.any() else float("nan")
    if not np.isfinite(out).all():
        raise UserError("config key 'algorithm.teacher.lr': the offline teacher diverged (NaN features); "
                        "lower algorithm.teacher.lr")
    print(f"raysim: fapd: offline teacher ({arch}, {len(calibration)} calibration samples, {t.epochs} epochs) "
          f"trained in {time.perf_counter() - start:.1f}s; accuracy on the other {int(held_out.sum())} samples "
          f"{accuracy:.4f}",
          file=sys.stderr, flush=True)
    _store(path, out, accuracy)
    return out, accuracy


def _stored_accuracy(path: Path) -> float:
    try:
        return float(json.loads(path.with_suffix(".json").read_text())["accuracy"])
    except (OSError, ValueError, KeyError, TypeError):
        return float("nan")


def _store(path: Path, features: np.ndarray, accuracy: float) -> None:
    """Cache the features, and the teacher's accuracy beside them; no fsync (a cache entry lost to a power cut is
    trained again). A cache that cannot be written costs only the next run's training: a warning, not an error."""
    from raysim.fsutil import atomic_write_text, atomic_writer

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path.with_suffix(".json"), json.dumps({"accuracy": accuracy}), fsync=False)
        with atomic_writer(path, fsync=False) as fh:
            np.save(fh, features)
    except OSError as exc:
        print(f"raysim: fapd: warning: could not cache teacher features in {path.parent} ({exc.strerror}); "
              f"set algorithm.teacher.cache_dir", file=sys.stderr, flush=True)
