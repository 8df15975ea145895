"""raysim against Flower's simulation engine on the same FedAvg workloads, end to end.

    .venv/bin/python benchmarks/flower.py [--repeats 3] [--workloads mlp,cnn] [--clients 20] [--rounds 5] [--no-wait]
        [--set KEY=VALUE ...] [--out NAME]

Flower 1.42 pins ray==2.55.1 and protobuf<7, so it lives in its own virtual environment, benchmarks/.flwr-venv
(git-ignored), which this script builds on first use (``python -m venv`` + pip; a few minutes). The Flower side runs
as a subprocess in that environment (benchmarks/_flower_app.py), the raysim side as ``raysim run`` in a subprocess:
both times are from launch to exit, Ray's start included. Both get the same partition, initial weights, model,
optimiser, job seeds, rounds and clients (`--clients`, default 20, all sampled every round), 2 CPUs, 1 CPU per
client actor/worker, and evaluate the final global model once on every client's test split (raysim's ``acc_global``).
``--set KEY=VALUE`` adds a raysim override to the raysim side only (``engine.vectorize=auto``; ``engine.num_workers=1``
runs raysim in its own process), ``--out NAME`` keeps that run's figures apart (benchmarks/out/NAME.json).

Workloads: ``mlp`` (tiny: an MLP on scikit-learn's 8x8 digits, ~70 samples per client; the engines' overhead
dominates) and ``cnn`` (compute-bound: the small CNN on the embedded MNIST sample, ~200 images per client).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (OUT, ROOT, ensure_venv, fmt, loadavg, machine_info, run_cli, save_json, summary,  # noqa: E402
                     wait_quiet)
from overhead import CLIENTS, overrides  # noqa: E402 - the same workloads as the overhead benchmark

FLWR_VENV = HERE / ".flwr-venv"
FLWR_PY = FLWR_VENV / "bin" / "python"
FLWR_PACKAGES = ["torch==2.14.1", "flwr[simulation]==1.42", "numpy", "scikit-learn",
                 "omegaconf==2.4.0"]  # omegaconf: `import raysim` (for its model classes) needs it


def ensure_flower_venv() -> str:
    """Build benchmarks/.flwr-venv once; return Flower's version."""
    return ensure_venv(FLWR_VENV, FLWR_PACKAGES, "import flwr, torch, omegaconf; print(flwr.__version__)", "flower")


def write_bundle(workload: str, rounds: int, clients: int) -> tuple[Path, Any]:
    """The exact federation raysim builds (partition, tensors, initial weights), saved for the Flower side."""
    import torch

    from raysim.config import load_config
    from raysim.data import build_federated_data
    from raysim.models import build_model

    cfg = load_config(None, overrides(workload, rounds, clients) + ["engine.num_workers=2"])
    data = build_federated_data(cfg)
    initial = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0)
    tests = [data.tensors(c, "test")[:2] for c in range(data.num_clients)]
    t = cfg.train
    b = {"arch": cfg.model.for_client(0), "input_shape": list(data.input_shape(0)), "num_classes": data.num_classes,
         "model_cfg": {"width": cfg.model.width, "hidden": list(cfg.model.hidden),
                       "feature_dim": cfg.model.feature_dim},
         "initial_state": {k: v.clone() for k, v in initial.state_dict().items()},
         "clients": [data.tensors(c, "train")[:2] for c in range(data.num_clients)],
         "test": (torch.cat([x for x, _ in tests]), torch.cat([y for _, y in tests])),
         "seed": cfg.seed, "rounds": cfg.rounds,
         "train": {"lr": t.lr, "momentum": t.momentum, "weight_decay": t.weight_decay, "batch_size": t.batch_size,
                   "local_epochs": t.local_epochs},
         "num_cpus": 2, "cpus_per_client": cfg.engine.cpus_per_worker}
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"flower-bundle-{workload}.pt"
    torch.save(b, path)
    return path, cfg


def run_flower(bundle: Path, workload: str) -> dict[str, Any]:
    out = OUT / f"flower-result-{workload}.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "FLWR_BENCH_BUNDLE": str(bundle), "FLWR_BENCH_OUT": str(out),
           "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
           "RAY_ADDRESS": "local"}  # Flower's ray.init(): a new Ray, never a running or stale `ray start` one
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    done = subprocess.run([str(FLWR_PY), "-c", "import _flower_app; _flower_app.main()"], cwd=HERE, env=env,
                          capture_output=True, text=True)
    total = time.perf_counter() - t0
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"Flower run failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return {"total_s": total, **json.loads(out.read_text())}


