"""Sweeps and seed sets against the machine's throughput (issue 57).

    .venv/bin/python benchmarks/sweep_throughput.py [--trials 8] [--repeats 1] [--baseline TREE] [--no-wait]

1. A FIFO sweep and an ASHA sweep of ``--trials`` smoke trials (``experiments/sweeps/smoke-lr.yaml``, its random
   search seeded, so every tree draws the same trials), each against the ideal: the serial loop (one
   ``raysim run smoke train.lr=… train.momentum=… engine.backend=inline`` process per trial, for the rounds that
   trial ran) divided over the cores, plus one Ray start (``ray.init`` of a local Ray in a fresh process).
2. ``raysim run smoke --seeds 0-3`` against the serial loop of ``raysim run smoke seed=N``.
3. Where a trial's time goes: in a fresh process, process start, imports (torch, raysim's driver, Ray Tune), the
   smoke data built cold and again (kept: ``raysim.data.memo``) and a whole in-process run once warm; and, from a
   FIFO sweep run with a timing callback, Ray's start, Tune's start (``fit()`` to the first trial), each trial's
   time in Tune (start to end), the time a slot waits between trials (a new process or a reused one), Tune's end.

``--baseline TREE`` (a checkout of another commit, e.g. ``git archive a8cfd04 | tar -x -C /tmp/before``) measures
the sweeps, the seed set and the timing in that tree too, interleaved with this one. Every command runs with
``engine.address=local`` (its own Ray, never a cluster that ``ray start`` left on the machine).
"""

from __future__ import annotations

import argparse
import csv
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

from _common import OUT, ROOT, VENV_PY, fmt, loadavg, machine_info, save_json, summary, wait_quiet  # noqa: E402

SWEEP = "experiments/sweeps/smoke-lr.yaml"
WORK = OUT / "sweep_throughput"


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(tree)
    return env


