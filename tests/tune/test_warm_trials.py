"""Trials and seeds at the machine's throughput (issue 57): a one-worker trial runs in its own Tune process, which Tune
reuses for the next trial; a seed set runs its seeds in a few processes at once. Whatever ran before in a process,
every run's numbers are those of the same config run alone in a fresh ``raysim run``."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from conftest import ROOT, TINY, read_rows, strip_timing
from raysim.cli import main
from test_tune import write_sweep


def _fresh_run(run_dir: Path, out: Path) -> list[dict]:
    """``raysim run`` of a trial's config in a fresh interpreter (in process), the reference for warm runs."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests" / "plugins"),
                                                                    os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(run_dir / "config.yaml"), f"log.dir={out}",
                    "engine.backend=inline", "--quiet"], check=True, cwd=ROOT, env=env, capture_output=True)
    return strip_timing(read_rows(out))


def _trial_pids(sweep_dir: Path) -> dict[str, set[int]]:
    """Each trial's process ids, from the results Tune recorded (``pid`` in every result.json row)."""
    return {d.name: {json.loads(line)["pid"] for line in (d / "result.json").read_text().splitlines()}
            for d in (sweep_dir / "tune").iterdir() if (d / "result.json").is_file()}


def _actors(class_name: str) -> list[dict]:
    """The session Ray's actors of ``class_name`` (Tune's trials: ``ImplicitFunc``), ended ones included."""
    import ray

    return [a for a in ray._private.state.actors().values()
            if str(a.get("ActorClassName")).rpartition(".")[2] == class_name]


def test_two_trials_in_one_reused_process_equal_fresh_runs(ray_cluster, tmp_path):
    """One trial at a time: Tune hands the second trial the first one's process, where both runs ran whole (no
    ClientWorker was started); the second reused the first's dataset (same data config). Each trial's rows equal
    a fresh ``raysim run`` of its config."""
    workers_before = len(_actors("ClientWorker"))
    sweep = write_sweep(tmp_path, max_concurrent=1, space={"train.lr": {"grid": [0.3, 0.02]}})
    out = tmp_path / "sw"
    assert main(["tune", str(sweep), f"dir={out}", "--quiet"]) == 0
    assert len(_actors("ClientWorker")) == workers_before  # both runs in their trial's own process
    pids = _trial_pids(out)
    assert len(pids) == 2 and len(set.union(*pids.values())) == 1, pids  # one process ran both trials
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert all(r["status"] == "done" for r in rows)
    for r in rows:
        run_dir = Path(r["run_dir"])
        assert strip_timing(read_rows(run_dir)) == _fresh_run(run_dir, tmp_path / "fresh" / run_dir.name), r


def test_a_trial_whose_process_dies_is_restarted_from_its_checkpoint(ray_cluster, tmp_path):
    """The trial's process is its run's only worker: killed in round 2 (SIGKILL, as the OOM killer would), Tune
    restarts the trial in another process, which continues from round 1's checkpoint to an undisturbed run's
    numbers."""
    gate, reached = tmp_path / "go", tmp_path / "held"
    sweep = write_sweep(tmp_path, space={"train.lr": {"grid": [0.3]}},
                        fixed={"plugins": ["held"], "algorithm.name": "held_fedavg", "algorithm.hold_round": 2,
                               "algorithm.hold_until": str(gate), "algorithm.hold_reached": str(reached)})
    out, code = tmp_path / "sw", []
    sweep_thread = threading.Thread(target=lambda: code.append(main(["tune", str(sweep), f"dir={out}", "rounds=3",
                                                                     "--quiet"])))
    sweep_thread.start()
    try:
        deadline = time.monotonic() + 120
        while not reached.exists() and time.monotonic() < deadline and sweep_thread.is_alive():
            time.sleep(0.05)
        assert reached.exists(), "the trial never reached its held round"
        trial = [a for a in _actors("ImplicitFunc") if a["State"] == "ALIVE"]
        assert len(trial) == 1, trial
        os.kill(trial[0]["Pid"], signal.SIGKILL)
    finally:
        gate.touch()
        sweep_thread.join(300)
    assert code == [0]
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["status"], r["rounds"]) for r in rows] == [("done", "3/3")]
    assert [p.read_text().count("Failure #") for p in (out / "tune").glob("*/error.txt")] == [1]  # restarted once
    run_dir = Path(rows[0]["run_dir"])
    assert strip_timing(read_rows(run_dir)) == _fresh_run(run_dir, tmp_path / "fresh")


