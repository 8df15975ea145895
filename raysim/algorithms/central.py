"""Central training, cached on disk: one trainer for FAPD's offline teacher and FedPCL's stand-in backbones (part of
the algorithms' public surface, which the engine sets up: :func:`reserved_jobs`).

Both train a classifier (a backbone and a linear head) on samples no client holds, with the workers' batch policy
(:func:`raysim.algorithms.training.fit_classifier`), and keep what they derive from it (the teacher's features, the
stand-in's weights) in a cache beside the data cache, so sweeps and resumed runs train once. What is shared lives
here, once, without Ray:

* :func:`recipe_key`: the cache identity, a hash of a recipe dict (whatever the result depends on, plus torch's
  version) and the arrays trained on. The device is not part of it: a result is the result, wherever it trained.
* :func:`train_classifier`: seeded construction and training, on a device the caller gives.
* :func:`require_finite`: a diverged training is a one-line error naming the config key to change.
* :func:`cached`: the entry in the cache, or the trained one, stored. An entry is a dict of tensors, written
  atomically (a reader or a kill sees the old entry or the new one, never half of one) and read without running
  pickled code (:func:`read_entry`, :func:`write_entry`).
* :func:`run_reserved`: where the training runs. The driver never picks a device: while it prepares a run's data
  (``Algorithm.prepare_data``) the engine hands training to its executor (:func:`reserved_jobs`), which runs it as a
  job with reserved resources, like ``server_train``: on a Ray worker, with that worker's CPU/GPU share and device,
  or in-process on the inline executor's device. Outside a run it trains here, on the CPU. The cache lives where
  the driver is; only the training travels.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar, Union

import numpy as np
import torch
from torch import nn

from raysim.errors import UserError
from raysim.seeds import derive_seed
from raysim.trees import detached_cpu

Entry = dict[str, torch.Tensor]
T = TypeVar("T")
Training = Callable[[torch.device], Any]  # central training, given the device of the job that runs it

# the executor's ``central`` while the engine prepares a run's data (None: train in the calling process, on the CPU)
_RESERVED: ContextVar[Optional[Callable[[Training], Any]]] = ContextVar("raysim_central_runner", default=None)


def run_here(train: Callable[[torch.device], T], device: Union[torch.device, str]) -> T:
    """``train(device)`` in this process, its result (tensors, in nested containers) on the CPU."""
    return detached_cpu(train(torch.device(device)))


@contextlib.contextmanager
def reserved_jobs(runner: Callable[[Training], Any]) -> Iterator[None]:
    """While the block runs (the engine preparing a run's data), :func:`run_reserved` hands training to
    ``runner`` (the executor's ``central``: a job on a worker's reserved CPU/GPU share)."""
    token = _RESERVED.set(runner)
    try:
        yield
    finally:
        _RESERVED.reset(token)


def run_reserved(train: Callable[[torch.device], T]) -> T:
    """``train(device)`` as a job with reserved resources, its result on the CPU: on a worker of the run being
    prepared (:func:`reserved_jobs`), else in this process on the CPU (a test, a notebook). ``train`` must be a pure
    function of what it closes over: a job on a dead worker runs again elsewhere."""
    runner = _RESERVED.get()
    if runner is None:
        return run_here(train, "cpu")
    return runner(train)


def recipe_key(recipe: dict[str, Any], arrays: Iterable[Union[np.ndarray, torch.Tensor, None]] = ()) -> str:
    """A hex digest of ``recipe`` (JSON, keys sorted, with torch's version added) and of each array's dtype, shape
    and bytes, in order (``None`` entries are skipped). Put a version number in the recipe, and bump it whenever the
    training changes without the recipe saying so."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({**recipe, "torch": torch.__version__}, sort_keys=True, default=str).encode())
    for arr in arrays:
        if arr is None:
            continue
        a = np.ascontiguousarray(arr.detach().cpu().numpy() if isinstance(arr, torch.Tensor) else arr)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def derived_seed(*parts: int) -> int:
    """A 32-bit seed for one central training, drawn from ``parts`` (the run's seed and a stream of its own)."""
    return derive_seed(*parts)


def train_classifier(build_backbone: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, *,
                     feature_dim: int, num_classes: int, epochs: int, lr: float, batch_size: int, seed: int,
                     device: Union[torch.device, str]) -> nn.Module:
    """A ``ClassifierModel`` (backbone + linear head) trained on (x, y) on ``device``: the backbone and the head are
    built right after ``torch.manual_seed(seed)`` and the batches drawn from a generator seeded with ``seed``, so
    the result depends only on the inputs (CE, SGD with momentum 0.9,
    :func:`~raysim.algorithms.training.fit_classifier`).
    Runs on the caller's torch threads (wrap it in :func:`~raysim.algorithms.training.torch_threads`)."""
    from raysim.algorithms.training import fit_classifier
    from raysim.models import ClassifierModel
    from raysim.models.pooling import deterministic_pooling

    torch.manual_seed(seed)
    model = deterministic_pooling(ClassifierModel(build_backbone(), feature_dim, num_classes)).to(device)
    fit_classifier(model, x.to(device), y.to(device), epochs=epochs, lr=lr, batch_size=batch_size,
                   generator=torch.Generator().manual_seed(seed))
    return model


def require_finite(values: Iterable[torch.Tensor], *, key: str, what: str) -> None:
    """Raise a one-line UserError naming ``key`` (the learning rate to lower) when a floating tensor of ``values``
    holds a NaN or an infinity: ``what`` says what diverged ("the offline teacher diverged (NaN features)")."""
    for v in values:
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise UserError(f"config key '{key}': {what}; lower {key}")


def read_entry(path: Path) -> Optional[Entry]:
    """The cache entry at ``path``, or None when there is none or it cannot be read (damaged, foreign, an older
    format): the caller trains again and overwrites it. Read with ``weights_only`` (no pickled code runs)."""
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any unreadable file is a cache miss
        return None
    if not isinstance(entry, dict) or not all(isinstance(v, torch.Tensor) for v in entry.values()):
        return None
    return entry


def write_entry(path: Path, entry: Entry, *, who: str, what: str, dir_key: str) -> None:
    """Store ``entry`` at ``path`` atomically; no fsync (an entry lost to a power cut is trained again). A cache
    that cannot be written costs only the next run's training: one warning line naming ``dir_key``, not an error.
    ``who`` and ``what`` name the warning's source and subject ("fapd", "teacher features")."""
    from raysim.fsutil import atomic_writer

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_writer(path, fsync=False) as fh:
            torch.save(entry, fh)
    except OSError as exc:
        print(f"raysim: {who}: warning: could not cache {what} in {path.parent} ({exc.strerror}); set {dir_key}",
              file=sys.stderr, flush=True)


def cached(path: Path, train: Callable[[torch.device], Entry], *,
           accept: Callable[[Entry], bool] = lambda entry: True, who: str, what: str, dir_key: str) -> Entry:
    """The entry at ``path`` when one can be read and ``accept`` takes it (a hit), else ``train(device)``'s, run as
    a reserved job (:func:`run_reserved`) and written to ``path`` (a miss; an unreadable or refused entry is
    overwritten). ``train`` checks its result before it returns it (:func:`require_finite`); ``who``, ``what`` and
    ``dir_key`` word the warning of :func:`write_entry`."""
    entry = read_entry(path)
    if entry is not None and accept(entry):
        return entry
    entry = run_reserved(train)
    write_entry(path, entry, who=who, what=what, dir_key=dir_key)
    return entry
