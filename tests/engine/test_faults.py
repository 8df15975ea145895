"""Fault tolerance: killed workers, a killed driver process, Ctrl-C, NaN updates, bad files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from conftest import ROOT, read_rows, strip_timing, tiny_overrides
from raysim.cli import main as cli_main
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.errors import RunStopped, find_user_error

# rounds long enough (~1 s) that a kill lands inside a round
SLOW = dict(rounds=3, clients__num=6, train__local_epochs=4, model__hidden="[256,256]", data__partition="dirichlet")


def _cfg(tmp_path: Path, name: str, **extra):
    return load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **extra))


def _without(rows: list[dict], *keys: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in keys} for r in strip_timing(rows)]


def _kill_a_worker_after_round_one(pids: list[int]):
    def on_round(metrics):
        if metrics["round"] == 1:  # the driver is already inside round 2: the streaming loop runs ahead
            os.kill(pids[0], signal.SIGKILL)
    return on_round


def _remember_worker_pids(pids: list[int]):
    def on_start(info):
        pids.extend(w["pid"] for w in info["control"].worker_info())
    return on_start


def test_killed_worker_changes_no_metric(ray_cluster, tmp_path):
    """Also with several clients per Ray call: the killed worker's batch is re-run client by client, and the
    metrics equal those of the calm run that sends one client a call."""
    _, calm, _ = run_experiment(_cfg(tmp_path, "calm", engine__num_workers=2, engine__clients_per_call=1, **SLOW))
    pids: list[int] = []
    _, hit, _ = run_experiment(_cfg(tmp_path, "hit", engine__num_workers=2, engine__clients_per_call=3, **SLOW),
                               on_start=_remember_worker_pids(pids), on_round=_kill_a_worker_after_round_one(pids))
    assert hit[-1]["workers_replaced"] >= 1
    assert _without(hit, "workers_replaced") == _without(calm, "workers_replaced")


def test_killed_worker_with_cohorts_changes_no_metric(ray_cluster, tmp_path):
    """engine.vectorize: a dead worker's cohort is trained again as the same cohort, and 2 Ray workers give the
    metrics of one in-process run (cohorts are fixed groups of the round's clients, whatever the workers)."""
    stacked = dict(SLOW, engine__vectorize=4, clients__num=9)
    _, calm, _ = run_experiment(_cfg(tmp_path, "calm", engine__backend="inline", **stacked))
    pids: list[int] = []
    _, hit, _ = run_experiment(_cfg(tmp_path, "hit", engine__num_workers=2, **stacked),
                               on_start=_remember_worker_pids(pids), on_round=_kill_a_worker_after_round_one(pids))
    assert hit[-1]["workers_replaced"] >= 1 and hit[-1]["vectorize"] == 4
    assert _without(hit, "workers_replaced") == _without(calm, "workers_replaced")


def test_retries_exhausted_stops_with_client_and_round(ray_cluster, tmp_path):
    pids: list[int] = []
    cfg = _cfg(tmp_path, "r", engine__max_retries=0, **SLOW)
    with pytest.raises(BaseException) as info:
        run_experiment(cfg, on_start=_remember_worker_pids(pids), on_round=_kill_a_worker_after_round_one(pids))
    stopped = find_user_error(info.value)
    assert isinstance(stopped, RunStopped)
    assert "round 2" in str(stopped) and "client" in str(stopped) and "max_retries" in str(stopped)
    ckpt = (tmp_path / "r" / "checkpoint" / "server.pt")
    import torch
    assert torch.load(ckpt, weights_only=True)["round"] == 1


@pytest.mark.parametrize("policy", ["skip", "stop"])
def test_nonfinite_update_is_never_aggregated(ray_cluster, tmp_path, policy):
    cfg = _cfg(tmp_path, policy, plugins="[nan_algorithm]", algorithm__name="nan_fedavg", rounds=3,
               engine__on_nonfinite=policy)
    if policy == "skip":
        _, rows, _ = run_experiment(cfg)
        assert [r["round"] for r in rows] == [1, 2, 3]
        assert rows[1]["skipped"] == [1] and "skipped" not in rows[0]
        assert all(r["acc_mean"] == r["acc_mean"] for r in rows)  # no NaN leaked into the global model
        assert rows[1]["bytes_up"] == rows[0]["bytes_up"] * 3 // 4
    else:
        with pytest.raises(BaseException) as info:
            run_experiment(cfg)
        stopped = find_user_error(info.value)
        assert isinstance(stopped, RunStopped) and "client 1" in str(stopped) and "round 2" in str(stopped)
        assert [r["round"] for r in read_rows(tmp_path / policy)] == [1]


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, **kw)