def run_raysim(workload: str, rounds: int, clients: int, extra: list[str]) -> dict[str, Any]:
    run_dir = OUT / f"flower-raysim-{workload}"
    shutil.rmtree(run_dir, ignore_errors=True)
    timing = run_cli(overrides(workload, rounds, clients) + ["engine.num_workers=2", *extra, f"log.dir={run_dir}"])
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"total_s": timing["total_s"], "round1_s": timing["round1_s"], "rounds_s": rows[-1]["wall_s_total"],
            "acc_global": rows[-1]["acc_global"], "losses": {r["round"]: r["loss"] for r in rows}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workloads", default="mlp,cnn")
    p.add_argument("--clients", type=int, default=CLIENTS, help="clients.num, all sampled every round")
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra raysim override, raysim side only (e.g. engine.vectorize=auto)")
    p.add_argument("--out", default="flower", help="results go to benchmarks/out/OUT.json")
    args = p.parse_args(argv)
    flwr_version = ensure_flower_venv()
    info = machine_info() | {"flwr": flwr_version}
    print(f"[flower] {info}", flush=True)
    result: dict[str, Any] = {"machine": info, "clients": args.clients, "rounds": args.rounds, "raysim_set": args.set,
                              "workloads": {}}
    for wl in [w for w in args.workloads.split(",") if w]:
        bundle, _ = write_bundle(wl, args.rounds, args.clients)
        runs: dict[str, list[dict]] = {"raysim": [], "flower": []}
        for rep in range(args.repeats):
            load = wait_quiet(enabled=not args.no_wait)
            runs["raysim"].append(run_raysim(wl, args.rounds, args.clients, args.set) | {"load_before": load})
            runs["flower"].append(run_flower(bundle, wl) | {"load_before": loadavg()})
            r, f = runs["raysim"][-1], runs["flower"][-1]
            print(f"[flower] {wl} rep {rep}: raysim {r['total_s']:.1f}s (acc {r['acc_global']:.4f})  flower "
                  f"{f['total_s']:.1f}s (acc {f['acc_global']:.4f})  ratio {f['total_s'] / r['total_s']:.2f}  "
                  f"load {loadavg():.2f}", flush=True)
        acc_r = [r["acc_global"] for r in runs["raysim"]]
        acc_f = [f["acc_global"] for f in runs["flower"]]
        loss_gap = max(abs(float(runs["raysim"][0]["losses"][k]) - float(v))
                       for k, v in ((int(k), v) for k, v in runs["flower"][0]["losses"].items()))
        result["workloads"][wl] = {
            "total_s": {k: summary(r["total_s"] for r in v) for k, v in runs.items()},
            "rounds_s": {k: summary(r["rounds_s"] for r in v) for k, v in runs.items()},
            "ratio_flower_over_raysim": summary(f["total_s"] / r["total_s"]
                                                for r, f in zip(runs["raysim"], runs["flower"])),
            "acc_global": {"raysim": acc_r, "flower": acc_f,
                           "max_abs_diff": max(abs(a - b) for a, b in zip(acc_r, acc_f))},
            "max_round_loss_diff": loss_gap, "runs": runs}
        bundle.unlink(missing_ok=True)
    path = save_json(args.out, result)
    print(f"\n[flower] results in {path}")
    for wl, e in result["workloads"].items():
        print(f"{wl}: end to end s  raysim {fmt(e['total_s']['raysim'], 1, 1)}  "
              f"flower {fmt(e['total_s']['flower'], 1, 1)}"
              f"  flower/raysim {fmt(e['ratio_flower_over_raysim'], 1, 2)} (target >= 3 tiny, >= 1 compute-bound)")
        print(f"{wl}: rounds only s  raysim {fmt(e['rounds_s']['raysim'], 1, 2)}  flower "
              f"{fmt(e['rounds_s']['flower'], 1, 2)}")
        print(f"{wl}: acc_global raysim {e['acc_global']['raysim']} flower {e['acc_global']['flower']} (max |diff| "
              f"{e['acc_global']['max_abs_diff']:.4f}); max per-round train-loss diff {e['max_round_loss_diff']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