def _two_cores_no_ray(monkeypatch) -> None:
    """This process sees two cores and no Ray (the session's, started by an earlier test, would send a seed set
    whose runs resolve to Ray to Tune)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("raysim.engine.backend.ray_initialized", lambda: False)


def test_seeds_run_at_once_in_this_process_and_a_helper(shared_run, tmp_path, capsys, monkeypatch):
    """In process (engine.backend auto on one machine), two cores: this process and one helper share three seeds,
    the helper taking one at least (this process waits for that here); each seed's run is the one `raysim run`
    makes alone."""
    from raysim.tune import seedpool

    _two_cores_no_ray(monkeypatch)
    handed = _helper_goes_first(monkeypatch, seedpool)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    parent = tmp_path / "seeds"
    assert main(["run", str(tmp_path / "exp.yaml"), "--seeds", "0-2", f"log.dir={parent}", "rounds=3"]) == 0
    assert handed  # a helper ran a seed
    printed = capsys.readouterr().out
    assert "3 seeds" in printed and "2 at once (this process and 1 more)" in printed
    assert "3/3 seeds done" in printed and "[seed 2] round 3/3" in printed
    rows = list(csv.DictReader(open(parent / "results.csv")))
    assert sorted((r["seed"], r["status"], r["rounds"]) for r in rows) == [(s, "done", "3/3") for s in "012"]
    for seed in (0, 1, 2):
        plain = shared_run(name=TINY["name"], seed=seed, rounds=3)[1]
        assert strip_timing(read_rows(parent / f"seed-{seed}")) == strip_timing(plain), seed


def _helper_goes_first(monkeypatch, seedpool, kill: bool = False) -> list[int]:
    """This process runs its first seed only once a helper has been handed one (``kill``: and killed at once);
    returns the seeds handed to helpers."""
    handed: list[int] = []
    first = threading.Event()
    run, own = seedpool._SeedProcess.run, seedpool.run_one_seed

    def hand(self, seed):
        run(self, seed)
        handed.append(seed)
        if kill and not first.is_set():
            self.proc.kill()
        first.set()

    def after_a_helper(*args, **kwargs):
        assert first.wait(120), "no helper was handed a seed"
        return own(*args, **kwargs)

    monkeypatch.setattr(seedpool._SeedProcess, "run", hand)
    monkeypatch.setattr(seedpool, "run_one_seed", after_a_helper)
    monkeypatch.setattr(seedpool, "HELPER_WORTH", 0)  # helpers at once, whatever this process's pace
    return handed


def test_a_seed_whose_process_fails_or_dies_is_recorded_and_the_others_run(tmp_path, capsys, monkeypatch):
    """A seed failing in a helper records its cause as in process; a helper that dies mid-seed fails that seed
    with a one-line cause, and the seeds left run."""
    from raysim.tune import seedpool

    _two_cores_no_ray(monkeypatch)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    parent = tmp_path / "seeds"
    assert main(["run", str(tmp_path / "exp.yaml"), "--seeds", "0,1", f"log.dir={parent}", "plugins=[fail_round2]",
                 "algorithm.name=fail_round2", "--quiet"]) == 1
    cause = "RuntimeError: deliberate failure in round 2 | for the test"
    assert "2 seeds failed" in capsys.readouterr().err
    rows = list(csv.DictReader(open(parent / "results.csv")))
    assert sorted((r["seed"], r["status"], r["rounds"]) for r in rows) == [(s, f"error: {cause}", "1/2") for s in "01"]

    handed = _helper_goes_first(monkeypatch, seedpool, kill=True)
    parent = tmp_path / "dying"
    assert main(["run", str(tmp_path / "exp.yaml"), "--seeds", "0-2", f"log.dir={parent}", "--quiet"]) == 1
    rows = {int(r["seed"]): r["status"] for r in csv.DictReader(open(parent / "results.csv"))}
    assert rows.pop(handed[0]) == "error: RuntimeError: the process running it was killed (SIGKILL)"
    assert list(rows.values()) == ["done", "done"], rows


def test_helpers_start_only_when_the_work_left_is_worth_their_start(tmp_path, capsys, monkeypatch):
    """Helpers cost a process start (torch, raysim: what this process paid before its first run). Worked by hand,
    with HELPER_WORTH = 1.5 and a start of 2 s (so the work left must exceed 3 s): 3 smoke-sized seeds waiting at
    0.1 s a round, 3 rounds each, 2 rounds left here: 0.1 x (2 + 9) = 1.1 s, not worth it; 60 s runs of 20 rounds at
    3 s a round, one waiting, 19 rounds left here: 3 x (19 + 20) = 117 s, worth it; no seed waiting: never."""
    from raysim.tune.seedpool import HELPER_WORTH, helpers_worth_it

    assert HELPER_WORTH == 1.5
    assert not helpers_worth_it(2.0, 0.1, 2, 3, 3)
    assert helpers_worth_it(2.0, 3.0, 19, 1, 20)
    assert not helpers_worth_it(2.0, 3.0, 19, 0, 20)
    assert not helpers_worth_it(2.0, 0.25, 1, 1, 3)  # 0.25 x (1 + 3) = 1.0 s
    assert helpers_worth_it(2.0, 0.5, 1, 2, 3)  # 0.5 x (1 + 6) = 3.5 s

    # a tiny seed set: its runs are over before a helper would have started, so none starts
    from raysim.tune import seedpool

    started = []
    monkeypatch.setattr(seedpool._SeedProcess, "__init__", lambda self, setup: started.append(setup))
    _two_cores_no_ray(monkeypatch)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY))
    assert main(["run", str(tmp_path / "exp.yaml"), "--seeds", "0,1", f"log.dir={tmp_path / 's'}", "--quiet"]) == 0
    assert started == [] and "2/2 seeds done" in capsys.readouterr().out
