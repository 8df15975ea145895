"""What ``raysim.warm_workers()`` saves: back-to-back runs on one Ray session with fresh worker processes each run,
against the same runs reusing the workers of the run before.

    .venv/bin/python benchmarks/warm_workers.py [--runs 6] [--workers 2]

One local Ray (2 CPUs) for the whole benchmark; the tiny digits config the tests use (4 clients, 2 rounds, an MLP),
on Ray with ``--workers`` workers. Each pair: a cold run (outside the block: it starts its workers, which import
torch), then, inside ``raysim.warm_workers()``, a run that leaves its workers and the warm run that takes them.
Per run: wall seconds and the whole machine's CPU seconds (``/proc/stat``, user + system of every process: the
workers' imports happen in other processes). The first pair is left out (Ray's prestarted workers serve its cold
run). Reported: median (min-max) of each, and whether each warm run had the run before's workers (same pids).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, loadavg, machine_info, save_json, summary, fmt  # noqa: E402

TINY = ["name=warm", "rounds=2", "clients.num=4", "data.name=sklearn_digits", "data.partition=iid", "model.name=mlp",
        "model.hidden=[32]", "model.feature_dim=16", "train.lr=0.1", "train.batch_size=32", "engine.backend=ray",
        "log.progress=false"]


def machine_cpu_s() -> float:
    """User + system seconds of every process on the machine so far (``/proc/stat``'s first line)."""
    with open("/proc/stat") as fh:
        fields = fh.readline().split()
    return (int(fields[1]) + int(fields[2]) + int(fields[3])) / 100.0  # USER_HZ is 100 on Linux


def one_run(workers: int, out: Path) -> tuple[float, float, set[int]]:
    """(wall s, machine CPU s, the workers' pids) of one run."""
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    shutil.rmtree(out, ignore_errors=True)
    pids: set[int] = set()
    cfg = load_config(None, [*TINY, f"engine.num_workers={workers}", f"log.dir={out}"])
    cpu, wall = machine_cpu_s(), time.perf_counter()
    run_experiment(cfg, on_start=lambda s: pids.update(i["pid"] for i in s["control"].worker_info()))
    return time.perf_counter() - wall, machine_cpu_s() - cpu, pids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6, help="pairs (the first left out)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    import ray

    import raysim
    from raysim.engine.resources import init_local_ray

    init_local_ray(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level=logging.WARNING)
    time.sleep(5)  # the prestarted workers finish importing torch
    load = loadavg()
    got: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    reused = []
    try:
        for i in range(args.runs):
            wall, cpu, _ = one_run(args.workers, OUT / "warm_workers" / f"cold-{i}")
            got["cold"].append((wall, cpu))
            with raysim.warm_workers():  # the first run starts workers and leaves them; the second takes them
                _, _, first = one_run(args.workers, OUT / "warm_workers" / f"prime-{i}")
                wall, cpu, pids = one_run(args.workers, OUT / "warm_workers" / f"warm-{i}")
            got["warm"].append((wall, cpu))
            reused.append(pids == first)
            print(f"pair {i}: cold {got['cold'][-1][0]:.2f} s ({got['cold'][-1][1]:.2f} s CPU)  "
                  f"warm {wall:.2f} s ({cpu:.2f} s CPU)", flush=True)
    finally:
        ray.shutdown()
    result = {"machine": machine_info(), "load_at_start": load, "runs": args.runs, "workers": args.workers,
              "reused_workers": reused}
    for kind, rows in got.items():
        result[kind] = {"wall_s": summary(w for w, _ in rows[1:]), "cpu_s": summary(c for _, c in rows[1:])}
        print(f"{kind}: wall {fmt(result[kind]['wall_s'], digits=2)} s, machine CPU "
              f"{fmt(result[kind]['cpu_s'], digits=2)} s a run")
    print(f"warm runs that reused the run before's workers: {sum(reused)}/{len(reused)}")
    print(f"results in {save_json('warm_workers', result)}")
    shutil.rmtree(OUT / "warm_workers", ignore_errors=True)


if __name__ == "__main__":
    main()
