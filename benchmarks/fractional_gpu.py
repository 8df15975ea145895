"""Fractional-GPU packing: 1, 2, 4 and 8 raysim workers per GPU, determinism on and off, ResNet-18 clients.

    .venv/bin/python benchmarks/fractional_gpu.py [--per-gpu 1,2,4,8] [--determinism on,off] [--gpus N]
        [--vectorize off,auto]
    .venv/bin/python benchmarks/fractional_gpu.py --smoke --no-wait     # the wiring on a CPU, small CNN, no GPU asked

For a machine with CUDA GPUs: with k workers per GPU each worker holds 1/k GPU (``engine.gpus_per_worker``) and
``--cpus-per-worker`` CPUs, the same for every k, so only the packing changes. The workload is FedAvg with ResNet-18
(small-input stem) on 32x32 MNIST-M, ``--clients`` clients, all sampled every round, each with about
5,000 / clients training images and ``--local-epochs`` local epochs: an update is tens of optimiser steps, so the
clients' computation, not the driver's aggregation (summed where the clients trained, ``engine.partial_sums``), sets
the round time. Each packing runs with ``engine.deterministic`` true and false, and with each ``--vectorize``
setting (``engine.vectorize``: off, auto or a stack size N): one client at a time against stacks, K
clients' step one kernel launch instead of K (the stack size auto chose is reported).

Reported per (k, determinism): client updates per second (clients per round / median round time over rounds 2..R-1;
round 1 starts the workers, the last one also evaluates), the GPUs' mean utilisation while those rounds ran
(``nvidia-smi --query-gpu``, sampled every 0.5 s; device-level, so it works in containers), and each worker's peak
memory as its own process saw it (``torch.cuda.max_memory_reserved()``, read inside the worker). The script asserts
that every worker reports ``cuda``: a worker that silently trained on the CPU would make the figures meaningless.
Without a GPU it refuses with one line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, fmt, machine_info, save_json, start_ray, summary, wait_quiet  # noqa: E402


def nvidia_smi(query: str) -> list[list[str]]:
    """Rows of ``nvidia-smi --query-gpu=QUERY`` (one per GPU), [] where nvidia-smi is not there."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[s.strip() for s in line.split(",")] for line in out.splitlines() if line.strip()]


