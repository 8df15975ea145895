"""Preemption: a real ``kill -TERM`` to ``raysim run``, ``raysim run --seeds`` and ``raysim tune`` (how Slurm,
Kubernetes and spot schedulers take a machine back) ends them as Ctrl-C does: the round in flight finishes (or, past
the grace period, is abandoned), the checkpoint is whole, one line gives the resume command, the exit status is 143
and no Ray signal dump reaches the terminal; ``--resume`` then ends with an undisturbed run's metrics.

The plugin gate (tests/plugins/held.py) holds a round until the test has sent the signal, so the signal always
lands in that round."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY, read_rows, strip_timing, tiny_overrides
from raysim.cli import main
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.engine.state import has_checkpoint, read_checkpoint

pytestmark = pytest.mark.slow
PLUGINS = ROOT / "tests" / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))  # --resume in this process imports the gate's plugin


def _held(tmp_path: Path, hold_round: int) -> dict[str, object]:
    """Overrides (as tiny_overrides keys) that hold round ``hold_round`` until ``tmp_path/go`` exists."""
    return {"plugins": "[held]", "algorithm__name": "held_fedavg", "algorithm__hold_round": hold_round,
            "algorithm__hold_until": str(tmp_path / "go"), "algorithm__hold_reached": str(tmp_path / "held")}


def _launch(args: list[str], **env: str) -> subprocess.Popen:
    """``raysim ARGS`` in a session of its own (a job started from a shell), its output captured."""
    environ = dict(os.environ, PYTHONUNBUFFERED="1", **env)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), environ.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-m", "raysim.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environ, cwd=ROOT, start_new_session=True)


def _terminate_when_held(proc: subprocess.Popen, tmp_path: Path, *, release: bool) -> tuple[str, str, float]:
    """Once the held round has begun, SIGTERM the process (its pid alone, as `kill -TERM PID`); ``release``: then
    let the round go on. Returns (stdout, stderr, seconds from the signal to the exit)."""
    deadline = time.monotonic() + 300
    while not (tmp_path / "held").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            raise AssertionError(f"never reached the held round (exit {proc.returncode}):\n{out[-2000:]}{err[-3000:]}")
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    if release:
        time.sleep(1.0)  # the handler runs at once; the round then ends after the stop was asked for
        (tmp_path / "go").touch()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err, time.monotonic() - sent


def _one_stop_line(err: str) -> str:
    """No traceback, no Ray stack dump, and exactly one ``raysim:`` line naming the way back."""
    assert "Traceback" not in err, err
    assert "SIGTERM received" not in err and "PC: @" not in err, err  # Ray's C++ signal handler's dump
    lines = [line for line in err.splitlines() if "resume with:" in line]
    assert len(lines) == 1 and lines[0].startswith("raysim: stopped by SIGTERM"), err
    return lines[0]


def _plain(tmp_path: Path, **extra: object) -> list[dict]:
    """The undisturbed run (in this process: ``engine.backend=inline`` gives Ray's numbers)."""
    cfg = load_config(None, tiny_overrides(tmp_path / "plain", **{**extra, "engine__backend": "inline"}))
    return strip_timing(run_experiment(cfg)[1])


@pytest.mark.parametrize("backend", ["ray", "inline"])
def test_sigterm_finishes_the_round_checkpoints_it_and_resumes_identically(request, tmp_path, backend):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")  # --resume below uses the session's Ray
    run_dir = tmp_path / "run"
    proc = _launch(["run", *tiny_overrides(tmp_path, rounds=5, engine__backend=backend, **_held(tmp_path, 3))])
    out, err, took = _terminate_when_held(proc, tmp_path, release=True)
    assert proc.returncode == 143, err
    line = _one_stop_line(err)
    assert line == f"raysim: stopped by SIGTERM; round 3 is checkpointed; resume with: raysim run --resume {run_dir}"
    assert took < 30, f"{took:.1f} s from SIGTERM to exit"
    assert read_checkpoint(run_dir)["round"] == 3 and [m["round"] for m in read_rows(run_dir)] == [1, 2, 3]
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert strip_timing(read_rows(run_dir)) == _plain(tmp_path, rounds=5)


def test_sigterm_abandons_a_round_that_does_not_end_within_the_grace_period(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(["run", *tiny_overrides(tmp_path, rounds=4, engine__backend="inline", **_held(tmp_path, 3))],
                   RAYSIM_TERM_GRACE_S="2")
    out, err, took = _terminate_when_held(proc, tmp_path, release=False)  # round 3 never ends
    assert proc.returncode == 143, err
    assert _one_stop_line(err) == (f"raysim: stopped by SIGTERM: the round in flight did not end within 2 s; "
                                   f"round 2 is checkpointed; resume with: raysim run --resume {run_dir}")
    assert 2 <= took < 20, f"{took:.1f} s from SIGTERM to exit"
    assert read_checkpoint(run_dir)["round"] == 2  # the checkpoint before the abandoned round, whole
    (tmp_path / "go").touch()
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert strip_timing(read_rows(run_dir)) == _plain(tmp_path, rounds=4)


def test_sigterm_stops_a_seed_set_which_resumes_to_every_seed_done(tmp_path, capsys):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    parent = tmp_path / "seeds"
    held = [f"{k.replace('__', '.')}={v}" for k, v in _held(tmp_path, 2).items()]
    proc = _launch(["run", str(tmp_path / "exp.yaml"), "--seeds", "0,1", f"log.dir={parent}", "rounds=3", "--quiet",
                    *held])  # both seeds at once, each in a process of its own (engine.backend auto is in process)
    out, err, took = _terminate_when_held(proc, tmp_path, release=True)
    assert proc.returncode == 143, err
    assert _one_stop_line(err) == (f"raysim: stopped by SIGTERM: 2 seeds unfinished; resume with: "
                                   f"raysim run --resume {parent}")
    # the seed that reached the held round finished it and checkpointed it; the other stopped after its round in
    # flight (or before its first, when its process was still starting): every checkpoint is whole
    rounds = [read_checkpoint(parent / f"seed-{seed}")["round"] for seed in (0, 1)
              if has_checkpoint(parent / f"seed-{seed}")]
    assert 2 in rounds and set(rounds) <= {1, 2}, rounds
    assert main(["run", "--resume", str(parent), "--quiet"]) == 0
    assert "2/2 seeds done" in capsys.readouterr().out
    for seed in (0, 1):
        assert strip_timing(read_rows(parent / f"seed-{seed}")) == _plain(tmp_path / str(seed), rounds=3, seed=seed)


def test_sigterm_stops_a_sweep_which_resumes_to_every_trial_done(ray_cluster, tmp_path, capsys):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    sweep = {"base": "exp.yaml", "metric": "acc_mean", "mode": "max", "num_samples": 1,
             "space": {"train.lr": {"grid": [0.3]}}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    out_dir = tmp_path / "sw"
    held = [f"{k.replace('__', '.')}={v}" for k, v in _held(tmp_path, 2).items()]
    proc = _launch(["tune", str(tmp_path / "sweep.yaml"), f"dir={out_dir}", "rounds=3", "--quiet", *held])
    out, err, took = _terminate_when_held(proc, tmp_path, release=False)  # the trial cannot end by itself
    assert proc.returncode == 143, err
    # Tune stops its trials (a trial's stop waits behind the round in flight, then Tune kills it after 5 s), saves
    # its state and returns; on a loaded machine that can outlast the grace period, and the sweep is abandoned:
    # either way the trial keeps its checkpoint and Tune's state is restorable
    assert _one_stop_line(err) in (
        f"raysim: stopped by SIGTERM: 1 trial unfinished; resume with: raysim tune --resume {out_dir}",
        f"raysim: stopped by SIGTERM: stopping Ray Tune's trials did not end within 10 s; resume with: "
        f"raysim tune --resume {out_dir}")
    assert took < 30, f"{took:.1f} s from SIGTERM to exit"
    (tmp_path / "go").touch()
    assert main(["tune", "--resume", str(out_dir), "--quiet"]) == 0
    assert "1/1 trials done" in capsys.readouterr().out
    rows = list(csv.DictReader(open(out_dir / "results.csv")))
    assert [(r["status"], r["rounds"]) for r in rows] == [("done", "3/3")]
    assert strip_timing(read_rows(Path(rows[0]["run_dir"]))) == _plain(tmp_path, rounds=3, train__lr=0.3)
