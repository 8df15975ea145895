"""Where a round's time goes on Ray: the driver's steps and each worker's busy and idle time, for pfl.py's
workloads (issue 35's profile; see benchmarks/RESULTS.md).

    .venv/bin/python benchmarks/profile_round.py [--workload cnn] [--workers 2] [--rounds 4] [--set KEY=VALUE ...]

The run is raysim's own (``raysim.engine.runner.run_experiment`` in this process, on a private local Ray with
2 CPUs), with benchmarks/_profile_hooks.py timing every worker's calls (training, summing its groups, the call as
a whole) and this process timing the driver's steps: waiting on calls, fetching their results (the transfer and
deserialisation of the groups' sums), adding the sums, the rest of the round (payloads, evaluation, checkpoint).
Round 1 (start-up) is left out. Printed per round: wall time, and per worker busy seconds (its calls) and idle
seconds (the round's wall minus busy), split into before its first call, between its calls and after its last.
With ``PROFILE_TIMELINE=FILE`` set, Ray's own timeline of every task (``ray.timeline``: deserialising its
arguments, executing, storing its outputs) is written to FILE as well.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pfl import overrides, settings  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="cnn")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="profile-"))
    os.environ["RAYSIM_PROFILE_DIR"] = str(out)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    import ray

    import raysim.algorithms.aggregation as aggregation
    import raysim.engine.driver as driver_mod
    import raysim.engine.pool as pool_mod
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    s = settings(args.workload, argparse.Namespace(rounds=args.rounds, clients=None, cohort=None))
    cfg = load_config(None, overrides(args.workload, s) + ["plugins=[bench_data,_profile_hooks]",
                                                           "engine.backend=ray", f"engine.num_workers={args.workers}",
                                                           f"log.dir={out / 'run'}", *args.set])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    spent: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    current = {"round": 0}

    def timed(obj, name, key):
        original = getattr(obj, name)

        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                spent[current["round"]][key] += time.perf_counter() - start
        setattr(obj, name, wrapper)

    timed(pool_mod.WorkerPool, "_fetch", "driver: fetch results")
    timed(pool_mod.WorkerPool, "run", "driver: calls in flight (wall)")
    timed(aggregation.UploadSum, "merge", "driver: add the groups' sums")
    timed(aggregation.UploadSum, "mean", "driver: divide")
    timed(driver_mod.Evaluation, "after_round", "driver: evaluation (wall)")
    timed(driver_mod.Driver, "_finish_round", "driver: log + checkpoint")
    run_round = driver_mod.Driver.run_round
    bounds: dict[int, tuple[float, float]] = {}

    def round_timed(self, rnd):
        current["round"] = rnd
        start = time.time()
        try:
            return run_round(self, rnd)
        finally:
            bounds[rnd] = (start, time.time())
    driver_mod.Driver.run_round = round_timed
    try:
        run_experiment(cfg)
        if os.environ.get("PROFILE_TIMELINE"):
            ray.timeline(filename=os.environ["PROFILE_TIMELINE"])
    finally:
        ray.shutdown()
    calls = []
    for f in out.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            calls.append({**json.loads(line), "pid": int(f.stem)})
    rounds = sorted(r for r in bounds if r > 1)
    report = []
    for r in rounds:
        a, b = bounds[r]
        wall = b - a
        per_pid: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        spans: dict[int, list[tuple[float, float]]] = defaultdict(list)  # each worker's calls, (start, end) wall
        for c in calls:
            if a <= c["t"] <= b:
                per_pid[c["pid"]][c["kind"]] += c["s"]
                if c["kind"] == "call":
                    per_pid[c["pid"]]["calls"] += 1
                    spans[c["pid"]].append((c["t"] - c["s"], c["t"]))
        row = {"round": r, "wall_s": round(wall, 3), **{k: round(v, 3) for k, v in spent[r].items()}}
        for i, (_pid, v) in enumerate(sorted(per_pid.items())):
            row[f"worker{i}"] = {"calls": int(v["calls"]), "busy_s": round(v["call"], 3),
                                 "train_s": round(v["train"], 3), "sum_s": round(v["sum"], 3),
                                 "other_in_call_s": round(v["call"] - v["train"] - v["sum"], 3),
                                 "idle_s": round(wall - v["call"], 3), **_idle_parts(sorted(spans[_pid]), a, b)}
        report.append(row)
        print(json.dumps(row))
    keys = [k for k in report[0] if k not in ("round",) and not k.startswith("worker")]
    print("median over rounds", {k: round(statistics.median(r.get(k, 0.0) for r in report), 3) for k in keys})
    return 0


def _idle_parts(spans: list[tuple[float, float]], start: float, end: float) -> dict[str, float]:
    """Where a worker's idle time falls: before its first call of the round (``lead_s``: the round's sampling,
    payload and the call's way there), between its calls (``gaps_s``), after its last (``tail_s``: waiting for the
    other worker, then the driver's sums, evaluation, log and checkpoint)."""
    if not spans:
        return {}
    gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))
    return {"lead_s": round(spans[0][0] - start, 3), "gaps_s": round(gaps, 3), "tail_s": round(end - spans[-1][1], 3)}


if __name__ == "__main__":
    raise SystemExit(main())
