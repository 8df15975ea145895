"""Fractional-GPU packing: raysim workers at 1, 0.5, 0.25 and 0.125 GPU each on one GPU, ResNet-18 clients.

    .venv/bin/python benchmarks/fractional_gpu.py [--fractions 1,0.5,0.25,0.125] [--clients 64] [--rounds 4]

For a machine with a CUDA GPU: with fraction f, 1/f workers share the one GPU (``engine.gpus_per_worker=f``). The
workload is FedAvg with ResNet-18 (``model.name=resnet18``, small-input stem) on 32x32 MNIST-M clients (iid, every
client sampled each round, 1 local epoch). Reported per fraction: client updates per second (clients per round /
median round period over rounds 2..R) and GPU memory per worker (nvidia-smi's per-process figure, peak over rounds).
Without a GPU it refuses with one line and exit code 2; ``--smoke`` runs the same wiring on the CPU with a small
CNN and no GPU request, to check the script itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, fmt, machine_info, save_json, start_ray, summary, wait_quiet  # noqa: E402


def gpu_memory_by_pid() -> dict[int, float]:
    """MiB of GPU memory per process, as the driver accounts it (includes each process's CUDA context)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    usage: dict[int, float] = {}
    for line in out.splitlines():
        parts = [s.strip() for s in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                usage[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    return usage


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def one_run(fraction: float, args: argparse.Namespace) -> dict[str, Any]:

    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    workers = max(1, round(1 / fraction))
    cpus = max(1, min(args.max_cpus_per_worker, (os.cpu_count() or 2) // workers))
    run_dir = OUT / f"fractional-gpu-{fraction:g}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(None, [
        f"name=fractional-gpu-{fraction:g}", "seed=0", f"rounds={args.rounds}", f"clients.num={args.clients}",
        "clients.fraction=1.0", "data.name=mnistm", "data.partition=iid", f"model.name={args.model}",
        "train.lr=0.05", f"train.batch_size={args.batch_size}", "train.local_epochs=1", f"eval.every={args.rounds}",
        "eval.clients=sampled", f"engine.num_workers={workers}", f"engine.cpus_per_worker={cpus}",
        f"engine.gpus_per_worker={0 if args.smoke else fraction}", f"log.dir={run_dir}", "log.tensorboard=false"])
    probe: dict[str, Any] = {"stamps": [], "gpu_mib": {}}

    def on_start(info: dict) -> None:
        probe["stamps"].append(time.perf_counter())
        winfo = info["control"].worker_info()
        probe["pids"] = [w["pid"] for w in winfo]
        probe["devices"] = sorted({w["device"] for w in winfo})

    def on_round(m: dict) -> None:
        probe["stamps"].append(time.perf_counter())
        usage = gpu_memory_by_pid()
        for pid in probe["pids"]:
            if pid in usage:
                probe["gpu_mib"][pid] = max(probe["gpu_mib"].get(pid, 0.0), usage[pid])

    run_experiment(cfg, on_start=on_start, on_round=on_round)
    shutil.rmtree(run_dir, ignore_errors=True)
    st = probe["stamps"]
    periods = [b - a for a, b in zip(st, st[1:])]
    body = periods[1:-1] or periods[1:] or periods  # round 1 starts workers, the last also evaluates
    round_s = statistics.median(body)
    return {"fraction": fraction, "workers": workers, "cpus_per_worker": cpus, "devices": probe["devices"],
            "round_s": round_s, "updates_per_s": args.clients / round_s, "round1_s": periods[0],
            "gpu_mib_per_worker": [probe["gpu_mib"].get(p, float("nan")) for p in probe["pids"]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fractions", default="1,0.5,0.25,0.125")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--max-cpus-per-worker", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="CPU only, no GPU request: checks the script's wiring")
    p.add_argument("--no-wait", action="store_true")
    args = p.parse_args(argv)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("fractional_gpu: no CUDA GPU visible (torch.cuda.is_available() is False); run it on a GPU machine "
              "(or pass --smoke to check the script on the CPU)", file=sys.stderr)
        return 2
    fractions = [float(f) for f in args.fractions.split(",") if f]
    info = machine_info() | {"gpu": gpu_name() if not args.smoke else "none (--smoke)"}
    print(f"[fractional_gpu] {info}", flush=True)
    start_ray(num_cpus=os.cpu_count() or 2)
    import ray

    result: dict[str, Any] = {"machine": info, "args": vars(args), "fractions": {}}
    try:
        runs: dict[float, list[dict]] = {f: [] for f in fractions}
        for rep in range(args.repeats):
            wait_quiet(enabled=not args.no_wait and not args.smoke)
            for f in fractions:
                r = one_run(f, args)
                runs[f].append(r)
                print(f"[fractional_gpu] rep {rep} {f:g} GPU x {r['workers']} workers: {r['updates_per_s']:.1f} "
                      f"updates/s, GPU MiB per worker {[f'{m:.0f}' for m in r['gpu_mib_per_worker']]}", flush=True)
    finally:
        ray.shutdown()
    for f, rs in runs.items():
        result["fractions"][f] = {"workers": rs[0]["workers"], "cpus_per_worker": rs[0]["cpus_per_worker"],
                                  "updates_per_s": summary(r["updates_per_s"] for r in rs),
                                  "gpu_mib_per_worker": summary(m for r in rs for m in r["gpu_mib_per_worker"]),
                                  "runs": rs}
    path = save_json("fractional_gpu" + ("-smoke" if args.smoke else ""), result)
    print(f"\n[fractional_gpu] results in {path}")
    for f, e in result["fractions"].items():
        print(f"{f:g} GPU/worker x {e['workers']}: {fmt(e['updates_per_s'], 1, 1)} client updates/s, GPU memory per "
              f"worker {fmt(e['gpu_mib_per_worker'], 1, 0)} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
