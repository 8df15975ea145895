"""Stacked clients (``engine.vectorize``): time per client update against the stack size K, MLP and CNN.

    .venv/bin/python benchmarks/vectorize.py [--models mlp,cnn] [--sizes 1,2,4,8,16,32,64,128,256] [--repeats 3]
        [--clients 256] [--no-wait] [--plot benchmarks/out/vectorize-k.png]

The client-job core in this process, one torch thread (a worker with ``engine.cpus_per_worker=1``), no Ray and no
round loop: K = 1 is ``ClientJobs.train`` one client after another, K > 1 is ``raysim.engine.stack.train_stack``
over stacks of K. Each size trains the same ``--clients`` clients (their first local round from the same global
model; at least K of them), so every size does the same work. Workloads, FedAvg with plain SGD, 1 local epoch:

  mlp  benchmarks/pfl.py's tiny workload: 50 samples of 64 features a client, MLP 64 -> 32 -> 10, batch 10
  cnn  raysim's ``cnn`` (two 3x3 convolutions, width 32, 64 features) on 50 CIFAR-shaped 3x32x32 images a client
       (benchmarks/pfl.py's ``pfl_images``), batch 10

Reported per model and K: milliseconds per client update (median (min-max) over ``--repeats``), in wall time and in
this process's CPU time (which other processes on the machine do not inflate), the speed-up against K = 1, and how
far the stack's uploads are from one-at-a-time training (0 for the MLP: bit for bit). Raw figures go to
benchmarks/out/vectorize.json and a plot (log2 K against ms per update, one line per model) to ``--plot``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, fmt, loadavg, machine_info, save_json, summary, wait_quiet  # noqa: E402

MODELS: dict[str, list[str]] = {
    "mlp": ["data.name=pfl_blobs", "model.name=mlp", "model.hidden=[]", "model.feature_dim=32"],
    "cnn": ["data.name=pfl_images", "model.name=cnn", "model.width=32", "model.feature_dim=64"],
}


def setup(model: str, clients: int) -> tuple[Any, list, dict]:
    """(client-job core, the first ``clients`` clients' round-1 jobs, the round's shared payload)."""
    import bench_data  # noqa: F401 - registers pfl_blobs / pfl_images
    from raysim.config import load_config
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import TrainJob
    from raysim.models import build_model
    from raysim.registry import get_algorithm

    cfg = load_config(None, ["seed=0", "clients.num=1000", "plugins=[bench_data]", "algorithm.name=fedavg",
                             "train.lr=0.1", "train.batch_size=10", "train.local_epochs=1", "train.momentum=0.0",
                             "engine.cpus_per_worker=1", *MODELS[model]], warn=False)
    alg = get_algorithm(cfg.algorithm.name)(cfg)
    data = alg.prepare_data(build_federated_data(cfg))
    initial = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0, alg)
    shared = alg.server_payload(alg.init_server_state(initial.state_dict()), 1)
    jobs = [TrainJob(client_id=c, round=1, payload_ref=None) for c in range(clients)]
    return ClientJobs(cfg, data, algorithm=alg), jobs, shared


def train_all(core: Any, jobs: list, shared: dict, k: int) -> list:
    """Every job trained, one at a time (k = 1) or in stacks of k; returns the (result, state) pairs."""
    from raysim.engine.stack import train_stack

    if k == 1:
        return [core.train(j, shared, None, None) for j in jobs]
    out = []
    for b in range(0, len(jobs), k):
        part = jobs[b:b + k]
        out.extend(train_stack(core, part, shared, [None] * len(part), [None] * len(part)))
    return out


def max_difference(a: list, b: list) -> float:
    """Largest absolute difference between two runs' uploads (0.0: bit for bit)."""
    worst = 0.0
    for (ra, _), (rb, _) in zip(a, b):
        for key, value in ra.upload.items():
            worst = max(worst, float((value.double() - rb.upload[key].double()).abs().max()))
    return worst


