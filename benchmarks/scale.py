"""Scale: round time and peak memory as the federation grows from 100 to 10,000 (or 1,000,000) virtual clients.

    .venv/bin/python benchmarks/scale.py [--sizes 100,1000,10000] [--rounds 20] [--repeats 3] [--no-wait]
    .venv/bin/python benchmarks/scale.py --data synthetic --algorithm fedavg --sizes 100,10000,100000,1000000
    .venv/bin/python benchmarks/scale.py --data synthetic --algorithm partialavg --sizes 100,100000
    .venv/bin/python benchmarks/scale.py ... --set engine.vectorize=auto --out scale-synthetic-fedavg-vectorize

``--data synthetic`` is FedProx's Synthetic(1, 1), made per client on demand (client sizes capped at ``--cap``
samples, default 500, so that the lognormal's rare 10^4-sample clients do not decide a round's time); the
default ``bench_synth`` builds every client's samples up front, as the figures of earlier sessions did.

An MLP on a Dirichlet(0.5) label-skew split of the benchmark-only ``bench_synth`` dataset (benchmarks/bench_data.py:
50 samples per client on average, so a sampled client's work is the same at every size); 100 clients sampled per
round, evaluation on the sampled clients only (``eval.clients=sampled``). The algorithm is PartialAvg by default:
only the head is averaged and every client keeps its own backbone, so per-client state accumulates in the Ray
object store (capped at ``engine.state_memory_gb``; Ray spills the rest to disk) — the case the memory target is
about. Reported per size: the round period seen by the host (median of rounds 2..R), peak RSS (VmHWM) of the
driver actor and of each worker, the largest sum of PSS over every process of the run (this script, Ray's
gcs/raylet and all Ray workers: shared pages such as the object store counted once), and object-store usage and
spilled by each run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (OUT, descendants, find_actor_pids, fmt, loadavg, machine_info, pss_mib,  # noqa: E402
                     save_json, start_ray, summary, vm_hwm_mib, wait_quiet)

SAMPLED = 100


def overrides(num: int, rounds: int, args: argparse.Namespace) -> list[str]:
    data = (["data.name=synthetic", f"data.samples_per_domain={args.cap}"] if args.data == "synthetic" else
            # raysim's own Dirichlet split, as in RESULTS.md (the engine's scale is measured, not a partitioner's)
            ["plugins=[bench_data]", "data.name=bench_synth", "data.partition=legacy_dirichlet", "data.alpha=0.5"])
    return [f"name=scale-{num}", "seed=0", f"rounds={rounds}", f"clients.num={num}",
            f"clients.fraction={SAMPLED / num!r}", *data, "model.name=mlp", f"model.hidden=[{args.hidden}]",
            "model.feature_dim=64",
            "train.lr=0.05", "train.batch_size=32", f"algorithm.name={args.algorithm}", "eval.clients=sampled",
            "engine.num_workers=2", "engine.cpus_per_worker=1", *args.set, f"log.dir={OUT / f'scale-{num}'}"]


def store_stats() -> dict[str, float]:
    """Object-store bytes in use and spilled so far (Ray's own summary; needs no ray[default])."""
    try:
        import ray
        from ray._private.internal_api import memory_summary

        text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    except Exception as exc:  # noqa: BLE001 - the figure is optional
        return {"error": str(exc)[:200]}
    out: dict[str, float] = {}
    m = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", text)
    if m:
        out["plasma_used_mib"], out["plasma_objects"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"Spilled (\d+) MiB, (\d+) objects", text)
    out["spilled_mib"] = float(m.group(1)) if m else 0.0
    return out


def round_samples(cfg: Any) -> list[int]:
    """Training samples of each round's sampled clients (on-demand data: sizes are known without making samples),
    so that a difference in round time between sizes can be told apart from a difference in work."""
    from raysim.data import build_federated_data
    from raysim.engine.sampling import sample_clients

    data = build_federated_data(cfg)
    return [sum(data.num_train(c) for c in sample_clients(cfg.seed, r, cfg.clients.num, cfg.clients.fraction))
            for r in range(1, cfg.rounds + 1)]


def one_run(num: int, args: argparse.Namespace) -> dict[str, Any]:

    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, overrides(num, args.rounds, args))
    shutil.rmtree(cfg.log.dir, ignore_errors=True)
    probe: dict[str, Any] = {"stamps": [], "tree_pss_mib": 0.0, "driver_wall": []}

    def on_start(info: dict) -> None:
        probe["stamps"].append(time.perf_counter())
        probe["driver_pid"] = (find_actor_pids("Driver") or [0])[0]
        probe["worker_pids"] = [w["pid"] for w in info["control"].worker_info()]
        probe["control"] = info["control"]

    def on_round(m: dict) -> None:
        probe["stamps"].append(time.perf_counter())
        probe["driver_wall"].append(m["wall_s"])
        # engine.vectorize: clients per stack (1: one at a time), the run's choice (no longer in the metrics rows)
        probe["stack"] = probe["control"].vectorize_choice()[0] or 1
        tree = [os.getpid(), *descendants(os.getpid())]
        probe["tree_pss_mib"] = max(probe["tree_pss_mib"], sum(pss_mib(p) for p in tree))
        # VmHWM only grows, but the driver's generator runs ahead and shuts the workers down right after the last
        # round, so each round's reading is kept (the last one a worker was alive for is its peak)
        probe["driver_hwm_mib"] = max(probe.get("driver_hwm_mib", 0.0), vm_hwm_mib(probe["driver_pid"]))
        probe["worker_hwm_mib"] = [max(old, vm_hwm_mib(p)) for old, p in
                                   zip(probe.get("worker_hwm_mib", [0.0] * len(probe["worker_pids"])),
                                       probe["worker_pids"])]
        if m["round"] == cfg.rounds:
            probe["store"] = store_stats()
            probe["acc_mean"] = m["acc_mean"]

    spilled_before = store_stats().get("spilled_mib", 0.0)  # Ray's counter covers the whole session
    t0 = time.perf_counter()
    run_experiment(cfg, on_start=on_start, on_round=on_round)
    total = time.perf_counter() - t0
    shutil.rmtree(cfg.log.dir, ignore_errors=True)
    probe["store"]["spilled_mib"] = probe["store"].get("spilled_mib", 0.0) - spilled_before  # this run's
    st = probe["stamps"]
    periods = [b - a for a, b in zip(st, st[1:])]
    import statistics

    work = round_samples(cfg) if args.data == "synthetic" else []
    return {"round_s": statistics.median(periods[1:] or periods), "round1_s": periods[0], "total_s": total,
            "train_samples_per_round": work,  # what each round trained: the sampled clients' sizes differ
            "to_round1_s": st[1] - t0,  # from the run's launch in this warm Ray to the end of round 1
            "driver_round_s": statistics.median(probe["driver_wall"][1:] or probe["driver_wall"]),
            "setup_s": st[0] - t0, "driver_hwm_mib": probe["driver_hwm_mib"],
            "worker_hwm_mib": probe["worker_hwm_mib"], "tree_pss_peak_mib": probe["tree_pss_mib"],
            "store": probe["store"], "acc_mean_last": probe["acc_mean"], "stack": probe.get("stack", 1),
            "load_after": loadavg()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000,10000")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=512, help="MLP hidden width (sets the per-client state size)")
    p.add_argument("--algorithm", default="partialavg", help="partialavg keeps per-client state; fedavg keeps none")
    p.add_argument("--state-gb", type=float, default=0.25, help="engine.state_memory_gb: the object store size")
    p.add_argument("--data", choices=("bench_synth", "synthetic"), default="bench_synth")
    p.add_argument("--cap", type=int, default=500, help="synthetic: data.samples_per_domain, the per-client cap")
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra raysim override (e.g. engine.vectorize=auto)")
    p.add_argument("--out", help="results go to benchmarks/out/OUT.json (default: scale or scale-DATA-ALGORITHM)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    info = machine_info()
    print(f"[scale] {info}", flush=True)
    result: dict[str, Any] = {"machine": info, "args": vars(args), "sizes": {}}
    start_ray(num_cpus=2, object_store_gb=args.state_gb, extra_pythonpath=[HERE])
    import ray

    try:
        runs: dict[int, list[dict]] = {n: [] for n in sizes}
        for rep in range(args.repeats):
            load = wait_quiet(enabled=not args.no_wait)
            for n in sizes:
                r = one_run(n, args)
                r["load_before"] = load
                runs[n].append(r)
                print(f"[scale] rep {rep} clients {n}: {r['round_s']:.3f}s/round, stacks of {r['stack']} "
                      f"(driver's own {r['driver_round_s']:.3f}s), "
                      f"round 1 ends {r['to_round1_s']:.2f}s after launch, "
                      f"samples trained per round {r['train_samples_per_round']}, "
                      f"driver {r['driver_hwm_mib']:.0f} "
                      f"MiB, workers {[round(w) for w in r['worker_hwm_mib']]} MiB, tree PSS "
                      f"{r['tree_pss_peak_mib']:.0f} MiB, store {r['store']}, load {r['load_after']:.2f}",
                      flush=True)
    finally:
        ray.shutdown()
    for n, rs in runs.items():
        result["sizes"][n] = {
            "round_s": summary(r["round_s"] for r in rs), "round1_s": summary(r["round1_s"] for r in rs),
            "driver_round_s": summary(r["driver_round_s"] for r in rs),
            "setup_s": summary(r["setup_s"] for r in rs),
            "to_round1_s": summary(r["to_round1_s"] for r in rs),
            "driver_hwm_mib": summary(r["driver_hwm_mib"] for r in rs),
            "worker_hwm_mib": summary(w for r in rs for w in r["worker_hwm_mib"]),
            "tree_pss_peak_mib": summary(r["tree_pss_peak_mib"] for r in rs),
            "spilled_mib": summary(r["store"].get("spilled_mib", 0.0) for r in rs),
            "plasma_used_mib": summary(r["store"].get("plasma_used_mib", float("nan")) for r in rs),
            "runs": rs}
    base = result["sizes"][sizes[0]]["round_s"]["median"]
    for n in sizes:
        result["sizes"][n]["round_vs_smallest"] = result["sizes"][n]["round_s"]["median"] / base
        result["sizes"][n]["to_round1_vs_smallest"] = (result["sizes"][n]["to_round1_s"]["median"]
                                                       / result["sizes"][sizes[0]]["to_round1_s"]["median"])
    path = save_json(args.out or ("scale" if args.data == "bench_synth" else f"scale-{args.data}-{args.algorithm}"),
                     result)
    print(f"\n[scale] results in {path}")
    for n in sizes:
        e = result["sizes"][n]
        print(f"clients {n:>6}: round {fmt(e['round_s'])} s (x{e['round_vs_smallest']:.2f} of {sizes[0]}; target "
              f"within 1.20)  launch to end of round 1 {fmt(e['to_round1_s'])} s (x{e['to_round1_vs_smallest']:.2f}; "
              f"target within 2)  driver HWM {fmt(e['driver_hwm_mib'], 1, 0)} MiB  worker HWM "
              f"{fmt(e['worker_hwm_mib'], 1, 0)} MiB  all-process PSS peak {fmt(e['tree_pss_peak_mib'], 1, 0)} MiB "
              f"(target <= 8192)  spilled {fmt(e['spilled_mib'], 1, 0)} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
