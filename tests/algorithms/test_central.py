"""The central trainer behind FAPD's offline teacher and FedPCL's stand-in: the cache key, seeded training, the NaN
check, and the atomic cached entry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms import central
from raysim.algorithms.central import cached, read_entry, recipe_key, require_finite, train_classifier, write_entry
from raysim.errors import UserError


def test_the_cache_key_covers_recipe_arrays_and_their_types_but_not_where_they_live():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    base = recipe_key({"v": 1, "lr": 0.1}, (x, None, np.array([0, 1, 2])))
    assert base == recipe_key({"lr": 0.1, "v": 1}, (x.copy(), np.array([0, 1, 2])))  # key order, None: no matter
    assert base == recipe_key({"v": 1, "lr": 0.1}, (torch.from_numpy(x), torch.tensor([0, 1, 2])))  # numpy = torch
    assert len(base) == 32 and int(base, 16) >= 0
    others = [recipe_key({"v": 2, "lr": 0.1}, (x, np.array([0, 1, 2]))),  # the recipe
              recipe_key({"v": 1, "lr": 0.1}, (x + 1, np.array([0, 1, 2]))),  # the samples
              recipe_key({"v": 1, "lr": 0.1}, (x.astype(np.float64), np.array([0, 1, 2]))),  # their dtype
              recipe_key({"v": 1, "lr": 0.1}, (x.reshape(4, 3), np.array([0, 1, 2]))),  # their shape
              recipe_key({"v": 1, "lr": 0.1}, (x, np.array([0, 1, 3])))]  # the split
    assert len({base, *others}) == 6


def test_training_depends_only_on_its_inputs():
    x, y = torch.randn(20, 4, generator=torch.Generator().manual_seed(1)), torch.arange(20) % 3

    def train(seed: int) -> nn.Module:
        torch.manual_seed(999)  # whatever the caller's RNG holds
        return train_classifier(lambda: nn.Sequential(nn.Linear(4, 5), nn.ReLU()), x, y, feature_dim=5,
                                num_classes=3, epochs=2, lr=0.1, batch_size=6, seed=seed, device="cpu")

    a, b, c = train(7).state_dict(), train(7).state_dict(), train(8).state_dict()
    assert a.keys() == {"backbone.0.weight", "backbone.0.bias", "head.weight", "head.bias"}
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["head.weight"], c["head.weight"])


def test_a_diverged_result_is_one_line_naming_the_key():
    require_finite([torch.ones(3), torch.tensor([1, 2])], key="algorithm.teacher.lr", what="unused")
    with pytest.raises(UserError) as info:
        require_finite([torch.ones(3), torch.tensor([0.0, float("nan")])], key="algorithm.pretrain.lr",
                       what="the offline stand-in backbone diverged (NaN weights)")
    assert str(info.value) == ("config key 'algorithm.pretrain.lr': the offline stand-in backbone diverged (NaN "
                               "weights); lower algorithm.pretrain.lr")
    with pytest.raises(UserError, match="algorithm.teacher.lr"):
        require_finite([torch.tensor([float("inf")])], key="algorithm.teacher.lr", what="x diverged")


def _cached(path, train, **kw):
    return cached(path, train, who="fapd", what="teacher features", dir_key="algorithm.teacher.cache_dir", **kw)


def test_a_miss_trains_and_stores_a_hit_reads_back(tmp_path):
    calls = []

    def train(device: torch.device) -> dict:
        assert device == torch.device("cpu")  # outside a run: here, on the CPU
        calls.append(1)
        return {"features": torch.full((2, 3), float(len(calls))), "accuracy": torch.tensor(0.5, dtype=torch.float64)}

    path = tmp_path / "cache" / "k.pt"
    first = _cached(path, train)
    assert len(calls) == 1 and path.is_file() and [p.name for p in path.parent.iterdir()] == ["k.pt"]
    again = _cached(path, train)
    assert len(calls) == 1 and torch.equal(again["features"], first["features"]) and float(again["accuracy"]) == 0.5
    # an entry the caller refuses (a shape that no longer fits) is trained again and overwritten
    refused = _cached(path, train, accept=lambda e: e["features"].shape == (4, 3))
    assert len(calls) == 2 and torch.equal(refused["features"], torch.full((2, 3), 2.0))
    assert torch.equal(read_entry(path)["features"], torch.full((2, 3), 2.0))
    # a damaged or foreign file is a miss, never an error
    path.write_bytes(b"not a torch file")
    assert read_entry(path) is None
    _cached(path, train)
    assert len(calls) == 3 and read_entry(path) is not None
    torch.save({"features": [1, 2]}, path)  # not a dict of tensors
    assert read_entry(path) is None and read_entry(tmp_path / "missing.pt") is None


def test_an_interrupted_write_leaves_the_old_entry_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "k.pt"
    old = {"w": torch.zeros(3)}
    write_entry(path, old, who="fedpcl", what="the stand-in backbone", dir_key="algorithm.pretrain.cache_dir")

    def dies_midway(obj, fh, *args, **kwargs):
        fh.write(b"PK\x03\x04 half an archive")
        raise KeyboardInterrupt  # a kill while the entry is written

    monkeypatch.setattr(central.torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        _cached(path, lambda device: {"w": torch.ones(3)}, accept=lambda e: False)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["k.pt"]  # no temporary file left behind
    assert torch.equal(read_entry(path)["w"], old["w"])  # the old entry, whole


def test_an_unwritable_cache_costs_a_warning_not_the_result(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    entry = _cached(blocker / "sub" / "k.pt", lambda device: {"w": torch.ones(2)})
    assert torch.equal(entry["w"], torch.ones(2))
    err = capsys.readouterr().err
    assert err.startswith("raysim: fapd: warning: could not cache teacher features in ") and err.count("\n") == 1
    assert err.rstrip().endswith("set algorithm.teacher.cache_dir")


def test_training_goes_to_the_reserved_runner_while_a_run_is_prepared():
    """Inside ``reserved_jobs`` (the driver preparing a run's data) central training is handed to the executor's
    runner, which picks the device; outside, it runs here on the CPU; the runner is gone when the block ends."""
    seen: list = []

    def train(device: torch.device) -> dict:
        seen.append(device)
        return {"w": torch.ones(2, requires_grad=True) * 2}

    def runner(fn):  # what an executor's ``central`` does: run it where the jobs run, on that job's device
        return central.run_here(fn, "meta")

    with central.reserved_jobs(runner):
        out = central.run_reserved(train)
    assert seen == [torch.device("meta")] and out["w"].device.type == "cpu" and not out["w"].requires_grad
    out = central.run_reserved(train)
    assert seen[-1] == torch.device("cpu") and torch.equal(out["w"], torch.full((2,), 2.0))