def _wait_for_round(proc: subprocess.Popen, n: int, timeout: float = 300) -> None:
    """Read the CLI's progress lines ("round  2/200  acc_mean ...") until round n is done."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        words = line.split()
        if words[:1] == ["round"] and words[1].startswith(f"{n}/"):
            return
    proc.kill()
    raise AssertionError(f"never saw round {n}; stderr: {proc.stderr.read()[-2000:]}")


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


ALGORITHM_EXTRAS = {
    "fedavg": {},
    "unideal": {"train__local_epochs": 2},  # two local epochs, so the CLKD schedule moves within a round
    "fapd": {"algorithm__k0": 4, "algorithm__delta_k": 2, "algorithm__epsilon": 0.5, "algorithm__window": 2,
             "algorithm__teacher__epochs": 3},
}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_EXTRAS))
def test_sigkilled_driver_resumes_to_identical_metrics(shared_run, tmp_path, algorithm):
    extra = dict(rounds=4, algorithm__name=algorithm, clients__fraction=0.5, data__partition="dirichlet",
                 **ALGORITHM_EXTRAS[algorithm])
    if algorithm == "fapd":
        extra["algorithm__teacher__cache_dir"] = str(tmp_path / "teacher-cache")
    full = shared_run(**extra)[1]  # the undisturbed run (FedAvg's is FedCDA's test's reference too)
    run_dir = tmp_path / "killed"
    proc = _cli(tiny_overrides(tmp_path, log__dir=str(run_dir), **extra))
    _wait_for_round(proc, 2)
    proc.kill()
    proc.wait(timeout=60)
    assert cli_main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert strip_timing(read_rows(run_dir)) == strip_timing(full)


@pytest.mark.slow
def test_sigint_checkpoints_exits_130_and_leaves_no_ray_processes(tmp_path):
    run_dir = tmp_path / "int"
    proc = _cli(tiny_overrides(tmp_path, log__dir=str(run_dir), rounds=200))
    _wait_for_round(proc, 1)
    family = _descendants(proc.pid)
    assert family, "raysim started no Ray processes?"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"raysim run --resume {run_dir}" in err
    import torch
    done = torch.load(run_dir / "checkpoint" / "server.pt", weights_only=True)["round"]
    assert 1 <= done < 200 and len(read_rows(run_dir)) == done
    time.sleep(2)
    assert not [p for p in family if _alive(p)]


def test_bad_files_are_one_line_errors(shared_run, tmp_path, capsys):
    run_dir = tmp_path / "ok"
    shutil.copytree(shared_run()[0], run_dir)  # a copy of the session's tiny run: this test damages it
    # a run directory made by another config
    assert cli_main(["run", "--resume", str(run_dir), "train.lr=0.5"]) == 2
    assert "another config" in capsys.readouterr().err
    # a truncated checkpoint
    server = run_dir / "checkpoint" / "server.pt"
    server.write_bytes(server.read_bytes()[:100])
    assert cli_main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "damaged" in err and err.strip().count("\n") == 0
    # an unwritable log.dir (its parent is a file)
    (tmp_path / "file").write_text("x")
    smoke = str(ROOT / "experiments" / "smoke.yaml")
    assert cli_main(["run", smoke, f"log.dir={tmp_path / 'file' / 'run'}"]) == 2
    assert "log.dir" in capsys.readouterr().err
    # an existing run is never overwritten
    assert cli_main(["run", smoke, f"log.dir={run_dir}"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_setup_error_in_the_driver_frees_the_workers_it_was_given(ray_cluster, tmp_path):
    """The host creates the workers beside the driver; a driver that fails its setup must not leave them holding
    CPUs (the next run in the session would wait for ever)."""
    cfg = _cfg(tmp_path, "nodata", data__name="cifar10", data__root=str(tmp_path / "empty"), engine__num_workers=2)
    with pytest.raises(BaseException) as info:
        run_experiment(cfg)
    assert "data.root" in str(find_user_error(info.value))
    assert not (tmp_path / "nodata").exists()
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2
