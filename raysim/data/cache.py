"""The on-disk cache of built datasets (and of what algorithms derive from them: FAPD's teacher, FedPCL's
stand-in backbones): where it lives and how an entry is stored."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from raysim.errors import UserError
from raysim.fsutil import atomic_writer

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

CACHE_VERSION = 1  # bump when a recipe changes, so stale caches are never read


def cache_dir(cfg: ExperimentConfig) -> Path:
    """``data.cache_dir``, else ``$RAYSIM_CACHE``, else ``$XDG_CACHE_HOME/raysim`` (``~/.cache/raysim``)."""
    if cfg.data.cache_dir:
        return Path(cfg.data.cache_dir).expanduser()
    if os.environ.get("RAYSIM_CACHE"):
        return Path(os.environ["RAYSIM_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "raysim"


def cached_arrays(cfg: ExperimentConfig, name: str, key: dict,
                  build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Load ``name`` from the cache when an entry for exactly ``key`` exists, else build and store it atomically.

    An unreadable default cache dir only costs a rebuild; an unwritable ``data.cache_dir`` is the user's to fix.
    """
    digest = hashlib.sha256(json.dumps({"v": CACHE_VERSION, **key}, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir(cfg)
    path = folder / f"{name}-v{CACHE_VERSION}-{digest}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
        except (OSError, ValueError, EOFError):
            pass  # a truncated or foreign file: rebuild and overwrite it
    arrays = build()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # concurrent builders (Tune trials) never see a half-written file; no fsync: a lost entry is rebuilt
        with atomic_writer(path, fsync=False) as fh:
            np.savez(fh, **arrays)
    except OSError as exc:
        if cfg.data.cache_dir:
            raise UserError(f"config key 'data.cache_dir': cannot write {folder} ({exc.strerror})") from None
    return arrays
