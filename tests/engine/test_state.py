"""ClientStateStore checkpoints: changed states only, superseded files dropped, a faithful load, leftovers removed;
client state past Ray's object-store budget spills and comes back identical."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT, read_rows, strip_timing, tiny_overrides
from raysim.trees import copy_tree
from raysim.engine.state import FORMAT_VERSION, ClientStateStore, read_checkpoint
from raysim.errors import UserError


class Snapshots:
    """The object store of the in-process executor: a handle is a private copy (the store is tested, not Ray)."""

    @staticmethod
    def put(obj):
        return copy_tree(obj)

    @staticmethod
    def get(handles):
        return list(handles)


def _state(cid: int, rnd: int) -> dict:
    return {"head.weight": torch.full((2, 3), float(cid * 100 + rnd)), "steps": torch.tensor(rnd)}


def _files(ckpt) -> list[str]:
    return sorted(p.name for p in (ckpt / "clients").iterdir())


def test_save_writes_changed_states_and_drops_superseded_files(tmp_path):
    ray = Snapshots
    ckpt = tmp_path / "checkpoint"
    store = ClientStateStore(Snapshots)
    for cid in (0, 1, 2):
        store.put(cid, ray.put(_state(cid, 1)))
    store.save(ckpt, 1, {"model": {"w": torch.zeros(1)}})
    assert _files(ckpt) == ["c000000_r00001.pt", "c000001_r00001.pt", "c000002_r00001.pt"]
    store.put(1, ray.put(_state(1, 2)))  # only client 1 trained in round 2
    store.save(ckpt, 2, {"model": {"w": torch.ones(1)}})
    assert _files(ckpt) == ["c000000_r00001.pt", "c000001_r00002.pt", "c000002_r00001.pt"]
    ckpt_dict = read_checkpoint(tmp_path)
    assert ckpt_dict["format"] == FORMAT_VERSION and ckpt_dict["round"] == 2
    assert ckpt_dict["client_files"] == {0: 1, 1: 2, 2: 1}
    assert torch.equal(ckpt_dict["model"]["w"], torch.ones(1))
    store.save(ckpt, 3, {})  # nothing changed: nothing rewritten
    assert _files(ckpt) == ["c000000_r00001.pt", "c000001_r00002.pt", "c000002_r00001.pt"]


def test_load_restores_every_state_and_removes_what_no_checkpoint_names(tmp_path):
    ray = Snapshots
    ckpt = tmp_path / "checkpoint"
    store = ClientStateStore(Snapshots)
    for cid in (0, 3):
        store.put(cid, ray.put(_state(cid, 4)))
    store.save(ckpt, 4, {})
    # a crash after round 5 wrote a client file but no server.pt, and left a temporary file
    torch.save(_state(0, 5), ckpt / "clients" / "c000000_r00005.pt")
    (ckpt / "clients" / ".c000003_r00005.pt.123.ab.tmp").write_bytes(b"half")
    fresh = ClientStateStore(Snapshots)
    fresh.load(ckpt, read_checkpoint(tmp_path)["client_files"])
    assert len(fresh) == 2 and fresh.get(1) is None
    for cid in (0, 3):
        got = fresh.get(cid)
        assert got.keys() == _state(cid, 4).keys()
        assert all(torch.equal(got[k], v) for k, v in _state(cid, 4).items())
    assert _files(ckpt) == ["c000000_r00004.pt", "c000003_r00004.pt"]
    fresh.save(ckpt, 5, {})  # loaded states are clean: the next checkpoint rewrites none of them
    assert _files(ckpt) == ["c000000_r00004.pt", "c000003_r00004.pt"]


def test_a_damaged_checkpoint_is_one_user_error(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(UserError, match="checkpoint file missing"):
        read_checkpoint(tmp_path)
    (tmp_path / "checkpoint" / "server.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="damaged or not a raysim checkpoint"):
        read_checkpoint(tmp_path)
    torch.save({"round": 1}, tmp_path / "checkpoint" / "server.pt")  # no format version
    with pytest.raises(UserError, match=f"not a raysim checkpoint of format {FORMAT_VERSION}"):
        read_checkpoint(tmp_path)


def test_the_checkpoint_layout_is_named_in_one_place(tmp_path):
    """The on-disk names the module docstring documents, from the functions every caller uses."""
    from raysim.engine.state import (checkpoint_dir, client_file, has_checkpoint, history_file, parse_entry_name,
                                     server_file)

    assert checkpoint_dir(tmp_path) == tmp_path / "checkpoint"
    assert server_file(tmp_path) == tmp_path / "checkpoint" / "server.pt"
    assert client_file(checkpoint_dir(tmp_path), 42, 7) == tmp_path / "checkpoint" / "clients" / "c000042_r00007.pt"
    assert history_file(checkpoint_dir(tmp_path), 42, 7) == tmp_path / "checkpoint" / "history" / "c000042_r00007.pt"
    assert parse_entry_name("c000042_r00007.pt") == (42, 7)
    assert parse_entry_name(".c000042_r00007.pt.1.ab.tmp") is None and parse_entry_name("server.pt") is None
    assert not has_checkpoint(tmp_path)
    checkpoint_dir(tmp_path).mkdir()
    assert not has_checkpoint(tmp_path)  # a directory alone is no checkpoint: server.pt is the commit point
    server_file(tmp_path).write_bytes(b"")
    assert has_checkpoint(tmp_path)


# partialavg keeps each client's backbone: 64 -> 1024 -> 1024 -> 16 is ~4.5 MB of state a client, 24 clients ~108 MB,
# past the smallest object store Ray allows (75 MiB)
SPILL = dict(algorithm__name="partialavg", clients__num=24, model__hidden="[1024,1024]", rounds=2)


@pytest.mark.slow
def test_client_state_past_the_object_store_budget_spills_and_comes_back_identical(cli_env, tmp_path):
    """A private Ray (its own process: the session's Ray has its own budget) whose object store holds 75 MiB: the
    clients' states spill to disk, and the run's metrics are those of an in-process run, which keeps every state
    in memory."""
    code = textwrap.dedent(f"""
        import json, re, ray, raysim
        from ray._private.internal_api import memory_summary
        r = raysim.run(None, *{tiny_overrides(tmp_path, log__dir=str(tmp_path / "ray"), engine__backend="ray",
                                               engine__state_memory_gb=75 / 1024, **SPILL)!r})
        text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
        spilled = re.search(r"Spilled (\\d+) MiB, (\\d+) objects", text)
        print(json.dumps({{"spilled_mib": int(spilled.group(1)) if spilled else 0}}))
    """)
    # Ray refuses to spill once its disk looks 95 % full (this machine's does); the test is about raysim, not space
    env = {**cli_env, "RAY_local_fs_capacity_threshold": "0.999"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spilled = json.loads(proc.stdout.strip().splitlines()[-1])["spilled_mib"]
    assert spilled > 0, proc.stdout
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    _, inline, _ = run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "inline"),
                                                                   **SPILL)))
    assert strip_timing(read_rows(tmp_path / "ray")) == strip_timing(inline)