def measure(model: str, sizes: list[int], args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    core, jobs, shared = setup(model, max(args.clients, max(sizes)))
    reference = train_all(core, jobs, shared, 1)  # also the warm-up of the one-at-a-time path
    rows: dict[int, dict[str, Any]] = {}
    for k in sizes:
        train_all(core, jobs[:max(2, k)], shared, k)  # warm-up of this size
        wall, cpu = [], []
        for _ in range(args.repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            done = train_all(core, jobs, shared, k)
            wall.append((time.perf_counter() - w0) / len(jobs))
            cpu.append((time.process_time() - c0) / len(jobs))
        rows[k] = {"wall_s": summary(wall), "cpu_s": summary(cpu), "max_abs_diff": max_difference(reference, done),
                   "load_after": loadavg()}
        print(f"[vectorize] {model} K={k:>3}: {fmt(rows[k]['wall_s'], 1e3, 3)} ms wall, "
              f"{fmt(rows[k]['cpu_s'], 1e3, 3)} ms CPU per update; uploads differ by {rows[k]['max_abs_diff']:.2e}",
              flush=True)
    base = rows[sizes[0]] if sizes[0] == 1 else None
    for r in rows.values():
        if base is not None:
            r["speedup_wall"] = base["wall_s"]["median"] / r["wall_s"]["median"]
            r["speedup_cpu"] = base["cpu_s"]["median"] / r["cpu_s"]["median"]
    return {"clients": len(jobs), "sizes": rows}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for model, entry in result["models"].items():
        ks = sorted(entry["sizes"])
        for clock, style in (("cpu_s", "-o"), ("wall_s", ":x")):
            ax.plot(ks, [entry["sizes"][k][clock]["median"] * 1e3 for k in ks], style,
                    label=f"{model} ({'CPU' if clock == 'cpu_s' else 'wall'} time)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("clients per stack K (K = 1: one at a time)")
    ax.set_ylabel("ms per client update")
    ax.set_title("raysim engine.vectorize: time per client update against K")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--sizes", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clients", type=int, default=256, help="clients trained per measurement (at least K)")
    p.add_argument("--no-wait", action="store_true", help="don't wait for a quiet machine (debugging)")
    p.add_argument("--plot", default=str(OUT / "vectorize-k.png"))
    p.add_argument("--out", default="vectorize", help="results go to benchmarks/out/OUT.json")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            p.error(f"--models: unknown model {m!r} (known: {', '.join(MODELS)})")
    sizes = sorted({int(k) for k in args.sizes.split(",") if k})
    if not sizes or sizes[0] < 1 or args.repeats < 1 or args.clients < 1:
        p.error("--sizes must be whole numbers >= 1; --repeats and --clients >= 1")
    info = machine_info()
    print(f"[vectorize] {info}", flush=True)
    result: dict[str, Any] = {"machine": info, "args": vars(args), "models": {}}
    for model in models:
        result["load_before_" + model] = wait_quiet(enabled=not args.no_wait)
        result["models"][model] = measure(model, sizes, args)
    path = save_json(args.out, result)
    plot(result, Path(args.plot))
    print(f"\n[vectorize] results in {path}, plot in {args.plot}")
    for model, entry in result["models"].items():
        print(f"\n{model}: ms per client update, median (min-max) of {args.repeats}, {entry['clients']} clients")
        print(f"  {'K':>4}  {'wall':<26}{'CPU':<26}{'speed-up (wall, CPU)':<22}max |upload diff|")
        for k, r in sorted(entry["sizes"].items()):
            up = f"{r.get('speedup_wall', float('nan')):.2f}x, {r.get('speedup_cpu', float('nan')):.2f}x"
            print(f"  {k:>4}  {fmt(r['wall_s'], 1e3, 3):<26}{fmt(r['cpu_s'], 1e3, 3):<26}{up:<22}"
                  f"{r['max_abs_diff']:.2e}")
        best = min(entry["sizes"].items(), key=lambda kv: statistics.median([kv[1]["cpu_s"]["median"]]))
        print(f"  fastest per update (CPU time): K={best[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
