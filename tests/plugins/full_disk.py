"""Test-only: a run directory whose disk "fills up" in a given round (listed in a config's ``plugins``).

A file ``FULL_DISK`` beside the run directory holds ``metrics ROUND`` or ``checkpoint ROUND``; in that round the
metrics writer leaves a torn line in metrics.jsonl and client_metrics.jsonl and raises ENOSPC, or torch.save of the
checkpoint fails as it does on a full disk.
A sweep's ``FULL_DISK`` (beside its ``tune/`` directory) holding ``tune`` fills the disk under Ray Tune's own state
files: Tune's copies of its experiment state and searcher state into ``SWEEP_DIR/tune`` fail as pyarrow's writes
fail on a full disk (the sweep's process imports the plugin when it reads the config).
Without the file the plugin changes nothing, so the same config resumes normally once the file is gone.
"""

import errno
import os
from pathlib import Path

import ray.train._internal.storage as tune_storage

import raysim.engine.state as state
import raysim.runlog as runlog


def _armed(run_dir: Path, what: str, rnd: int) -> bool:
    try:
        kind, at = (Path(run_dir).parent / "FULL_DISK").read_text().split()
    except (OSError, ValueError):
        return False
    return kind == what and int(at) == rnd


_write = runlog.RunLog.write
_atomic_save = state.atomic_save


def write(self, metrics, client_counts=None):
    if _armed(self.run_dir, "metrics", metrics["round"]):
        # part of a line reached the disk, in both files
        self._clients_fh.write('{"round": %d, "client": [0, 1' % metrics["round"])
        self._clients_fh.flush()
        self._fh.write('{"round": %d, "acc_mean": 0.5' % metrics["round"])
        self._fh.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _write(self, metrics, client_counts)


def atomic_save(obj, path):
    if isinstance(obj, dict) and "round" in obj and _armed(Path(path).parent.parent, "checkpoint", obj["round"]):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 2048 vs 1986")
    return _atomic_save(obj, path)


runlog.RunLog.write = write
state.atomic_save = atomic_save


_copy_files = tune_storage._pyarrow_fs_copy_files


def _tune_disk_full(destination: str) -> bool:
    for parent in Path(destination).parents:
        try:
            return (parent / "FULL_DISK").read_text().split() == ["tune"]
        except OSError:
            continue
    return False


def copy_files(source, destination, **kwargs):
    if _tune_disk_full(str(destination)):
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
    return _copy_files(source, destination, **kwargs)


tune_storage._pyarrow_fs_copy_files = copy_files