class Utilisation:
    """The GPUs' utilisation (%) sampled in a thread while ``on`` is set; ``mean()`` over the samples taken."""

    def __init__(self, gpus: int, period_s: float = 0.5):
        self.gpus, self.period_s = gpus, period_s
        self.on = threading.Event()
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.on.is_set():
                rows = nvidia_smi("utilization.gpu")[:self.gpus]
                try:
                    self.samples.append(statistics.mean(float(r[0]) for r in rows))
                except (ValueError, IndexError, statistics.StatisticsError):
                    pass
            self._stop.wait(self.period_s)

    def mean(self) -> Optional[float]:
        return statistics.mean(self.samples) if self.samples else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def one_run(per_gpu: int, deterministic: bool, vectorize: str, args: argparse.Namespace) -> dict[str, Any]:
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    workers = per_gpu * args.gpus
    share = 0 if args.smoke else 1 / per_gpu
    name = f"fractional-gpu-{per_gpu}-{'det' if deterministic else 'fast'}-vectorize-{vectorize}"
    run_dir = OUT / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(None, [
        f"name={name}", "seed=0", f"rounds={args.rounds}", f"clients.num={args.clients}", "clients.fraction=1.0",
        "data.name=mnistm", "data.partition=iid", f"model.name={args.model}", "train.lr=0.05",
        f"train.batch_size={args.batch_size}", f"train.local_epochs={args.local_epochs}", f"eval.every={args.rounds}",
        "eval.clients=sampled", "engine.backend=ray", f"engine.num_workers={workers}",
        f"engine.cpus_per_worker={args.cpus_per_worker}", f"engine.gpus_per_worker={share:g}",
        f"engine.deterministic={str(deterministic).lower()}", f"engine.vectorize={vectorize}",
        f"log.dir={run_dir}", "log.tensorboard=false",
        "log.progress=false"])
    probe: dict[str, Any] = {"stamps": [], "info": [], "stack": 1}
    util = Utilisation(args.gpus)

    def on_start(info: dict) -> None:
        probe["control"] = info["control"]
        winfo = info["control"].worker_info()
        devices = sorted({w["device"] for w in winfo})
        if not args.smoke and devices != ["cuda"]:
            raise SystemExit(f"fractional_gpu: the workers report {devices}, not cuda: these figures would not be "
                             f"GPU figures")
        probe["devices"] = devices
        probe["stamps"].append(time.perf_counter())

    def on_round(m: dict) -> None:
        probe["stamps"].append(time.perf_counter())
        # clients per stack (1: one at a time): the run's choice, which the metrics rows no longer carry
        probe["stack"] = probe["control"].vectorize_choice()[0] or 1
        # rounds 2..R-1 are the timed ones: utilisation is sampled while they run
        if m["round"] == 1:
            util.on.set()
        elif m["round"] == args.rounds - 1:
            util.on.clear()
        probe["info"] = probe["control"].worker_info()  # between rounds, so the workers answer at once

    try:
        run_experiment(cfg, on_start=on_start, on_round=on_round)
    finally:
        util.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    st = probe["stamps"]
    periods = [b - a for a, b in zip(st, st[1:])]
    body = periods[1:-1] or periods[1:] or periods  # round 1 starts the workers, the last also evaluates
    round_s = statistics.median(body)
    return {"per_gpu": per_gpu, "deterministic": deterministic, "vectorize": vectorize, "stack": probe["stack"],
            "workers": workers, "gpu_share": share,
            "cpus_per_worker": args.cpus_per_worker, "devices": probe["devices"], "round_s": round_s,
            "updates_per_s": args.clients / round_s, "round1_s": periods[0], "gpu_util_pct": util.mean(),
            "gpu_mib_per_worker": [w.get("gpu_max_reserved_mib", float("nan")) for w in probe["info"]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-gpu", default=None, help="workers per GPU, one run each (default 1,2,4,8; 1,2 with --smoke)")
    p.add_argument("--determinism", default="on,off", help="engine.deterministic settings, one run each")
    p.add_argument("--vectorize", default="off,auto", help="engine.vectorize settings, one run each (off, auto, N)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: every visible one)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--local-epochs", type=int, default=10)
    p.add_argument("--model", default=None, help="default: resnet18 (cnn with --smoke)")
    p.add_argument("--cpus-per-worker", type=int, default=1, help="the same for every packing")
    p.add_argument("--smoke", action="store_true",
                   help="on the CPU, no GPU asked: a small CNN, 1 and 2 workers, 3 rounds (checks the script only)")
    p.add_argument("--no-wait", action="store_true")
    args = p.parse_args(argv)
    import torch

    if args.smoke:
        args.model = args.model or "cnn"
        args.gpus, args.rounds, args.repeats, args.local_epochs, args.clients = 1, 3, 1, 1, 8
        args.per_gpu = args.per_gpu or "1,2"
    else:
        args.model = args.model or "resnet18"
        args.per_gpu = args.per_gpu or "1,2,4,8"
        if not torch.cuda.is_available():
            print("fractional_gpu: no CUDA GPU visible (torch.cuda.is_available() is False); run it on a GPU machine "
                  "(or pass --smoke to check the script on the CPU)", file=sys.stderr)
            return 2
        args.gpus = args.gpus or torch.cuda.device_count()
    per_gpu = [int(k) for k in args.per_gpu.split(",") if k]
    determinism = [{"on": True, "off": False}[d] for d in args.determinism.split(",") if d]
    vectorize = [v for v in args.vectorize.split(",") if v]
    need = max(per_gpu) * args.gpus * args.cpus_per_worker
    cpus = os.cpu_count() or 2
    if need > cpus:
        print(f"fractional_gpu: {max(per_gpu)} workers per GPU x {args.gpus} GPUs x {args.cpus_per_worker} CPU = "
              f"{need} CPUs, but this machine has {cpus}; lower --per-gpu or --cpus-per-worker", file=sys.stderr)
        return 2
    info = machine_info() | {"gpus": nvidia_smi("name,memory.total")[:args.gpus] if not args.smoke else "none"}
    print(f"[fractional_gpu] {info}", flush=True)
    start_ray(num_cpus=cpus)
    import ray

    runs: dict[tuple[int, bool, str], list[dict]] = {(k, d, v): [] for k in per_gpu for d in determinism
                                                      for v in vectorize}
    try:
        for rep in range(args.repeats):
            wait_quiet(enabled=not args.no_wait and not args.smoke)
            for (k, d, v) in runs:
                r = one_run(k, d, v, args)
                runs[(k, d, v)].append(r)
                util = f"{r['gpu_util_pct']:.0f}%" if r["gpu_util_pct"] is not None else "n/a"
                print(f"[fractional_gpu] rep {rep} {k} per GPU x {args.gpus} GPU, deterministic={d}, vectorize={v} "
                      f"(stacks of {r['stack']}): "
                      f"{r['updates_per_s']:.2f} updates/s, GPU utilisation {util}, peak MiB per worker "
                      f"{[f'{m:.0f}' for m in r['gpu_mib_per_worker']]}", flush=True)
    finally:
        ray.shutdown()
    result: dict[str, Any] = {"machine": info, "args": vars(args), "runs": {}}
    for (k, d, v), rs in runs.items():
        utils = [r["gpu_util_pct"] for r in rs if r["gpu_util_pct"] is not None]
        result["runs"][f"{k}-per-gpu-{'det' if d else 'fast'}-vectorize-{v}"] = {
            "per_gpu": k, "deterministic": d, "vectorize": v, "stack": [r["stack"] for r in rs],
            "workers": rs[0]["workers"], "cpus_per_worker": args.cpus_per_worker,
            "updates_per_s": summary(r["updates_per_s"] for r in rs),
            "gpu_util_pct": summary(utils) if utils else None,
            "gpu_mib_per_worker": summary(m for r in rs for m in r["gpu_mib_per_worker"]), "runs": rs}
    path = save_json("fractional_gpu" + ("-smoke" if args.smoke else ""), result)
    print(f"\n[fractional_gpu] results in {path}")
    for e in result["runs"].values():
        util = fmt(e["gpu_util_pct"], 1, 0) + " %" if e["gpu_util_pct"] else "n/a"
        print(f"{e['per_gpu']} per GPU ({e['workers']} workers), deterministic={e['deterministic']}, vectorize="
              f"{e['vectorize']} (stacks of {e['stack']}): "
              f"{fmt(e['updates_per_s'], 1, 2)} client updates/s, GPU utilisation {util}, peak memory per worker "
              f"{fmt(e['gpu_mib_per_worker'], 1, 0)} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
