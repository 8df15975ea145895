"""The simulated clock's and the event queue's own cost: real round time with ``system`` off and on, and peak memory
at a million clients with availability on.

    .venv/bin/python benchmarks/system_cost.py [--pairs 7] [--rounds 12] [--million] [--million-rounds 3]

**Round time** (issue 36: at most 3 % more at 100 clients a round). experiments/async/sync.yaml's 1,000 MNIST clients
with ``clients.fraction=0.1`` (100 a round), evaluation only after the last round, in this process (no Ray).
Three variants run as interleaved groups (off, clock, queue; off, clock, queue; ...), each a fresh run:

  off    ``system.enabled=false`` (no simulated time at all)
  clock  ``system.enabled=true`` with the benchmark's lognormal traits and diurnal availability: the synchronous
         clock samples among the available clients and prices every job
  queue  FedBuff with C = K = 100 on the same system model: each server step is 100 updates, every one of them
         through the event queue (the same work as a synchronous round, plus the queue and FedBuff's buffered step)

Per run, over rounds 2..R-1 (no start-up, no evaluation): the median real time from one round's end to the next's
(its log lines and checkpoint included), the CPU time this process spent in it (``time.process_time``), and the
engine's own time: the real time less the clients' training (time inside ``ClientJobs.train``), which is what the
clock and the queue can add; the variants train different clients (the clock samples among the available ones), so
their training differs by more than the engine's cost.
Per group: each variant's ratio to its group's ``off``. Reported: median (min–max) of the ratios over the groups.

**The clock alone** (``--clock-work``): ``RoundClock.sample`` and ``settle`` for 200 rounds of 100 clients outside any
run, CPU per round: the clock's absolute cost, which a loaded machine's noise cannot hide as it can a few percent of a
round.

**Where the engine's time goes** (``--parts``): one more run of ``off`` and of ``queue`` (``--rounds`` rounds each)
with the driver's steps timed (perf_counter around each call, summed per round; medians over rounds 2..R-1): the
sums taken in the training calls, the executor's own cost (copies in and out of its calls), FedBuff's buffered step,
the jobs' starts (a client drawn and priced), the checkpoint and the log.

**Memory** (``--million``; issue 36: within 1.2x of the synthetic million-client run). ``raysim run`` in a
subprocess on benchmarks/scale.py's synthetic million-client setting (FedProx's Synthetic(1, 1) made on demand, a
512-wide MLP, 100 clients a round, evaluation on the sampled clients), in process (one worker), ``--million-rounds``
rounds: with ``system`` off, with ``system.enabled=true`` and diurnal availability (the synchronous clock), and
the same with FedBuff (C = K = 100: the event queue drawing among a million clients); peak RSS of the subprocess
(``ru_maxrss`` of the child).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, ROOT, loadavg, machine_info, save_json  # noqa: E402

CONFIG = ROOT / "experiments" / "async" / "sync.yaml"
VARIANTS = {
    "off": ["system.enabled=false"],
    "clock": [],
    "queue": ["asynchronous.mode=fedbuff", "asynchronous.concurrency=100", "asynchronous.buffer_size=100"],
}


PARTS = {  # (module, class, method) -> the part of a round it is counted in
    ("raysim.engine.core", "ClientJobs", "train"): "training",
    ("raysim.engine.core", "ClientJobs", "run_call"): "calls",
    ("raysim.engine.executor", "InlineExecutor", "run"): "executor",
    ("raysim.engine.driver", "Driver", "checkpoint"): "checkpoint",  # the schedule's version files too
    ("raysim.runlog", "RunLog", "write"): "log",
    ("raysim.engine.driver", "Driver", "_server_step"): "server step",  # the queue's buffered target too
    ("raysim.engine.asynchronous", "AsyncSchedule", "_start_job"): "job starts",
}
TRAINING = {k: v for k, v in PARTS.items() if v == "training"}


def timed_rounds(variant: str, rounds: int, name: str, parts: dict) -> list[dict[str, float]]:
    """One fresh run of ``variant`` in this process with the methods of ``parts`` timed (perf_counter around each
    call, summed per part); per round 2..R-1: ``round`` (real seconds from the end of the round before to the end
    of this one: its log lines and checkpoint included, which the metrics' ``wall_s`` leaves out), ``cpu`` (this
    process's CPU seconds in it) and each part's seconds."""
    import importlib

    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    out = OUT / "system_cost" / name
    shutil.rmtree(out, ignore_errors=True)
    # engine.vectorize=off in every variant: auto's timed probe may choose another stack size in each run (it
    # changes no number, but the training's speed), and the queue's own cost is what is measured here
    cfg = load_config(str(CONFIG), ["clients.fraction=0.1", f"rounds={rounds}", f"eval.every={rounds}",
                                    "engine.vectorize=off", *VARIANTS[variant], f"log.dir={out}",
                                    "log.progress=false"])
    spent: dict[str, float] = defaultdict(float)
    depth: dict[str, int] = defaultdict(int)  # a part's calls in progress: only the outermost is counted
    saved = []
    for (module, cls, method), part in parts.items():
        owner = getattr(importlib.import_module(module), cls)
        if method not in vars(owner):
            continue
        original = vars(owner)[method]
        saved.append((owner, method, original))

        def timed(*args, _original=original, _part=part, **kwargs):
            t0 = time.perf_counter()
            depth[_part] += 1
            try:
                return _original(*args, **kwargs)
            finally:
                depth[_part] -= 1
                if not depth[_part]:  # a part's nested calls: counted once
                    spent[_part] += time.perf_counter() - t0
        setattr(owner, method, timed)
    marks = [(time.perf_counter(), time.process_time())]
    per_round: list[dict[str, float]] = []

    def on_round(_metrics: dict) -> None:
        now = (time.perf_counter(), time.process_time())
        per_round.append({"round": now[0] - marks[-1][0], "cpu": now[1] - marks[-1][1], **spent})
        marks.append(now)
        spent.clear()
    try:
        _, rows, _ = run_experiment(cfg, on_round=on_round)
    finally:
        for owner, method, original in saved:
            setattr(owner, method, original)
    shutil.rmtree(out, ignore_errors=True)
    assert len(rows) == rounds
    return per_round[1:-1]


def round_time(variant: str, rounds: int, i: int) -> tuple[float, float, float]:
    """(median real seconds, median CPU seconds of this process, median engine seconds) of rounds 2..R-1 of one
    fresh run (:func:`timed_rounds`). The engine's seconds are a round less the time spent inside
    ``ClientJobs.train`` (the clients' local training, the same work whichever variant runs it): what the driver,
    the clock and the queue cost, free of which clients each variant happens to sample (the clock samples only
    among the available ones, so the variants train different clients with different sample counts)."""
    timed = timed_rounds(variant, rounds, f"{variant}-{i}", TRAINING)
    return (statistics.median(r["round"] for r in timed), statistics.median(r["cpu"] for r in timed),
            statistics.median(r["round"] - r.get("training", 0.0) for r in timed))


def engine_parts(variant: str, rounds: int) -> dict[str, float]:
    """Median milliseconds per round of each part of the engine's time (:data:`PARTS`), over rounds 2..R-1 of one
    run; ``sums in the calls`` is the training calls' time less the training, ``executor`` the executor's calls
    less the training calls, ``rest`` the round's time less everything named."""
    rows = []
    for p in timed_rounds(variant, rounds, f"parts-{variant}", PARTS):
        row = {"round": p["round"], "training": p.get("training", 0.0),
               "sums in the calls": p.get("calls", 0.0) - p.get("training", 0.0),
               "executor": p.get("executor", 0.0) - p.get("calls", 0.0)}
        row.update({k: p.get(k, 0.0) for k in ("server step", "job starts", "checkpoint", "log")})
        row["rest"] = p["round"] - sum(v for k, v in row.items() if k != "round")
        rows.append(row)
    return {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}


MILLION = {
    "off": [],
    "diurnal": ["system.enabled=true", "system.speed.spread=10", "system.availability.mode=diurnal"],
    "diurnal+fedbuff": ["system.enabled=true", "system.speed.spread=10", "system.availability.mode=diurnal",
                        "asynchronous.mode=fedbuff", "asynchronous.concurrency=100", "asynchronous.buffer_size=100"],
}


def clock_work(rounds: int = 200) -> dict:
    """The synchronous clock's own work per round, alone: ``RoundClock.sample`` (100 of the available clients at
    the round's start) and ``settle`` (each client's traits and job time) on sync.yaml's system model, with each
    client's real sample count and the model's real bytes; CPU seconds per round, median of 5 repeats."""
    from types import SimpleNamespace

    from raysim.config import load_config
    from raysim.data import build_federated_data
    from raysim.engine.sampling import draw_clients
    from raysim.system.clock import RoundClock

    cfg = load_config(str(CONFIG), ["clients.fraction=0.1"])
    data = build_federated_data(cfg)
    clock = RoundClock(cfg, 100)
    model_bytes = 4 * (784 * 64 + 64 + 64 * 10 + 10)
    per_round = []
    for _ in range(5):
        now, t0 = 0.0, time.process_time()
        for rnd in range(1, rounds + 1):
            clients, dropped = clock.sample(rnd, now, draw_clients)
            results = {c: SimpleNamespace(upload_bytes=model_bytes, num_samples=data.num_train(c),
                                          samples_seen=2 * data.num_train(c)) for c in clients}
            now += clock.settle(results, {c: model_bytes for c in clients}, len(clients) + len(dropped)).round_s
        per_round.append((time.process_time() - t0) / rounds)
    return {"clock_cpu_s_per_round": statistics.median(per_round), "range": [min(per_round), max(per_round)]}


def million(rounds: int, variant: str) -> dict:
    out = OUT / "system_cost" / f"million-{variant.replace('+', '-')}"
    shutil.rmtree(out, ignore_errors=True)
    num = 1_000_000
    args = ["name=million", "seed=0", f"rounds={rounds}", f"clients.num={num}", f"clients.fraction={100 / num!r}",
            "data.name=synthetic", "data.samples_per_domain=500", "model.name=mlp", "model.hidden=[512]",
            "model.feature_dim=64", "train.lr=0.05", "train.batch_size=32", "algorithm.name=fedavg",
            "eval.clients=sampled", "engine.num_workers=1", f"log.dir={out}", "log.progress=false"]
    args += MILLION[variant]
    script = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
              "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script, sys.executable, "-m", "raysim", "run", *args],
                          capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
    kb = next(int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("MAXRSS_KB"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    return {"variant": variant, "peak_rss_mib": kb / 1024, "wall_s": wall, "round_wall_s": [r["wall_s"] for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=7, help="interleaved groups of (off, clock, queue)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--million", action="store_true", help="also the million-client memory check")
    parser.add_argument("--million-rounds", type=int, default=3)
    parser.add_argument("--clock-work", action="store_true", help="also the clock's own work per round, alone")
    parser.add_argument("--parts", action="store_true", help="also where the engine's time goes, off and queue")
    parser.add_argument("--skip-rounds", action="store_true", help="only the million-client memory check")
    args = parser.parse_args()
    payload: dict = {"machine": machine_info(), "load_start": loadavg()}
    if not args.skip_rounds and args.pairs > 0:
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpus: dict[str, list[float]] = {v: [] for v in VARIANTS}
        engine: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for i in range(args.pairs):
            for variant in VARIANTS:
                wall, cpu, own = round_time(variant, args.rounds, i)
                times[variant].append(wall)
                cpus[variant].append(cpu)
                engine[variant].append(own)
            print(f"group {i}: " + "  ".join(f"{v} {times[v][-1] * 1e3:.0f} ms ({cpus[v][-1] * 1e3:.0f} ms CPU, "
                                             f"{engine[v][-1] * 1e3:.1f} ms engine)" for v in VARIANTS)
                  + f"  load {loadavg():.1f}", flush=True)
        print(f"\nround time at 100 clients a round, {args.pairs} interleaved groups, median of rounds "
              f"2..{args.rounds - 1} per run; load {payload['load_start']:.1f} at the start, {loadavg():.1f} now")
        for what, table in (("wall", times), ("CPU", cpus)):
            for variant in VARIANTS:
                t = table[variant]
                line = (f"{what:4s} {variant:6s} {statistics.median(t) * 1e3:.1f} ms "
                        f"({min(t) * 1e3:.1f}–{max(t) * 1e3:.1f})")
                if variant != "off":
                    ratios = [a / b for a, b in zip(t, table["off"])]
                    line += f"  ratio to off {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})"
                print(line)
        for variant in VARIANTS:
            own = engine[variant]
            line = (f"engine {variant:6s} {statistics.median(own) * 1e3:.1f} ms a round "
                    f"({min(own) * 1e3:.1f}–{max(own) * 1e3:.1f}), outside the clients' training")
            if variant != "off":
                added = [(a - b) / w for a, b, w in zip(own, engine["off"], times["off"])]
                line += (f"; adds {statistics.median(added) * 100:+.1f} % ({min(added) * 100:+.1f} to "
                         f"{max(added) * 100:+.1f}) of off's round")
            print(line)
        payload["round_wall_s"], payload["round_cpu_s"], payload["round_engine_s"] = times, cpus, engine
    if args.parts:
        parts = {variant: engine_parts(variant, args.rounds) for variant in ("off", "queue")}
        print("\nms a round (medians of rounds 2..R-1, one run each)   " + "  ".join(f"{v:>8s}" for v in parts))
        for key in parts["off"]:
            print(f"  {key:52s} " + "  ".join(f"{parts[v][key]:8.2f}" for v in parts))
        payload["parts_ms"] = parts
    if args.clock_work:
        work = clock_work()
        print(f"the clock's own work: {work['clock_cpu_s_per_round'] * 1e3:.2f} ms CPU per 100-client round "
              f"({work['range'][0] * 1e3:.2f}–{work['range'][1] * 1e3:.2f})")
        payload["clock_work"] = work
    if args.million:
        runs = [million(args.million_rounds, variant) for variant in MILLION]
        for r in runs:
            print(f"million clients, {r['variant']:16s}: peak RSS {r['peak_rss_mib']:.0f} MiB "
                  f"(x{r['peak_rss_mib'] / runs[0]['peak_rss_mib']:.3f} of off), {r['wall_s']:.0f} s, rounds "
                  + ", ".join(f"{w:.2f}" for w in r["round_wall_s"]) + " s")
        payload["million"] = runs
    payload["load_end"] = loadavg()
    save_json("system_cost" if not args.skip_rounds else "system_cost_extra", payload)


if __name__ == "__main__":
    main()
