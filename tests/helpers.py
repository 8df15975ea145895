"""Helpers the tests share: a tiny experiment (as a mapping and as overrides), reading a run's metrics, and the
check that the CLI refuses a config the way a user sees it. ``conftest.py`` re-exports them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGINS = ROOT / "examples" / "plugins"
TEST_PLUGINS = ROOT / "tests" / "plugins"  # test-only algorithms (tests/plugins/*.py), importable by conftest


# the same tiny experiment as a config mapping (for YAML files written by tests)
TINY = {
    "name": "tiny", "rounds": 2,
    "clients": {"num": 4},
    "data": {"name": "sklearn_digits", "partition": "iid"},
    "model": {"name": "mlp", "hidden": [32], "feature_dim": 16},
    "train": {"lr": 0.1, "batch_size": 32},
    "engine": {"num_workers": 1},
}


def tiny_overrides(tmp_path: Path, **extra: object) -> list[str]:
    """A small, fast experiment on scikit-learn's digits; extra keys as dotted overrides (a__b -> a.b).

    In this process (``engine.backend=inline``: ~0.3 s, where a run on Ray starts a driver and a worker process,
    ~5-10 s), whatever Ray the session has started (with Ray initialised, ``auto`` would mean Ray). Tests about what
    only Ray does ask for ``engine__backend="ray"`` (and the ``ray_cluster`` fixture) and for more workers."""
    base = {
        "name": "t", "rounds": 2, "clients.num": 4, "data.name": "sklearn_digits", "data.partition": "iid",
        "model.name": "mlp", "model.hidden": "[32]", "model.feature_dim": 16, "train.lr": 0.1,
        "train.batch_size": 32, "engine.num_workers": 1, "engine.backend": "inline", "log.dir": str(tmp_path / "run"),
    }
    base.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def strip_timing(rows: list[dict]) -> list[dict]:
    """Metrics minus wall-clock times, for comparing runs."""
    return [{k: v for k, v in r.items() if not k.startswith("wall_s")} for r in rows]


def crash_after(cfg: object, round: int) -> None:
    """Run ``cfg`` in process and stop it as a crash would, by an exception raised from ``on_round`` once round
    ``round`` is logged (its checkpoint stays): the first half of every resume-equals-the-whole-run test."""
    import pytest

    from raysim.engine.runner import run_experiment

    class Crash(Exception):
        pass

    def crash(metrics: dict) -> None:
        if metrics["round"] == round:
            raise Crash()

    with pytest.raises(Crash):
        run_experiment(cfg, on_round=crash)


_RAY_FORWARDED = re.compile(r"^(\x1b\[[0-9;]*m)?\((raylet|gcs_server|[\w:.]*\s?pid=\d+[^)]*)\)")


def refused_config(key: str, *args: str) -> str:
    """``raysim run ARGS`` through the CLI's entry point, which must refuse the config the way a user sees it: exit
    2, one stderr line ``raysim: error: config key 'KEY'...``, no traceback; returns that line.

    In this process, not a fresh one: a config is refused before Ray or torch work starts, and an interpreter a
    check costs ~4 s (the CLI's own tests run the same path as a real subprocess)."""
    import contextlib
    import io

    from raysim.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.chdir(ROOT):
        code = main(["run", *args])
    # lines Ray forwards from its own processes, "(raylet) ..." or "(ClientWorker pid=...) ...", arrive from the test
    # session's Ray whenever they come (a full disk's warning, say), not from this call: raysim's output is the rest
    stderr = "".join(line for line in err.getvalue().splitlines(keepends=True) if not _RAY_FORWARDED.match(line))
    assert code == 2, stderr
    assert stderr.strip().count("\n") == 0 and "Traceback" not in stderr, stderr
    assert stderr.startswith(f"raysim: error: config key '{key}'"), stderr
    return stderr


def context(**fields: object):
    """A real ``ClientContext`` for a hook's unit test: client 0 in round 1 of 1, one local epoch, empty payload and
    state unless given (``round=-1`` for evaluation). Runs build theirs with ``raysim.engine.core.make_context``."""
    from raysim.algorithms.base import ClientContext

    defaults: dict = {"client_id": 0, "round": 1, "total_rounds": 1, "epoch": 0, "num_epochs": 1, "payload": {},
                      "state": {}}
    defaults.update(fields)
    return ClientContext(**defaults)


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows (one per ``wandb.log`` step) of an offline W&B run, read from its ``run-*.wandb`` file: W&B's
    LevelDB-style log (a 7-byte file header, records of a 7-byte header + payload in 32 KiB blocks) of protobuf
    ``Record`` messages. W&B ships no reader of its own any more; this is only what the tests need."""
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = Path(run_dir).glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    rows, pos, pending, block = [], 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
    return rows


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _read_jobs(gate: Path) -> list[tuple[int, int, int]]:
    from held_jobs import read_jobs  # tests/plugins/held_jobs.py, importable once conftest has run

    return read_jobs(gate)


class KillInFlight:
    """A thread that SIGKILLs the worker of the first held job of ``round``, then opens the gate.

    ``killed``: (client, pid) of that job. The gate opens whatever happens, so a failing test never leaves a run
    waiting for it."""

    def __init__(self, gate: Path, round: int = 2, timeout: float = 300):
        self.gate, self.round, self.timeout = gate, round, timeout
        self.killed: tuple[int, int] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "KillInFlight":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.touch()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            while time.monotonic() < deadline:
                held = [(client, pid) for rnd, client, pid in _read_jobs(self.gate) if rnd == self.round]
                if held:
                    client, pid = held[0]
                    os.kill(pid, signal.SIGKILL)
                    while alive(pid) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    self.killed = (client, pid)
                    return
                time.sleep(0.05)
        finally:
            self.gate.touch()

    def assert_rerun(self) -> None:
        """The killed job ran again, in another process."""
        assert self.killed is not None, f"no job of round {self.round} was held: {_read_jobs(self.gate)}"
        client, pid = self.killed
        pids = [p for rnd, c, p in _read_jobs(self.gate) if (rnd, c) == (self.round, client)]
        assert pids[0] == pid and len(pids) >= 2 and pids[-1] != pid, (self.killed, _read_jobs(self.gate))


# the runs of killed_worker_matches_inline: half the clients sampled, so some clients train for the first time after
# round 1 and others bring back state from rounds before; the kill waits for a job of round 2 in flight, so small
# rounds will do
FAULT_RUN = dict(rounds=3, clients__num=6, clients__fraction=0.5, train__local_epochs=2, data__partition="dirichlet")


def killed_worker_matches_inline(tmp_path: Path, **extra: object) -> list[dict]:
    """The ``FAULT_RUN`` tiny experiment with ``extra`` run twice: in process (no Ray), then on Ray with two
    workers, one SIGKILLed in the middle of a client job of round 2 (tests/plugins/held_jobs.py holds the round's
    jobs until the worker is dead). The killed job must run again in another process, and both runs must give the
    same metrics: one comparison checks in-process against two workers, and a killed worker (client state lives
    outside workers, server state in the driver). Returns the in-process rows. Needs the ``ray_cluster`` fixture."""
    from held_jobs import hold

    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    plugins = ",".join(["held_jobs"] + [p for p in str(extra.pop("plugins", "[]")).strip("[]").split(",") if p])

    def cfg(name: str, **more: object):
        overrides = {**FAULT_RUN, **extra, "plugins": f"[{plugins}]", **more}
        return load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **overrides))

    _, one, _ = run_experiment(cfg("one", engine__backend="inline"))
    gate = tmp_path / "gate"
    hold(tmp_path / "ray", 2, gate)
    with KillInFlight(gate) as kill:
        _, hit, _ = run_experiment(cfg("ray", engine__backend="ray", engine__num_workers=2))
    kill.assert_rerun()
    assert hit[1]["workers_replaced"] == hit[-1]["workers_replaced"] == 1 and "workers_replaced" not in hit[0]
    assert [{k: v for k, v in r.items() if k != "workers_replaced"} for r in strip_timing(hit)] == strip_timing(one)
    return one


def launch_cli(args: list[str], env: dict) -> subprocess.Popen:
    """``raysim ARGS`` in a process group of its own, like a job started from a shell (its Ray included); ``env``:
    the ``cli_env`` fixture."""
    return subprocess.Popen([sys.executable, "-m", "raysim.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=True)


def kill_group_once(proc: subprocess.Popen, text: str, timeout: float = 300) -> list[str]:
    """Read the console until a line holds ``text``, then SIGKILL the whole process group (a crash, an OOM kill);
    the lines read."""
    seen: list[str] = []
    deadline = time.time() + timeout
    assert proc.stdout is not None
    try:
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"exited ({proc.wait()}) before {text!r}:\n" + "".join(seen[-30:]))
            seen.append(line)
            if text in line:
                return seen
        raise AssertionError(f"never saw {text!r}:\n" + "".join(seen[-30:]))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
