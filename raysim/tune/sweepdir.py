"""The sweep directory on disk: checked and prepared before a sweep starts, and whether Ray Tune's state in it can be
restored (``--resume``) without raysim unpickling anything it did not record."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Optional

from raysim.tune.results import write_atomically
from raysim.tune.spec import SweepError, SweepSpec, spec_to_yaml


def _check_sweep_dir(spec: SweepSpec, sweep_dir: Path, resume: bool) -> bool:
    """Check (and prepare) the sweep directory; returns whether Tune's state is to be restored."""
    tune_dir = sweep_dir / "tune"
    if resume and not _tune_state_restorable(tune_dir):
        if not (sweep_dir / "sweep.yaml").is_file():
            raise SweepError(f"{sweep_dir} holds no sweep to resume (no Tune state in {tune_dir})")
        # killed before Tune saved any state: no trial is on record, so the sweep starts again from sweep.yaml.
        # Seeds keep their run directories (seed-<n> names the same run again: a done one is not rerun); sweep
        # trials get new ids, so their directories from the lost attempt go.
        shutil.rmtree(tune_dir, ignore_errors=True)
        if not spec.names.keeps_run_dirs:
            shutil.rmtree(spec.trials_dir(sweep_dir), ignore_errors=True)
        resume = False
    elif not resume and tune_dir.exists():
        raise SweepError(f"{sweep_dir} already holds a sweep; continue it with --resume {sweep_dir} "
                         f"or choose another directory")
    try:
        spec.trials_dir(sweep_dir).mkdir(parents=True, exist_ok=True)
        write_atomically(sweep_dir / "sweep.yaml", spec_to_yaml(dataclasses.replace(spec, dir=str(sweep_dir))))
    except OSError as exc:
        raise SweepError(f"cannot write sweep directory {sweep_dir} ({exc.strerror})") from None
    return resume


TUNER_DIGEST = "tuner.pkl.sha256"  # in the sweep directory: the sha256 of the tuner.pkl Tune wrote for raysim


def _tuner_digest(tune_dir: Path) -> Optional[str]:
    import hashlib

    try:
        with open(tune_dir / "tuner.pkl", "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


def _record_tuner_digest(tune_dir: Path) -> None:
    """Record the sha256 of the ``tuner.pkl`` that Tune has just written (it writes it, synchronously, when a Tuner
    is made or restored): ``--resume`` unpickles only that file."""
    from raysim.tune.results import write_atomically

    digest = _tuner_digest(tune_dir)
    if digest is not None:
        write_atomically(tune_dir.parent / TUNER_DIGEST, digest + "\n")


def _tune_state_restorable(tune_dir: Path) -> bool:
    """Whether ``Tuner.restore`` can read ``tune_dir``. Tune writes its state files in place, so a kill can tear
    one: a torn newest experiment state is removed (the one before it, and the trials' run directories, which hold
    the truth about each trial, are enough to go on). ``tuner.pkl`` is a pickle that ``Tuner.restore`` unpickles
    (code could run from it), so it is never unpickled here and is restored only when it is the file Tune wrote for
    raysim (its sha256, recorded then, matches): one that does not match is refused; without a record (killed while
    the Tuner was made, or a sweep older than the record) nothing is known to have run, and the sweep starts again."""
    recorded_file = tune_dir.parent / TUNER_DIGEST
    digest = _tuner_digest(tune_dir)
    if digest is None or not recorded_file.is_file():
        return False
    if recorded_file.read_text().strip() != digest:
        raise SweepError(f"{tune_dir / 'tuner.pkl'} does not match the sha256 raysim recorded when Ray Tune wrote it "
                         f"({recorded_file}): it changed since, and is not read (a pickle can run code); restore it, "
                         f"or remove {tune_dir} to start the sweep again (finished seeds keep their runs)")
    for state in sorted(tune_dir.glob("experiment_state-*.json"), reverse=True):
        try:
            json.loads(state.read_text())
            return True
        except (OSError, ValueError):
            state.unlink(missing_ok=True)
    return False
