"""Runs and sweeps that survive crashes and collisions: SIGKILL of the launching process group, a torn metrics line,
a full disk, two processes in one directory, a failing trial."""

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

from conftest import ROOT, TINY, kill_group_once, launch_cli, read_rows, strip_timing, tiny_overrides
from raysim.cli import main
from raysim.config import load_config
from raysim.dirlock import DirLock
from raysim.engine.runner import run_experiment
from raysim.errors import UserError
from raysim.tune import load_sweep


def _one_line_error(err: str, prefix: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------------------- killed sweeps


def _sweep_file(tmp_path: Path, **body: object) -> Path:
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    sweep = {"base": "exp.yaml", "metric": "acc_mean", "mode": "max", "num_samples": 1,
             "space": {"train.lr": {"grid": [0.02, 0.3]}}, **body}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return tmp_path / "sweep.yaml"


def _undisturbed(run_dir: Path, tmp_path: Path) -> list[dict]:
    """The rows of an undisturbed run of a trial's config (in-process, which gives Ray's numbers)."""
    cfg = load_config(run_dir / "config.yaml", [f"log.dir={tmp_path / 'plain' / run_dir.name}",
                                                "engine.backend=inline"])
    return strip_timing(run_experiment(cfg)[1])


def _finished_runs(parent: Path, rounds: int) -> dict[Path, str]:
    """metrics.jsonl (wall times included, unique to one run) of every run under ``parent`` that has all rounds."""
    files = {p.parent: p.read_text() for p in parent.glob("*/metrics.jsonl")}
    return {d: text for d, text in files.items() if text.count("\n") == rounds}


@pytest.mark.parametrize("moment", ["before any report", "after a trial ended"])
def test_sweep_killed_resumes_to_every_trial_done(ray_cluster, cli_env, tmp_path, capsys, moment):
    quiet = ["--quiet"] if moment == "after a trial ended" else []
    # killed before any report, a one-trial sweep starts its trial anew (each trial more is three more processes)
    sweep, out = _sweep_file(tmp_path, space={"train.lr": {"grid": [0.3]}}), tmp_path / "sw"
    held, gate = [], tmp_path / "go"
    if quiet:
        # after a trial ended, two trials: one done, the other mid-way. The second holds round 2 until the kill is
        # over (tests/plugins/held.py): run side by side, the two would end within moments of each other, and a kill
        # that landed after both had ended left the resume nothing to run, hence no "2/2 trials done" line
        (tmp_path / "open").touch()
        sweep = _sweep_file(tmp_path, space={"algorithm.hold_until": {"grid": [str(tmp_path / "open"), str(gate)]}})
        held = ["plugins=[held]", "algorithm.name=held_fedavg", "algorithm.hold_round=2", "train.lr=0.3"]
    trials = 2 if quiet else 1
    proc = launch_cli(["tune", str(sweep), f"dir={out}", "rounds=3", *held, *quiet], cli_env)
    kill_group_once(proc, "1/2 trials done" if quiet else "raysim: started trial")
    gate.touch()
    ended = _finished_runs(out / "trials", 3)  # with the gate, exactly the open trial had ended
    assert len(ended) == (1 if quiet else 0), ended

    assert main(["tune", "--resume", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and f"{trials}/{trials} trials done" in captured.out
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == trials and all(r["status"] == "done" and r["rounds"] == "3/3" for r in rows), rows
    # a trial that had ended was not run again (its rows, wall times included, are those it wrote before the kill)
    assert {d: (d / "metrics.jsonl").read_text() for d in ended} == ended
    # and each trial ends as an undisturbed run of its config (continued from its checkpoint, or restarted)
    for r in rows:
        run_dir = Path(r["run_dir"])
        if quiet:
            assert load_config(run_dir / "config.yaml").algorithm.hold_until == r["algorithm.hold_until"]
        assert strip_timing(read_rows(run_dir)) == _undisturbed(run_dir, tmp_path), r

    if moment == "after a trial ended":  # killed while the table was written: a resume writes it again
        table = (out / "results.md").read_text()
        (out / "results.csv").write_text("trial,algorithm.hold_until\n3a")
        (out / "best.yaml").unlink()
        assert main(["tune", "--resume", str(out), "--quiet"]) == 0
        assert (out / "results.md").read_text() == table and load_config(out / "best.yaml").log.dir is None
        assert len(list(csv.DictReader(open(out / "results.csv")))) == 2


@pytest.mark.slow
def test_seed_set_killed_midway_resumes(shared_run, cli_env, tmp_path, capsys):
    """A seed set run in this process (engine.backend=inline), killed after its first seed ended."""
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    parent = tmp_path / "seeds"
    proc = launch_cli(["run", str(tmp_path / "exp.yaml"), "--seeds", "0,1", f"log.dir={parent}", "rounds=3",
                    "engine.backend=inline", "--quiet"], cli_env)
    kill_group_once(proc, "1/2 seeds done")
    ended = _finished_runs(parent, 3)
    assert [d.name for d in ended] == ["seed-0"]
    assert main(["run", "--resume", str(parent), "--quiet"]) == 0
    assert "2/2 seeds done" in capsys.readouterr().out
    rows = list(csv.DictReader(open(parent / "results.csv")))
    assert sorted(r["seed"] for r in rows) == ["0", "1"] and all(r["status"] == "done" for r in rows)
    assert (parent / "seed-0" / "metrics.jsonl").read_text() == ended[parent / "seed-0"]  # not run again
    plain = shared_run(name=TINY["name"], seed=1, rounds=3)[1]  # exp.yaml with seed=1 rounds=3 (as test_seeds')
    assert strip_timing(read_rows(parent / "seed-1")) == strip_timing(plain)


def test_a_failing_trial_shows_its_cause_and_resume_runs_it_again(ray_cluster, tmp_path, capsys):
    sweep = _sweep_file(tmp_path, space={"algorithm.name": {"grid": ["fedavg", "fail_round2"]}},
                        fixed={"plugins": ["fail_round2"]})
    out = tmp_path / "sw"
    assert main(["tune", str(sweep), f"dir={out}", "--quiet"]) == 1  # the sweep ran to its end; a trial failed
    captured = capsys.readouterr()
    cause = "RuntimeError: deliberate failure in round 2 | for the test"
    assert "Traceback" not in captured.err, captured.err
    assert f"failed: {cause}" in captured.out  # the progress line
    assert f"failed: {cause}" in captured.err  # the summary after the table
    rows = {r["algorithm.name"]: r for r in csv.DictReader(open(out / "results.csv"))}
    assert rows["fedavg"]["status"] == "done"
    assert rows["fail_round2"]["status"] == f"error: {cause}" and rows["fail_round2"]["rounds"] == "1/2"
    assert "error: RuntimeError: deliberate failure in round 2 \\| for the test" in (out / "results.md").read_text()
    # its own failure, not a lost node: Tune did not restart it (its record holds one failure), nor said it would
    assert [p.read_text().count("Failure #") for p in (out / "tune").glob("*/error.txt")] == [1]
    assert "Tune restarts it" not in captured.out

    done = (Path(rows["fedavg"]["run_dir"]) / "metrics.jsonl").read_text()

    # --resume runs the failed trial again (it passes now: tests/plugins/fail_round2.py), not the one that ended
    (out / "trials" / "PASS").touch()
    assert main(["tune", "--resume", str(out), "--quiet"]) == 0
    rows = {r["algorithm.name"]: r for r in csv.DictReader(open(out / "results.csv"))}
    assert all(r["status"] == "done" and r["rounds"] == "2/2" for r in rows.values()), rows
    assert (Path(rows["fedavg"]["run_dir"]) / "metrics.jsonl").read_text() == done
    assert not (Path(rows["fail_round2"]["run_dir"]) / "error.txt").exists()


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"{path} never appeared:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.05)


def _held(gate: Path) -> list[str]:
    """Round 2 of every run waits for ``gate`` (tests/plugins/held.py), so a Ctrl-C lands in a round."""
    return ["plugins=[held]", "algorithm.name=held_fedavg", "algorithm.hold_round=2", f"algorithm.hold_until={gate}"]


def test_sweep_stopped_by_ctrl_c_exits_130_with_its_trials_unfinished(ray_cluster, tmp_path, capsys, monkeypatch):
    """Ctrl-C once the sweep's only trial has reported round 1, while its round 2 waits for a gate: exit 130, the
    trial `unfinished`, the resume hint."""
    from raysim.tune import _Progress

    sweep, out, gate = _sweep_file(tmp_path, space={"train.lr": {"grid": [0.3]}}), tmp_path / "sw", tmp_path / "gate"
    reported = _Progress.result

    def report_then_interrupt(self, trial, result):
        reported(self, trial, result)
        if result.get("round") == 1:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: Tune stops the experiment and saves its state

    monkeypatch.setattr(_Progress, "result", report_then_interrupt)
    try:
        code = main(["tune", str(sweep), f"dir={out}", "rounds=3", "--quiet", *_held(gate)])
    finally:
        gate.touch()
    err = capsys.readouterr().err
    assert code == 130, err
    assert f"1 trial unfinished; resume with: raysim tune --resume {out}" in err and "Traceback" not in err, err
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["status"], r["rounds"]) for r in rows] == [("unfinished", "1/3")], rows


@pytest.mark.slow
def test_seed_set_stopped_by_ctrl_c_exits_130_with_its_seeds_unfinished(cli_env, tmp_path):
    """Ctrl-C in round 2 of seed 0 (in-process): that round ends and is checkpointed, the set stops with exit
    130, and both seeds are `unfinished`."""
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    parent, gate = tmp_path / "seeds", tmp_path / "gate"
    proc = launch_cli(["run", str(tmp_path / "exp.yaml"), "--seeds", "0,1", f"log.dir={parent}", "rounds=3",
                    "engine.backend=inline", "--quiet", *_held(gate)], cli_env)
    try:
        _wait_for_file(Path(f"{gate}.waiting"), proc)
        proc.send_signal(signal.SIGINT)
        _wait_for_file(Path(f"{gate}.sigints"), proc)  # a graceful stop asked for; now round 2 may end
        gate.touch()
        out_text = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out_text
    assert f"2 seeds unfinished; resume with: raysim run --resume {parent}" in out_text, out_text
    rows = {r["seed"]: r for r in csv.DictReader(open(parent / "results.csv"))}
    assert [rows[s]["status"] for s in "01"] == ["unfinished", "unfinished"] and rows["0"]["rounds"] == "2/3"
    assert [r["round"] for r in read_rows(parent / "seed-0")] == [1, 2]


def test_a_failing_seed_set_exits_1_with_each_cause(tmp_path, capsys):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    parent = tmp_path / "seeds"
    assert main(["run", str(tmp_path / "exp.yaml"), "--seeds", "0,1", f"log.dir={parent}", "plugins=[fail_round2]",
                 "algorithm.name=fail_round2", "engine.backend=inline", "--quiet"]) == 1
    err = capsys.readouterr().err
    cause = "RuntimeError: deliberate failure in round 2 | for the test"
    assert f"seed seed-0 failed: {cause}" in err and "2 seeds failed" in err, err
    rows = list(csv.DictReader(open(parent / "results.csv")))
    assert [(r["seed"], r["status"], r["rounds"]) for r in rows] == [(s, f"error: {cause}", "1/2") for s in "01"]


# ------------------------------------------------------------------------------------------- torn line, full disk


@pytest.fixture(scope="module")
def undisturbed_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("undisturbed")
    return run_experiment(load_config(None, tiny_overrides(d, rounds=3, plugins="[full_disk]")))[0]


@pytest.fixture(scope="module")
def undisturbed(undisturbed_dir) -> list[dict]:
    return strip_timing(read_rows(undisturbed_dir))


def test_torn_last_line_is_trimmed_on_resume_and_skipped_by_report(undisturbed, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["run", *tiny_overrides(tmp_path, rounds=2, plugins="[full_disk]"), "--quiet"]) == 0
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 3, "acc_mean": 0.5')  # a kill in the middle of a write
    capsys.readouterr()
    assert main(["report", str(run_dir), "--out", str(tmp_path / "report"), "--no-plots"]) == 0
    warning = _one_line_error(capsys.readouterr().err, "raysim: warning:")
    assert "metrics.jsonl" in warning and "incomplete last line" in warning
    assert main(["run", "--resume", str(run_dir), "rounds=3", "--quiet"]) == 0
    assert strip_timing(read_rows(run_dir)) == undisturbed


@pytest.mark.parametrize("where", ["metrics", "checkpoint"])
def test_full_disk_stops_in_one_line_and_resumes_identically(undisturbed, undisturbed_dir, tmp_path, capsys, where):
    run_dir = tmp_path / "run"
    (tmp_path / "FULL_DISK").write_text(f"{where} 2")  # read by tests/plugins/full_disk.py in the driver
    assert main(["run", *tiny_overrides(tmp_path, rounds=3, plugins="[full_disk]"), "--quiet"]) == 3
    stop = _one_line_error(capsys.readouterr().err, "raysim: stopped:")
    assert f"resume with: raysim run --resume {run_dir}" in stop
    assert ("No space left on device" if where == "metrics" else "cannot write the checkpoint") in stop
    (tmp_path / "FULL_DISK").unlink()  # space freed
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert strip_timing(read_rows(run_dir)) == undisturbed
    # the per-client file too: its torn (or whole but uncheckpointed) line trimmed on resume, then rewritten
    assert (run_dir / "client_metrics.jsonl").read_text() == (undisturbed_dir / "client_metrics.jsonl").read_text()


# ------------------------------------------------------------------------------------------- one process per directory


def test_dir_lock_refuses_a_second_holder_and_dies_with_its_process(tmp_path):
    with DirLock(tmp_path):
        with pytest.raises(UserError, match=rf"in use by another raysim process \(pid {os.getpid()} "):
            DirLock(tmp_path).acquire()
    DirLock(tmp_path).acquire().release()  # released
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from raysim.dirlock import DirLock; "
                               f"DirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match=rf"pid {holder.pid} "):
        DirLock(tmp_path).acquire()
    holder.kill()
    holder.wait()
    DirLock(tmp_path).acquire().release()  # the lock file is still there, but nothing holds it


@pytest.mark.slow
def test_second_run_into_a_running_directory_is_refused_and_a_killed_one_resumes(cli_env, tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = launch_cli(["run", *tiny_overrides(tmp_path, rounds=200)], cli_env)
    try:
        _wait_for(first, "1/200")
        capsys.readouterr()
        for args in (["run", *tiny_overrides(tmp_path, rounds=200)],  # the same new log.dir, a second time
                     ["run", "--resume", str(run_dir)]):  # a run still running
            assert main(args) == 2
            refusal = _one_line_error(capsys.readouterr().err, "raysim: error:")
            assert f"{run_dir} is in use by another raysim process (pid {first.pid} " in refusal
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    # the killed run left its lock file; it blocks nothing
    assert main(["run", "--resume", str(run_dir), "rounds=3", "--quiet"]) == 0
    rounds = [m["round"] for m in read_rows(run_dir)]
    assert rounds == list(range(1, len(rounds) + 1)) and rounds[-1] >= 3  # one run's rounds, once each


def test_a_filesystem_without_locks_warns_and_runs(tmp_path, capsys, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert main(["run", *tiny_overrides(tmp_path), "--quiet"]) == 0
    warning = _one_line_error(capsys.readouterr().err, "raysim: warning:")
    assert f"cannot lock {tmp_path / 'run' / '.raysim.lock'} (No locks available)" in warning, warning
    assert [r["round"] for r in read_rows(tmp_path / "run")] == [1, 2]


def test_sweeps_and_seed_sets_are_refused_while_their_directory_is_in_use(tmp_path, capsys):
    from raysim.tune.sweepdir import _check_sweep_dir

    sweep, out = _sweep_file(tmp_path), tmp_path / "sw"
    out.mkdir()
    with DirLock(out):
        assert main(["tune", str(sweep), f"dir={out}"]) == 2
        assert "is in use by another raysim process" in _one_line_error(capsys.readouterr().err, "raysim: error:")
        _check_sweep_dir(load_sweep(sweep), out, resume=False)  # the sweep's record and sweep.yaml, as a sweep starts
        assert main(["tune", "--resume", str(out)]) == 2
        assert "is in use by another raysim process" in _one_line_error(capsys.readouterr().err, "raysim: error:")
        assert main(["run", str(tmp_path / "exp.yaml"), "--seeds", "0,1", f"log.dir={out}"]) == 2
        assert "is in use by another raysim process" in _one_line_error(capsys.readouterr().err, "raysim: error:")
    assert not (out / "tune").exists()


def _wait_for(proc: subprocess.Popen, text: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line.split():
            return
    raise AssertionError(f"never saw {text!r}:\n" + "".join(seen[-30:]))
