"""GPU readiness, proven on a CPU machine: fake GPUs (``ray.init(num_gpus=2)``, tests/fake_gpu_cluster.py in a
process of its own, with CUDA_VISIBLE_DEVICES set before Ray starts), and torch.cuda monkeypatched where the point
is which calls the engine makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_overrides
from raysim.config import load_config
from raysim.engine.runner import run_experiment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake_gpus(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fake-gpus") / "found.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR", "CUDA_VISIBLE_DEVICES")}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fake_gpu_cluster.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=420, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _ours(err: str) -> list[str]:
    """raysim's stderr lines (Ray's own processes may add theirs, such as a full-disk warning of the raylet)."""
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("raysim:")]


@pytest.mark.slow
def test_a_gpu_share_that_cannot_use_cuda_is_one_line_naming_the_node_and_cause(fake_gpus):
    share = fake_gpus["share"]
    lines = _ours(share["err"])
    assert share["code"] == 2 and len(lines) == 1, share["err"]
    err = lines[0]
    assert err.startswith("raysim: error: config key 'engine.gpus_per_worker': a worker on "), err
    assert "(127.0.0.1) holds 0.5 GPU (GPU 0 of its node) but cannot use CUDA: " in err, err
    assert "NVIDIA driver" in err, err  # CUDA's own words for the cause on this machine
    assert not share["run_dir_left"]  # nothing half-written


@pytest.mark.slow
def test_the_driver_never_touches_a_visible_gpu_and_central_training_runs_on_a_worker(fake_gpus):
    """CUDA is visible to the driver (CUDA_VISIBLE_DEVICES=0,1 from before Ray started, torch says available) and
    any CUDA initialisation there raises; FAPD's teacher and a probe still train, as jobs in a worker's process, on
    its device (the CPU: the worker holds no GPU share)."""
    found = fake_gpus
    assert found["driver_cuda_visible"] == "0,1"
    rows, workers = found["central"]["rows"], found["central"]["workers"]
    assert [r["round"] for r in rows] == [1] and rows[0]["acc_mean"] is not None
    row = rows[0]
    assert row["driver_pid"] == found["driver_pid"] and row["central_pid"] != found["driver_pid"]
    assert row["central_pid"] in [w["pid"] for w in workers]
    assert row["central_cuda"] == 0 and row["central_gpu_ids"] == 0 and workers[0]["device"] == "cpu"


@pytest.mark.slow
def test_gpu_shares_that_do_not_pack_are_refused_before_any_worker_starts(fake_gpus):
    pack = fake_gpus["pack"]
    lines = _ours(pack["err"])
    assert pack["code"] == 2 and len(lines) == 1, pack["err"]
    err = lines[0]
    assert err.startswith("raysim: error: config key 'engine.gpus_per_worker': 5 workers x 0.4 GPU do not fit: a "
                          "share must sit on one GPU, so each GPU takes 2"), err


def test_in_process_central_training_runs_in_this_process(tmp_path):
    """On the in-process executor the central job runs here, on its device (the CPU)."""
    sys.path.insert(0, str(ROOT / "tests" / "plugins"))
    cfg = load_config(None, tiny_overrides(tmp_path, plugins="[central_probe]", algorithm__name="central_probe",
                                           algorithm__teacher__epochs=1, rounds=1, engine__backend="inline",
                                           algorithm__teacher__cache_dir=str(tmp_path / "cache"),
                                           log__tensorboard="false"))
    row = run_experiment(cfg)[1][0]
    assert row["central_pid"] == row["driver_pid"] == os.getpid() and row["central_cuda"] == 0
    assert row["central_gpu_ids"] in (-1, 0)


def _cli(args: list[str]) -> tuple[int, list[str]]:
    """``raysim run ARGS`` through the CLI's entry point, in this process: (exit code, raysim's stderr lines)."""
    import contextlib
    import io

    from raysim.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.chdir(ROOT):
        code = main(["run", *args])
    return code, _ours(err.getvalue())


def _oom_run(tmp_path: Path, name: str, **extra) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests" / "plugins"))
    return tiny_overrides(tmp_path / name, plugins="[oom]", algorithm__name="oom", rounds=3, log__tensorboard="false",
                          log__progress="false", **extra)


def _stopped_by_oom(code: int, lines: list[str], rnd: int, run_dir: Path) -> None:
    from raysim.engine.state import read_checkpoint

    assert code == 3 and len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("raysim: stopped: out of memory in client ") and f"'s training in round {rnd} on " in line
    assert ": CUDA out of memory. Tried to allocate 2.00 GiB; try fewer workers per machine (engine.num_workers, " \
           "now 1) or a smaller evaluation chunk (eval.chunk=256 instead of 1024)" in line
    assert line.endswith(f"; resume with: raysim run --resume {run_dir}"), line
    assert read_checkpoint(run_dir)["round"] == rnd - 1


def test_out_of_memory_in_round_2_is_one_line_with_a_hint_and_round_1_checkpointed(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSIM_TEST_OOM_ROUND", "2")
    code, lines = _cli(_oom_run(tmp_path, "inline", engine__backend="inline"))
    _stopped_by_oom(code, lines, 2, tmp_path / "inline" / "run")
    assert "on this process on " in lines[0]


@pytest.mark.slow
def test_out_of_memory_on_a_worker_crosses_ray_as_the_same_line(ray_cluster, tmp_path):
    code, lines = _cli(_oom_run(tmp_path, "ray", engine__backend="ray"))  # the workers' default: round 2
    _stopped_by_oom(code, lines, 2, tmp_path / "ray" / "run")
    assert " on worker pid " in lines[0] and "(cpu): CUDA out of memory" in lines[0]


def test_out_of_memory_in_round_1_keeps_the_run_to_resume(tmp_path, monkeypatch):
    """Nothing completed, yet the run is kept with a round-0 checkpoint: resumed with the hint's smaller evaluation
    chunk (and here without the shortage) it ends with the metrics of a run never interrupted."""
    monkeypatch.setenv("RAYSIM_TEST_OOM_ROUND", "1")
    code, lines = _cli(_oom_run(tmp_path, "short", engine__backend="inline"))
    _stopped_by_oom(code, lines, 1, tmp_path / "short" / "run")
    monkeypatch.setenv("RAYSIM_TEST_OOM_ROUND", "0")
    assert _cli(["--resume", str(tmp_path / "short" / "run"), "eval.chunk=256"])[0] == 0  # as the hint says
    assert _cli(_oom_run(tmp_path, "whole", engine__backend="inline"))[0] == 0
    from conftest import read_rows, strip_timing

    assert strip_timing(read_rows(tmp_path / "short" / "run")) == strip_timing(read_rows(tmp_path / "whole" / "run"))


def test_the_hint_names_a_larger_gpu_share_and_a_smaller_chunk():
    from types import SimpleNamespace

    import torch

    from raysim.engine.device import out_of_memory_message

    engine = SimpleNamespace(gpus_per_worker=0.25, num_workers=8)
    msg = out_of_memory_message(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB. GPU 0 ..."),
                                "the evaluation of clients [3] after round 4", "worker pid 7 on n1 (cuda)", engine, 512)
    assert msg == ("out of memory in the evaluation of clients [3] after round 4 on worker pid 7 on n1 (cuda): CUDA "
                   "out of memory. Tried to allocate 1 GiB; try fewer workers per GPU (engine.gpus_per_worker=0.5 "
                   "instead of 0.25) or a smaller evaluation chunk (eval.chunk=128 instead of 512)")


def test_a_gpu_process_is_made_deterministic_and_capped_at_its_share(monkeypatch):
    """configure() on a CUDA device (torch.cuda's memory cap recorded, not called: there is no GPU here): cuDNN's
    deterministic algorithms without benchmarking, torch's deterministic algorithms, cuBLAS's fixed workspace, no
    TF32, the process's memory capped at its share; restore() gives the process its settings back; with
    engine.deterministic=false the opposite, and a CPU process is left alone."""
    import torch

    from raysim.engine.device import configure, restore

    caps: list = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: caps.append((f, d)))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert configure(torch.device("cpu"), True, 0.25) == {} and not torch.are_deterministic_algorithms_enabled()
    before = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    previous = configure(torch.device("cuda"), True, 0.25)
    try:
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "ieee"
        assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and caps == [(0.25, 0)]
    finally:
        restore(previous)
    assert not torch.are_deterministic_algorithms_enabled()
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
            torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    previous = configure(torch.device("cuda"), False, 1.0)
    try:
        assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
        assert torch.backends.cuda.matmul.fp32_precision == "tf32" and caps == [(0.25, 0)]  # a whole GPU: no cap
    finally:
        restore(previous)


def test_why_cuda_is_unusable_here_in_cudas_words():
    from raysim.engine.device import cuda_unusable

    cause = cuda_unusable()  # this machine has no GPU (a CUDA build of torch, no driver)
    assert cause is not None and cause.count("\n") == 0 and ("NVIDIA driver" in cause or "without CUDA" in cause)


def test_an_operation_without_a_deterministic_kernel_is_one_line_naming_the_key():
    from raysim.engine.device import job_guard
    from raysim.errors import UserError

    cfg = load_config(None, [])
    with pytest.raises(UserError, match=r"^config key 'engine.deterministic': in client 3's training in round 1 on "
                                        r"worker pid 9 on n1 \(cuda\): upsample_bilinear2d_backward_out_cuda does not "
                                        r"have a deterministic implementation, but you set .*; set "
                                        r"engine.deterministic=false"):
        with job_guard("client 3's training in round 1", "worker pid 9 on n1 (cuda)", cfg):
            raise RuntimeError("upsample_bilinear2d_backward_out_cuda does not have a deterministic implementation, "
                               "but you set 'torch.use_deterministic_algorithms(True)'. You can turn off determinism "
                               "just for this operation...")
