"""No code runs from a file raysim reads (issue 39): each test plants a real payload, a pickle that would create a
marker file when unpickled, in a file raysim reads (a CIFAR batch, a dataset cache entry; checkpoints: see
tests/engine/test_faults.py, sweep state: tests/tune/test_sweep_state.py), and asserts the marker is never written."""

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
