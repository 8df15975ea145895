"""Fault tolerance: killed workers and exhausted retries (on Ray), a killed ``raysim run``, Ctrl-C once and twice,
NaN/Inf updates, damaged, foreign and malicious files."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch

from conftest import ROOT, read_rows, strip_timing, tiny_overrides
from held_jobs import hold, read_jobs
from helpers import KillInFlight, alive, killed_worker_matches_inline
from raysim.cli import main as cli_main
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.errors import RunStopped, find_user_error


def _cfg(tmp_path: Path, name: str, **extra):
    return load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **extra))


# ------------------------------------------------------------------------------------------- killed workers (Ray)
# Every client job of round 2 notes its (client, pid) and waits at a gate (tests/plugins/held_jobs.py), so the kill
# lands in a job that is certainly in flight; the gate opens once the worker is dead.
def test_killed_worker_changes_no_metric(ray_cluster, tmp_path):
    """FedAvg, all six clients a round, three to a Ray call: the worker is SIGKILLed in the middle of a batch, the
    batch is re-run client by client, and the metrics equal those of the run in this process."""
    killed_worker_matches_inline(tmp_path, clients__fraction=1, engine__clients_per_call=3)


def test_killed_worker_with_cohorts_changes_no_metric(ray_cluster, tmp_path):
    """engine.vectorize: the worker is SIGKILLed while its stack waits at its first client's start, the stack is
    trained again elsewhere, and 2 Ray workers give the metrics of one in-process run (stacks are fixed groups of
    the round's clients, whatever the workers)."""
    rows = killed_worker_matches_inline(tmp_path, engine__vectorize=4, clients__num=9, clients__fraction=1)
    from raysim.engine.state import read_checkpoint

    for run in ("one", "ray"):  # the stack size is kept in the checkpoint, not in the metrics (how a run ran)
        assert read_checkpoint(tmp_path / run)["vectorize"] == 4
    assert all("vectorize" not in r for r in rows)


def test_retries_exhausted_stops_with_client_and_round(ray_cluster, tmp_path):
    gate = tmp_path / "gate"
    hold(tmp_path / "r", 2, gate)
    with KillInFlight(gate) as kill, pytest.raises(BaseException) as info:
        run_experiment(_cfg(tmp_path, "r", plugins="[held_jobs]", rounds=3, engine__backend="ray",
                            engine__max_retries=0))
    assert kill.killed is not None
    stopped = find_user_error(info.value)
    assert isinstance(stopped, RunStopped), info.value
    message = str(stopped)
    assert "in round 2: worker died 1 time (engine.max_retries=0)" in message and "client" in message, message
    assert torch.load(tmp_path / "r" / "checkpoint" / "server.pt", weights_only=True)["round"] == 1
    assert [r["round"] for r in read_rows(tmp_path / "r")] == [1]


def test_setup_error_in_the_driver_frees_the_workers_it_was_given(ray_cluster, tmp_path):
    """The host creates the workers beside the driver; a driver that fails its setup must not leave them holding
    CPUs (the next run in the session would wait for ever)."""
    cfg = _cfg(tmp_path, "nodata", data__name="cifar10", data__root=str(tmp_path / "empty"), engine__num_workers=2,
               engine__backend="ray")
    with pytest.raises(BaseException) as info:
        run_experiment(cfg)
    assert "data.root" in str(find_user_error(info.value))
    assert not (tmp_path / "nodata").exists()
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


# ------------------------------------------------------------------------------------------- non-finite updates
def _all_finite(state: object) -> bool:
    if isinstance(state, torch.Tensor):
        return bool(torch.isfinite(state).all()) if state.is_floating_point() else True
    if isinstance(state, dict):
        return all(_all_finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(_all_finite(v) for v in state)
    return True


def _server_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint" / "server.pt", weights_only=True)


def test_nonfinite_update_is_skipped_and_never_aggregated(tmp_path):
    """engine.on_nonfinite=skip: client 1's NaN update in round 2 (tests/plugins/nan_algorithm.py) is dropped and
    recorded; the round is the mean of the other three, and no NaN reaches the model."""
    run_dir, rows, _ = run_experiment(_cfg(tmp_path, "skip", plugins="[nan_algorithm]", algorithm__name="nan_fedavg",
                                           rounds=3, engine__on_nonfinite="skip"))
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[1]["skipped"] == [1] and "skipped" not in rows[0] and "skipped" not in rows[2]
    assert rows[1]["bytes_up"] == rows[0]["bytes_up"] * 3 // 4
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows), [r["loss"] for r in rows]
    # the model kept learning after the dropped update (so on seeds 0-5)
    assert rows[0]["loss"] > rows[1]["loss"] > rows[2]["loss"] and rows[2]["acc_global"] > rows[0]["acc_global"]
    saved = _server_checkpoint(run_dir)
    assert saved["round"] == 3 and _all_finite(saved["server_state"])
    assert read_rows(run_dir)[1]["skipped"] == [1]


@pytest.mark.parametrize("algorithm", ["nan_fedavg", "inf_fedavg"])
def test_nonfinite_update_stops_the_cli_with_exit_3_and_the_last_good_checkpoint(tmp_path, capsys, algorithm):
    run_dir = tmp_path / "stop"
    code = cli_main(["run", *tiny_overrides(tmp_path, log__dir=str(run_dir), plugins="[nan_algorithm]",
                                            algorithm__name=algorithm, rounds=3), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith("raysim: stopped: client 1 returned a non-finite (NaN/Inf) update in round 2"), err
    assert err.endswith(f"resume with: raysim run --resume {run_dir}"), err
    saved = _server_checkpoint(run_dir)
    assert saved["round"] == 1 and _all_finite(saved["server_state"])
    assert [r["round"] for r in read_rows(run_dir)] == [1]


# ------------------------------------------------------------------------------------------- a killed or stopped CLI
def _cli(args: list[str], env: dict) -> subprocess.Popen:
    """``raysim run ARGS`` in a subprocess (``env``: the ``cli_env`` fixture)."""
    return subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


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


ALGORITHM_EXTRAS = {
    "fedavg": {},
    "unideal": {"train__local_epochs": 2},  # two local epochs, so the CLKD schedule moves within a round
    "fapd": {"algorithm__k0": 4, "algorithm__delta_k": 2, "algorithm__epsilon": 0.5, "algorithm__window": 2,
             "algorithm__teacher__epochs": 3},
    # DP-FedAvg with a calibrated noise, adaptive clipping, Poisson sampling and the audit; DP-SGD on Poisson
    # batches: their noise multiplier, clip norm, accountants and released delta come back from the checkpoint
    "dpfedavg": {"algorithm__name": "fedavg", "privacy__enabled": "true", "privacy__target_epsilon": 8,
                 "privacy__clip": 0.5, "privacy__adaptive_clip": "true", "privacy__count_noise": 1.0,
                 "privacy__sampling": "poisson", "privacy__audit_canaries": 20},
    "dpsgd": {"algorithm__name": "fedavg", "privacy__dpsgd": "true", "privacy__dpsgd_noise": 1.0},
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_EXTRAS))
def test_sigkilled_run_resumes_to_identical_metrics(shared_run, cli_env, tmp_path, algorithm):
    """``raysim run`` SIGKILLed in round 3, its jobs held at a gate (in-process: the process killed is the one that
    runs the rounds), then resumed."""
    extra = dict(rounds=4, algorithm__name=algorithm, clients__fraction=0.5, data__partition="dirichlet")
    extra.update(ALGORITHM_EXTRAS[algorithm])
    if algorithm == "fapd":
        extra["algorithm__teacher__cache_dir"] = str(tmp_path / "teacher-cache")
    full = shared_run(**extra)[1]  # the undisturbed run (FedAvg's is FedCDA's test's reference too)
    run_dir, gate = tmp_path / "killed", tmp_path / "gate"
    hold(run_dir, 3, gate)  # round 3's jobs wait, so the kill lands mid-run however fast the rounds are
    proc = _cli(tiny_overrides(tmp_path, log__dir=str(run_dir), plugins="[held_jobs]", **extra), cli_env)
    _wait_for_round(proc, 2)
    deadline = time.monotonic() + 120
    while not any(r == 3 for r, _, _ in read_jobs(gate)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(r == 3 for r, _, _ in read_jobs(gate)), "round 3 never reached the gate"
    proc.kill()
    proc.wait(timeout=60)
    assert len(read_rows(run_dir)) == 2  # killed in round 3
    Path(f"{run_dir}.hold").unlink()  # the resumed run is not held
    assert cli_main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert strip_timing(read_rows(run_dir)) == strip_timing(full)


@pytest.mark.slow
def test_sigint_checkpoints_exits_130_and_leaves_no_ray_processes(cli_env, tmp_path):
    run_dir = tmp_path / "int"
    proc = _cli(tiny_overrides(tmp_path, log__dir=str(run_dir), rounds=200, engine__backend="ray"), cli_env)
    _wait_for_round(proc, 1)
    family = _descendants(proc.pid)
    assert family, "raysim started no Ray processes?"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"raysim run --resume {run_dir}" in err
    done = _server_checkpoint(run_dir)["round"]
    assert 1 <= done < 200 and len(read_rows(run_dir)) == done
    deadline = time.monotonic() + 60  # Ray's processes end once they see their raylet go
    while [p for p in family if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in family if alive(p)]


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never appeared; stderr: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)


@pytest.mark.slow
def test_second_sigint_aborts_at_once(cli_env, tmp_path):
    """The first Ctrl-C asks to finish the round, but round 2 cannot finish: it waits for a gate that never opens
    (for up to 300 s; tests/plugins/held.py). Only the second Ctrl-C can end the run before that, and does: 130,
    with round 1 on disk."""
    run_dir, gate = tmp_path / "int", tmp_path / "never"
    proc = _cli(tiny_overrides(tmp_path, log__dir=str(run_dir), rounds=3, plugins="[held]",
                               algorithm__name="held_fedavg", algorithm__hold_round=2,
                               algorithm__hold_until=str(gate), algorithm__hold_timeout_s=300), cli_env)
    _wait_for_file(Path(f"{gate}.waiting"), proc)  # round 2 is held
    proc.send_signal(signal.SIGINT)
    _wait_for_file(Path(f"{gate}.sigints"), proc)  # the first Ctrl-C reached the run's handler: a graceful stop
    assert proc.poll() is None  # ... which cannot end a held round
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (f"raysim: interrupted: a second signal; round 1 is checkpointed; resume "
                                            f"with: raysim run --resume {run_dir}") and "Traceback" not in err, err
    assert Path(f"{gate}.sigints").read_text() == "SIGINT\nSIGINT\n"
    assert _server_checkpoint(run_dir)["round"] == 1 and [r["round"] for r in read_rows(run_dir)] == [1]


# ------------------------------------------------------------------------------------------- damaged and foreign files
class _OpensAFile:
    """Unpickling this runs code: ``open(path, "w")`` creates ``path``."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_bad_files_are_one_line_errors(shared_run, tmp_path, capsys):
    run_dir = tmp_path / "ok"
    shutil.copytree(shared_run()[0], run_dir)  # a copy of the session's tiny run: this test damages it
    # a run directory made by another config (rounds=3: a run with rounds left, so --resume has work to do)
    assert cli_main(["run", "--resume", str(run_dir), "train.lr=0.5", "rounds=3"]) == 2
    assert "train.lr=0.5 would change what the run computes" in capsys.readouterr().err  # refused before loading
    # a truncated checkpoint
    server = run_dir / "checkpoint" / "server.pt"
    whole = server.read_bytes()
    server.write_bytes(whole[:100])
    assert cli_main(["run", "--resume", str(run_dir), "rounds=3"]) == 2
    err = capsys.readouterr().err
    assert "damaged" in err and err.strip().count("\n") == 0
    # an unwritable log.dir (its parent is a file)
    (tmp_path / "file").write_text("x")
    smoke = str(ROOT / "experiments" / "smoke.yaml")
    assert cli_main(["run", smoke, f"log.dir={tmp_path / 'file' / 'run'}"]) == 2
    assert "log.dir" in capsys.readouterr().err
    # an existing run is never overwritten
    server.write_bytes(whole)
    assert cli_main(["run", smoke, f"log.dir={run_dir}"]) == 2
    assert "--resume" in capsys.readouterr().err
    # data.root where there is no data
    missing = tmp_path / "no-cifar"
    assert cli_main(["run", *tiny_overrides(tmp_path, log__dir=str(tmp_path / "cifar"), data__name="cifar10",
                                            data__root=str(missing))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raysim: error: ") and "data.root" in err and "cifar-10-batches-py" in err, err
    assert err.count("\n") == 0 and not (tmp_path / "cifar").exists()


@pytest.mark.parametrize("which", ["server", "client"])
def test_a_checkpoint_cannot_run_code(shared_run, tmp_path, capsys, which):
    """A checkpoint file that would run code when unpickled (here: create a file) is refused as damaged, and the
    code never runs: checkpoints are read with torch.load(weights_only=True)."""
    run_dir = tmp_path / "run"
    shutil.copytree(shared_run(algorithm__name="partialavg")[0], run_dir)  # partialavg keeps a state per client
    marker = tmp_path / "code-ran"
    target = run_dir / "checkpoint" / ("server.pt" if which == "server" else "clients")
    if which == "client":
        target = sorted(target.iterdir())[0]
    saved = torch.load(target, weights_only=True)
    saved[next(iter(saved))] = _OpensAFile(marker)
    torch.save(saved, target)
    assert cli_main(["run", "--resume", str(run_dir), "rounds=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "damaged" in err and str(target.name) in err and err.count("\n") == 0, err
    assert not marker.exists()
    assert [r["round"] for r in read_rows(run_dir)] == [1, 2]
