"""Simulated time to a target accuracy, cross-device: synchronous FedAvg, with a deadline, FedAsync and FedBuff,
with the server as deployed and as the oracle it used to be.

    .venv/bin/python benchmarks/async_time.py [--seeds 0,1,2] [--target 0.8] [--methods sync,deadline,...]
                                              [--servers deployed,oracle]

The setting is experiments/async/sync.yaml: 1,000 clients holding the embedded 5,000-image MNIST sample (a
Dirichlet(0.5) label skew, ~5 images each, FEMNIST-like small clients), a 784-64-10 MLP, lognormal client speeds
with a 10x spread (90th over 10th percentile), lognormal bandwidths and latency, and diurnal availability (each
client online for half of a 24 h day at its own phase). The four runs (one config each in experiments/async/):

  sync      synchronous FedAvg, 20 clients a round, no deadline (a round waits for its slowest client)
  deadline  synchronous FedAvg, a 90 s deadline, 30 % over-selection (26 start, the first 20 to report are kept)
  fedasync  FedAsync (Xie et al. 2019): 20 in flight, alpha = 0.6, polynomial staleness with a = 0.5
  fedbuff   FedBuff (Nguyen et al. 2022): C = 40 in flight, a server step every K = 10 arrivals, eta_g = 1,
            staleness scaling 1/sqrt(1 + staleness)

Each runs under two servers (issue 55), from its ``*-deployed.yaml`` config: 8 % of started jobs drop out in both.

  deployed  the server as deployed: a client whose availability ends before its upload leaves mid-job and never
            reports (system.availability.whole_job); the server waits for a round's reports until a 10-minute
            timeout (the 90 s deadline where there is one), since it cannot know who dropped out, and abandons a
            synchronous round with fewer than 80 % of its 20 reports; FedAsync and FedBuff free a failed job's slot
            at the timeout
  oracle    what raysim's clock claimed before issue 55, on the same config with those keys unset: availability
            checked only when a job starts, and a server that knows at once who will never report

Every run is in this process (no Ray), one core. Reported per method: the simulated hours at the first evaluation
whose pooled test accuracy (``acc_global``) reaches ``--target`` (the evaluations are every 2 rounds, 20 FedAsync
steps or 4 FedBuff steps: a few simulated minutes apart), median and range over the seeds, the speed-up over
synchronous FedAvg (median of the per-seed ratios), the updates applied until then and the run's wall time. The
plot (benchmarks/async_time.png) shows accuracy against simulated hours, one line per method and seed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, ROOT, loadavg, machine_info, save_json  # noqa: E402

CONFIGS = {  # method -> (config, rounds: enough to pass the target with a margin)
    "sync": ("sync-deployed.yaml", 100),
    "deadline": ("sync-deadline-deployed.yaml", 100),
    "fedasync": ("fedasync-deployed.yaml", 1400),
    "fedbuff": ("fedbuff-deployed.yaml", 240),
}
SERVERS = {  # the server -> the overrides on each deployed config
    "deployed": [],
    "oracle": ["system.report_timeout_s=null", "system.min_reports=null", "system.availability.whole_job=false"],
}
LABELS = {"sync": "FedAvg, sync, no deadline", "deadline": "FedAvg, sync, 90 s deadline + 30% over-selection",
          "fedasync": "FedAsync (20 in flight)", "fedbuff": "FedBuff (C=40 in flight, K=10)"}


def run_one(method: str, seed: int, rounds: Optional[int] = None, reuse: bool = False,
            server: str = "deployed") -> dict[str, Any]:
    """One run (or, with ``reuse``, the finished run already in its directory: its metrics, wall time unknown)."""
    from raysim.api import run
    from raysim.runlog import read_metrics

    path, default_rounds = CONFIGS[method]
    out = OUT / "async_time" / f"{method}-{server}-seed{seed}"
    t0 = time.perf_counter()
    if reuse and (out / "metrics.jsonl").exists():
        rows = read_metrics(out / "metrics.jsonl")
        wall = float(rows[-1].get("wall_s_total", float("nan")))  # the rounds alone, not the start
    else:
        shutil.rmtree(out, ignore_errors=True)  # a fresh run each time
        result = run(str(ROOT / "experiments" / "async" / path), f"seed={seed}", *SERVERS[server],
                     f"rounds={rounds or default_rounds}", f"log.dir={out}", "log.progress=false", progress=False)
        rows, wall = result.metrics.to_dict("records"), time.perf_counter() - t0
    curve, updates = [], 0
    for r in rows:
        updates += applied(r)
        acc = r.get("acc_global")
        if acc is not None and acc == acc:
            curve.append((float(r["sim_time_s"]) / 3600.0, float(acc), int(r["round"]), updates))
    abandoned = sum(int(r.get("abandoned") or 0) for r in rows)
    return {"method": method, "server": server, "seed": seed, "wall_s": wall, "curve": curve, "run_dir": str(out),
            "rounds": len(rows), "abandoned": abandoned}


def applied(row: dict) -> int:
    """The updates a round's server step applied: an asynchronous step's arrivals (``clients``); a synchronous
    round's reports (its trained clients but the late, the surplus and those that left mid-job), none when it was
    abandoned."""
    if row.get("abandoned"):
        return 0
    if "staleness_mean" in row:
        return int(row["clients"])
    return int(row["clients"]) - sum(int(row.get(k) or 0) for k in ("late", "surplus", "dropouts_left"))


def to_target(curve: list, target: float) -> Optional[tuple]:
    return next((point for point in curve if point[1] >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--methods", default=",".join(CONFIGS))
    parser.add_argument("--rounds-scale", type=float, default=1.0, help="multiply every method's rounds (tests)")
    parser.add_argument("--reuse", action="store_true",
                        help="read the runs already in benchmarks/out/async_time/ instead of running them again")
    parser.add_argument("--servers", default=",".join(SERVERS), help="deployed, oracle or both")
    parser.add_argument("--plot", default=str(HERE / "async_time.png"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    methods, servers = args.methods.split(","), args.servers.split(",")
    load0, t_start = loadavg(), time.perf_counter()
    runs = []
    for seed in seeds:
        for method in methods:
            for server in servers:
                r = run_one(method, seed, max(1, round(CONFIGS[method][1] * args.rounds_scale)), args.reuse, server)
                hit = to_target(r["curve"], args.target)
                print(f"seed {seed} {method:9s} {server:8s} {'%.2f h' % hit[0] if hit else 'not reached'}  "
                      f"final acc {r['curve'][-1][1]:.3f} at {r['curve'][-1][0]:.2f} h  abandoned {r['abandoned']}  "
                      f"wall {r['wall_s']:.1f} s", flush=True)
                runs.append(r)
    table = [summary(runs, method, server, args.target) for method in methods for server in servers]
    print(f"\nsimulated hours to acc_global >= {args.target:g}; seeds {seeds}; "
          f"load {load0:.1f} at the start, {loadavg():.1f} at the end; {time.perf_counter() - t_start:.0f} s in all")
    print("| method | server | hours: median (min–max) | reached | × faster than sync | updates | abandoned | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in table:
        hours = (f"{t['hours_median']:.2f} ({t['hours_min']:.2f}–{t['hours_max']:.2f})"
                 if t["hours_median"] is not None else "not reached")
        speed = f"{t['speedup_median']:.1f}" if t["speedup_median"] is not None else "–"
        updates = f"{t['updates_median']:.0f}" if t["updates_median"] is not None else "–"
        print(f"| {LABELS[t['method']]} | {t['server']} | {hours} | {t['reached']} | {speed} | {updates} | "
              f"{t['abandoned_median']:.0f} | {t['wall_s_median']:.0f} |")
    save_json("async_time", {"machine": machine_info(), "target": args.target, "seeds": seeds, "table": table,
                             "runs": runs, "load_start": load0, "load_end": loadavg(),
                             "wall_s": time.perf_counter() - t_start})
    plot(runs, methods, servers, args.target, Path(args.plot))


def summary(runs: list[dict], method: str, server: str, target: float) -> dict[str, Any]:
    """One row of the table: the hours to ``target`` of ``method`` under ``server`` over the seeds, and the speed-up
    over synchronous FedAvg under the same server (median of the per-seed ratios)."""
    mine = [r for r in runs if r["method"] == method and r["server"] == server]
    hits = {r["seed"]: to_target(r["curve"], target) for r in mine}
    hours = [h[0] for h in hits.values() if h]
    ratios = []
    for seed, h in hits.items():
        base = next((to_target(r["curve"], target) for r in runs
                     if r["method"] == "sync" and r["server"] == server and r["seed"] == seed), None)
        if h and base:
            ratios.append(base[0] / h[0])
    return {"method": method, "server": server, "reached": f"{len(hours)}/{len(mine)}",
            "hours_median": statistics.median(hours) if hours else None,
            "hours_min": min(hours) if hours else None, "hours_max": max(hours) if hours else None,
            "speedup_median": statistics.median(ratios) if ratios else None,
            "updates_median": statistics.median([h[3] for h in hits.values() if h]) if hours else None,
            "abandoned_median": statistics.median(r["abandoned"] for r in mine),
            "wall_s_median": statistics.median(r["wall_s"] for r in mine)}


def plot(runs: list[dict], methods: list[str], servers: list[str], target: float, path: Path) -> None:
    """One panel per server (the deployed one first), accuracy against simulated hours, a line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(servers), figsize=(6.2 * len(servers), 4.2), sharey=True, squeeze=False)
    colours = dict(zip(CONFIGS, ("tab:gray", "tab:blue", "tab:orange", "tab:green")))
    titles = {"deployed": "the server as deployed", "oracle": "what the oracle server claimed (the same runs)"}
    hits = [to_target(r["curve"], target) for r in runs]
    xmax = 1.3 * max((h[0] for h in hits if h), default=5.0)
    for ax, server in zip(axes[0], servers):
        for method in methods:
            for i, r in enumerate(r for r in runs if r["method"] == method and r["server"] == server):
                xs, ys = [p[0] for p in r["curve"]], [p[1] for p in r["curve"]]
                ax.plot(xs, ys, color=colours[method], lw=1.2, alpha=0.85 if i == 0 else 0.45,
                        label=LABELS[method] if i == 0 else None)
        ax.axhline(target, color="k", lw=0.8, ls=":")
        ax.set_xlim(0, xmax)
        ax.set_ylim(0.3, 0.95)
        ax.set_xlabel("simulated hours")
        ax.set_title(f"{titles.get(server, server)}: 8 % drop out", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (acc_global)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle("1,000 clients, 10x speed spread, diurnal availability (each line a seed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
