"""No code runs from a file raysim reads (issue 39): each test plants a real payload, a pickle that would create a
marker file when unpickled, in a file raysim reads (a CIFAR batch, a dataset cache entry; checkpoints: see
tests/engine/test_faults.py, sweep state: tests/tune), and asserts the marker is never written."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from raysim.config import load_config
from raysim.errors import UserError


class Payload:
    """Unpickling this runs code: ``exec`` writes ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _cfg(root: Path, **over: object):
    base = {"data.name": "cifar10", "data.root": str(root), "clients.num": 2, "data.partition": "iid",
            "data.min_samples": 2, "data.cache_dir": str(root / "_cache")}
    base.update({k.replace("__", "."): v for k, v in over.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def _write_cifar10(root: Path, protocol: int = pickle.DEFAULT_PROTOCOL, **extra: object) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"batch_label": name, "data": rng.integers(0, 256, size=(3, 3072), dtype=np.uint8),
                 "labels": [int(v) for v in rng.integers(0, 10, 3)], **extra.get(name, {})}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    meta = {"label_names": [f"class{i}" for i in range(10)], **extra.get("batches.meta", {})}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=protocol))


def test_the_payload_is_real(tmp_path):
    """The control: plain ``pickle.loads`` of the payload writes its marker."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "m")))
    assert (tmp_path / "m").read_text() == "ran"


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL])
def test_cifar_batches_of_either_protocol_load(tmp_path, protocol):
    from raysim.data.images import load_cifar

    _write_cifar10(tmp_path, protocol=protocol)
    x, y, classes, n_train = load_cifar(tmp_path, hundred=False)
    assert x.shape == (18, 3, 32, 32) and n_train == 15 and classes[3] == "class3"


@pytest.mark.parametrize("where", ["data_batch_2", "batches.meta"])
def test_a_payload_in_a_cifar_file_never_runs(tmp_path, where):
    from raysim.data import build_federated_data

    marker = tmp_path / "code-ran"
    _write_cifar10(tmp_path, **{where: {"filenames": Payload(marker)}})
    with pytest.raises(UserError, match=f"{where} is a malformed CIFAR-10 file.*refused builtins.exec") as info:
        build_federated_data(_cfg(tmp_path))
    assert "\n" not in str(info.value)
    assert not marker.exists()


def test_a_payload_in_a_cache_entry_never_runs(tmp_path):
    """An entry is read with ``allow_pickle=False``: an object array in it is a foreign file, rebuilt."""
    from raysim.data.cache import cached_arrays

    cfg = _cfg(tmp_path)
    built = {"x": np.arange(4)}
    cached_arrays(cfg, "t", {"k": 1}, lambda: built)
    (entry,) = (tmp_path / "_cache").iterdir()
    marker = tmp_path / "code-ran"
    with open(entry, "wb") as fh:
        np.savez(fh, x=np.array([Payload(marker)], dtype=object))
    got = cached_arrays(cfg, "t", {"k": 1}, lambda: built)
    assert np.array_equal(got["x"], built["x"]) and not marker.exists()


def _sweep_dir(tmp_path: Path) -> Path:
    """A sweep directory as ``raysim tune`` leaves it (sweep.yaml, tune/tuner.pkl), the pickle a real payload."""
    from conftest import ROOT
    from raysim.tune.spec import load_sweep, spec_to_yaml

    sweep_dir = tmp_path / "sw"
    (sweep_dir / "tune").mkdir(parents=True)
    spec = load_sweep(ROOT / "experiments" / "sweeps" / "smoke-lr.yaml", [f"dir={sweep_dir}"])
    (sweep_dir / "sweep.yaml").write_text(spec_to_yaml(spec))
    (sweep_dir / "tune" / "tuner.pkl").write_bytes(pickle.dumps(Payload(tmp_path / "code-ran")))
    (sweep_dir / "tune" / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    return sweep_dir


def test_a_payload_in_tunes_state_never_runs(tmp_path, capsys):
    """A tuner.pkl other than the one Tune wrote for raysim (whose sha256 raysim recorded) is refused in one line;
    without a record it is not read either (nothing is known to have run: the sweep would start again)."""
    from raysim.cli import main
    from raysim.tune.sweepdir import TUNER_DIGEST, _tune_state_restorable

    sweep_dir = _sweep_dir(tmp_path)
    assert _tune_state_restorable(sweep_dir / "tune") is False
    (sweep_dir / TUNER_DIGEST).write_text("0" * 64 + "\n")  # the digest of the file Tune wrote
    assert main(["tune", "--resume", str(sweep_dir), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "tuner.pkl does not match the sha256 raysim recorded" in err and err.count("\n") == 0, err
    assert not (tmp_path / "code-ran").exists()