def cli(tree: Path, *args: str) -> float:
    """Seconds for ``raysim ARGS`` (the tree's raysim) from launch to exit."""
    t0 = time.perf_counter()
    proc = subprocess.run([str(VENV_PY), "-m", "raysim.cli", *args], cwd=tree, env=_env(tree),
                          capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"raysim {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return took


def python(tree: Path, code: str) -> Any:
    """The JSON a snippet prints last, run in a fresh interpreter with the tree's raysim."""
    proc = subprocess.run([str(VENV_PY), "-c", code], cwd=tree, env=_env(tree), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"snippet exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sweep(tree: Path, scheduler: str, trials: int, out: Path) -> tuple[float, list[dict]]:
    """Seconds for the sweep and its trials' rows (searched values, rounds run)."""
    shutil.rmtree(out, ignore_errors=True)
    took = cli(tree, "tune", SWEEP, f"scheduler.name={scheduler}", f"num_samples={trials}", "search.seed=0",
               f"dir={out}", "engine.address=local", "--quiet")
    rows = [{"lr": r["train.lr"], "momentum": r["train.momentum"], "rounds": int(r["rounds"].split("/")[0])}
            for r in csv.DictReader(open(out / "results.csv"))]
    shutil.rmtree(out, ignore_errors=True)
    return took, rows


def serial_loop(tree: Path, runs: list[list[str]], out: Path) -> float:
    """Seconds for one ``raysim run smoke`` process per item of ``runs`` (its overrides), one after another."""
    t0 = time.perf_counter()
    for i, overrides in enumerate(runs):
        shutil.rmtree(out / str(i), ignore_errors=True)
        cli(tree, "run", "smoke", *overrides, f"log.dir={out / str(i)}", "engine.address=local", "--quiet")
    took = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return took


RAY_START = """
import json, logging, time
from raysim.engine.resources import init_local_ray, end_private_ray
t = time.perf_counter(); init_local_ray(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
took = time.perf_counter() - t; end_private_ray(); print(json.dumps(took))
"""

PARTS = """
import json, shutil, time
t = time.perf_counter(); import torch, raysim.engine.driver, ray.tune, raysim.tune.trials
imports = time.perf_counter() - t
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.engine.runner import run_experiment
cfg = lambda d: load_config("experiments/smoke.yaml", [f"log.dir={d}", "engine.backend=inline", "log.progress=false"])
t = time.perf_counter(); build_federated_data(cfg(None)); cold = time.perf_counter() - t
t = time.perf_counter(); build_federated_data(cfg(None)); warm = time.perf_counter() - t
runs = []
for i in range(3):
    shutil.rmtree(f"{OUT}/run{i}", ignore_errors=True)
    t = time.perf_counter(); _, rows, _ = run_experiment(cfg(f"{OUT}/run{i}"))
    runs.append([time.perf_counter() - t, rows[-1]["wall_s_total"]])
print(json.dumps({"imports_s": imports, "data_cold_s": cold, "data_kept_s": warm, "run_first_s": runs[0][0],
                  "run_warm_s": min(r[0] for r in runs[1:]), "rounds_s": min(r[1] for r in runs[1:])}))
"""

TIMED_SWEEP = """
import json, time, importlib
from ray import tune
from ray.tune import Callback
import raysim.engine.resources as res
from raysim.tune import load_sweep
rn = importlib.import_module("raysim.tune.running")
marks = {}
def wrap(obj, name, label):
    orig = getattr(obj, name)
    def f(*a, **k):
        marks[label + "<"] = time.perf_counter(); r = orig(*a, **k); marks[label + ">"] = time.perf_counter(); return r
    setattr(obj, name, f)
wrap(res, "init_local_ray", "ray"); wrap(tune.Tuner, "fit", "fit")
events = []
def note(kind, trial, pid=None):
    events.append((kind, trial.trial_id, time.perf_counter(), pid))
class Timing(Callback):
    def on_trial_start(self, iteration, trials, trial, **info): note("start", trial)
    def on_trial_result(self, iteration, trials, trial, result, **info): note("result", trial, result.get("pid"))
    def on_trial_complete(self, iteration, trials, trial, **info): note("end", trial)
t0 = time.perf_counter()
spec = load_sweep("%(sweep)s", ["scheduler.name=fifo", "num_samples=%(trials)d", "search.seed=0", "dir=%(out)s",
                                 "engine.address=local"])
rn.run_sweep(spec, quiet=True, out=lambda s: None, callbacks=[Timing()])
print(json.dumps({"t0": t0, "end": time.perf_counter(), "marks": marks, "events": events}))
"""


def timed_sweep(tree: Path, trials: int, out: Path) -> dict[str, Any]:
    """A FIFO sweep in a fresh process with a timing callback: its phases, and each trial's time in Tune."""
    shutil.rmtree(out, ignore_errors=True)
    raw = python(tree, TIMED_SWEEP % {"sweep": SWEEP, "trials": trials, "out": out})
    rounds = [json.loads(p.read_text().splitlines()[-1])["wall_s_total"] for p in out.glob("trials/*/metrics.jsonl")]
    shutil.rmtree(out, ignore_errors=True)
    m, ev = raw["marks"], raw["events"]
    start = {t: at for kind, t, at, _ in ev if kind == "start"}
    end = {t: at for kind, t, at, _ in ev if kind == "end"}
    pid = {t: p for kind, t, _, p in ev if kind == "result"}
    # a slot's wait between trials: from a trial's end to the next start in the same process (reused), or, for a
    # new process, to the next start after it (the new process starting, importing, Tune placing the trial)
    order = sorted(start, key=start.get)
    gaps = [start[b] - max(e for e in end.values() if e <= start[b]) for b in order[2:]
            if any(e <= start[b] for e in end.values())]
    return {"ray_start_s": m["ray>"] - m["ray<"], "before_fit_s": m["fit<"] - m["ray>"],
            "tune_start_s": min(start.values()) - m["fit<"], "trial_in_tune_s": summary(end[t] - start[t] for t in end),
            "slot_wait_s": summary(gaps), "tune_end_s": m["fit>"] - max(end.values()),
            "after_fit_s": raw["end"] - m["fit>"], "total_s": raw["end"] - raw["t0"],
            "rounds_s": summary(rounds), "processes": len(set(pid.values()))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--baseline", type=Path, help="another checkout to measure beside this one")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    ap.add_argument("--only", default="fifo,asha,seeds,parts",
                    help="what to measure, of fifo, asha, seeds, parts (the split of a trial's time)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    trees = {"now": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    cores = os.cpu_count() or 1
    got: dict[str, Any] = {"machine": machine_info(), "cores": cores, "trials": args.trials, "trees": {
        k: str(v) for k, v in trees.items()}, "repeats": []}
    for rep in range(args.repeats):
        row: dict[str, Any] = {"load_at_start": wait_quiet(enabled=not args.no_wait)}
        if only & {"fifo", "asha"}:
            row["ray_start_s"] = python(ROOT, RAY_START)
        for scheduler in [s for s in ("fifo", "asha") if s in only]:
            for name, tree in trees.items():
                took, trials = sweep(tree, scheduler, args.trials, WORK / f"{scheduler}-{name}")
                row[f"{scheduler}_{name}_s"], row[f"{scheduler}_{name}_rounds"] = took, [t["rounds"] for t in trials]
                if name == "now":
                    runs = [[f"train.lr={t['lr']}", f"train.momentum={t['momentum']}", f"rounds={t['rounds']}",
                             "engine.backend=inline"] for t in trials]
            row[f"{scheduler}_loop_s"] = serial_loop(ROOT, runs, WORK / "loop")
            row[f"{scheduler}_ideal_s"] = row[f"{scheduler}_loop_s"] / cores + row["ray_start_s"]
            print(f"[{rep}] {scheduler}: " + ", ".join(f"{name} {row[f'{scheduler}_{name}_s']:.1f} s" for name in trees)
                  + f"; serial loop {row[f'{scheduler}_loop_s']:.1f} s, ideal {row[f'{scheduler}_ideal_s']:.1f} s "
                  f"(load {loadavg():.1f})", flush=True)
        if "seeds" in only:
            for name, tree in trees.items():
                shutil.rmtree(WORK / "seeds", ignore_errors=True)
                row[f"seeds_{name}_s"] = cli(tree, "run", "smoke", "--seeds", "0-3", f"log.dir={WORK / 'seeds'}",
                                             "engine.address=local", "--quiet")
            row["seeds_loop_s"] = serial_loop(ROOT, [[f"seed={s}"] for s in range(4)], WORK / "loop")
            print(f"[{rep}] seeds 0-3: " + ", ".join(f"{name} {row[f'seeds_{name}_s']:.1f} s" for name in trees)
                  + f"; serial loop {row['seeds_loop_s']:.1f} s (load {loadavg():.1f})", flush=True)
        if "parts" in only:
            row["process_start_s"] = min(_bare_start() for _ in range(3))
            row["parts"] = python(ROOT, f"OUT = {str(WORK)!r}\n" + PARTS)
            row["timed"] = {name: timed_sweep(tree, args.trials, WORK / f"timed-{name}")
                            for name, tree in trees.items()}
            print(f"[{rep}] parts: process start {row['process_start_s']:.2f} s; " + ", ".join(
                f"{k} {v:.3f} s" for k, v in row["parts"].items()), flush=True)
            for name, timed in row["timed"].items():
                print(f"[{rep}] timed FIFO sweep ({name}): " + ", ".join(
                    f"{k} {fmt(v, digits=2) if isinstance(v, dict) else round(v, 2)}" for k, v in timed.items()),
                    flush=True)
        row["load_at_end"] = loadavg()
        got["repeats"].append(row)
    _report(got, trees, only)
    print(f"results in {save_json('sweep_throughput', got)}")
    shutil.rmtree(WORK, ignore_errors=True)
    return 0


def _bare_start() -> float:
    t0 = time.perf_counter()
    subprocess.run([str(VENV_PY), "-c", "pass"], check=True)
    return time.perf_counter() - t0


def _report(got: dict[str, Any], trees: dict[str, Path], only: set[str]) -> None:
    reps = got["repeats"]
    for scheduler in [s for s in ("fifo", "asha") if s in only]:
        ideal = fmt(summary(r[f"{scheduler}_ideal_s"] for r in reps), digits=1)
        for name in trees:
            ratio = summary(r[f"{scheduler}_{name}_s"] / r[f"{scheduler}_ideal_s"] for r in reps)
            took = fmt(summary(r[f"{scheduler}_{name}_s"] for r in reps), digits=1)
            print(f"{scheduler} sweep of {got['trials']} ({name}): {took} s = {fmt(ratio, digits=2)} x the ideal "
                  f"{ideal} s")
    for name in trees if "seeds" in only else ():
        ratio = summary(r[f"seeds_{name}_s"] / r["seeds_loop_s"] for r in reps)
        print(f"seeds 0-3 ({name}): {fmt(summary(r[f'seeds_{name}_s'] for r in reps), digits=1)} s = "
              f"{fmt(ratio, digits=2)} x the serial loop {fmt(summary(r['seeds_loop_s'] for r in reps), digits=1)} s")


if __name__ == "__main__":
    sys.exit(main())
