"""Which Ray a run uses (engine.address, by ray.init()'s convention): a running `ray start` cluster is joined, a
stale record of an ended one is passed over, and a refused token is one line."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray

from raysim.engine import connect, resources
from raysim.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TINY_RUN = ["rounds=1", "clients.num=4", "data.name=sklearn_digits", "model.name=mlp", "model.hidden=[16]",
            "model.feature_dim=8", "engine.num_workers=1"]


def _dead_address() -> str:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_stale_cluster_record_is_passed_over_and_a_private_ray_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE", "token"))  # restored afterwards
    assert connect.choose_cluster(None) == (None, None)  # nothing recorded: a private Ray
    dead = _dead_address()
    (tmp_path / "ray").mkdir()
    connect.recorded_cluster_file().write_text(dead)  # what a head killed without `ray stop` leaves behind
    assert connect.choose_cluster(None) == (None, None)
    assert connect.choose_cluster("local") == (None, None)
    with pytest.raises(UserError, match="is gone"):
        connect.choose_cluster("auto")  # "auto" asks for a running cluster: none is an error, at once
    with pytest.raises(UserError, match=f"config key 'engine.address': cannot reach a Ray cluster at '{dead}'"):
        connect.choose_cluster(dead)
    monkeypatch.setenv("RAY_ADDRESS", dead)
    with pytest.raises(UserError, match="environment variable RAY_ADDRESS: cannot reach"):
        connect.choose_cluster(None)
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert connect.choose_cluster(None) == (None, None)


def test_the_private_ray_ignores_any_recorded_cluster(monkeypatch):
    """ray.init() with no address would join (or fail on) the recorded cluster; raysim's own Ray, and the tests'
    and benchmarks' (init_local_ray), ask for address="local"."""
    seen: dict = {}
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    resources.init_local_ray(num_cpus=1)
    assert seen["address"] == "local" and seen["num_cpus"] == 1


def _cli(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)


@pytest.mark.slow
def test_a_running_local_cluster_is_joined_and_a_refused_token_is_one_line(tmp_path):
    temp = tempfile.mkdtemp(prefix="rs")  # Ray's socket paths must stay short: not under pytest's tmp_path
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env.update(RAY_TMPDIR=temp, PYTHONPATH=str(ROOT))
    port = _dead_address().split(":")[1]
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                             "--disable-usage-stats"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    record = Path(temp) / "ray" / "ray_current_cluster"
    try:
        deadline = time.monotonic() + 60
        while not record.is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = record.read_text().strip()
        # the three commands at once (each is mostly Python and Ray imports): engine.address null joins, as
        # ray.init() would (the token is found as ray.init finds it) and says so; an explicit address sends no token
        # unless RAY_AUTH_MODE=token (Ray's rule); a wrong token. The last two: one line, without ray.init's retries.
        joined = _cli(TINY_RUN + [f"log.dir={tmp_path / 'run'}"], env, tmp_path)
        refusals = [(_cli(TINY_RUN + [f"engine.address={address}", f"log.dir={tmp_path / f'refused-{i}'}"],
                          {**env, **extra}, tmp_path), says)
                    for i, (extra, says) in enumerate([({}, "sent no token; set RAY_AUTH_MODE=token"),
                                                       ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token"},
                                                        "refused this process's authentication token")])]
        for proc, says in refusals:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 2 and err.count("\n") == 1, err  # no warning a second for ~20 s
            assert err.startswith(f"raysim: error: config key 'engine.address': the Ray cluster at {address}") \
                and says in err, err
        assert not list(tmp_path.glob("refused-*"))  # nothing half-made
        _, err = joined.communicate(timeout=180)
        assert joined.returncode == 0, err
        assert f"raysim: joining the Ray cluster at {address} (started by `ray start`)" in err
        assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the head and every process it started (their own session)
        head.wait(timeout=60)
        shutil.rmtree(temp, ignore_errors=True)
