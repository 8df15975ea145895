"""Start-up: where the seconds before round 1 go, for one `raysim run` and for many runs in one Ray session.

    .venv/bin/python benchmarks/startup.py [--repeats 3] [--session-runs 4] [--no-wait]

1. ``raysim run`` launched as a subprocess (the overhead benchmark's CNN workload, 2 workers): seconds from launch
   to the driver being ready (the CLI's ``raysim: ...`` line), to the end of round 1, and to exit.
2. Several tiny runs one after another in one Ray session, as the test suite, ``raysim run --seeds`` and a Tune
   search do: seconds per run with 1 and with 2 workers. The first run of a session can use the processes Ray
   prestarted; every later one starts its driver's and workers' processes cold (a Ray actor's process ends with it).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, ROOT, fmt, loadavg, machine_info, save_json, start_ray, summary, wait_quiet  # noqa: E402
from overhead import overrides  # noqa: E402 - the same CNN workload as the overhead benchmark's launches

TINY = ["name=startup-tiny", "rounds=2", "clients.num=4", "data.name=sklearn_digits", "data.partition=iid",
        "model.name=mlp", "model.hidden=[32]", "model.feature_dim=16", "train.lr=0.1"]


def launch(run_dir: Path) -> dict[str, float]:
    """One ``raysim run`` subprocess; seconds from launch to each phase.

    Not ``_common.run_cli`` (one marker): this script times older commits too (the A/B in RESULTS.md), with their
    own ``_common.py``, so it uses only what that file has always had."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [str(ROOT / ".venv" / "bin" / "raysim"), "run", *overrides("cnn"), "engine.num_workers=2",
           f"log.dir={run_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks: dict[str, float] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        for key, marker in (("driver_ready_s", "raysim: "), ("round1_s", "round 1/")):
            if marker in line and key not in marks:
                marks[key] = time.perf_counter() - t0
    rc = proc.wait()
    marks["exit_s"] = time.perf_counter() - t0
    shutil.rmtree(run_dir, ignore_errors=True)
    if rc != 0 or len(marks) != 3:
        raise RuntimeError(f"raysim run exited {rc} (phases seen: {sorted(marks)})")
    return marks


def session_runs(workers: int, runs: int) -> list[float]:
    """Seconds for each of ``runs`` tiny runs in this script's Ray session."""
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    times = []
    for i in range(runs):
        run_dir = OUT / f"startup-session-w{workers}-{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        cfg = load_config(None, TINY + [f"engine.num_workers={workers}", f"log.dir={run_dir}"])
        t0 = time.perf_counter()
        run_experiment(cfg)
        times.append(time.perf_counter() - t0)
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"[startup] session run {i}, {workers} worker(s): {times[-1]:.2f}s", flush=True)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="`raysim run` launches")
    p.add_argument("--session-runs", type=int, default=4, help="tiny runs per worker count in one Ray session")
    p.add_argument("--no-wait", action="store_true")
    args = p.parse_args(argv)
    info = machine_info()
    print(f"[startup] {info}", flush=True)
    result: dict[str, Any] = {"machine": info, "launch": [], "session": {}}

    for i in range(args.repeats):
        load = wait_quiet(enabled=not args.no_wait)
        result["launch"].append(launch(OUT / f"startup-launch-{i}") | {"load_before": load})
        print(f"[startup] launch {i} (load {load:.2f}): " + "  ".join(
            f"{k} {v:.2f}" for k, v in result["launch"][-1].items() if k != "load_before"), flush=True)

    result["load_before_session"] = wait_quiet(enabled=not args.no_wait)
    start_ray(num_cpus=2)
    import ray

    try:
        for w in (1, 2):
            result["session"][f"w{w}"] = session_runs(w, args.session_runs)
    finally:
        ray.shutdown()
    result["load_after"] = loadavg()

    path = save_json("startup", result)
    print(f"\n[startup] results in {path}")
    for key in ("driver_ready_s", "round1_s", "exit_s"):
        print(f"launch -> {key[:-2]}: {fmt(summary(l[key] for l in result['launch']), 1, 2)} s")
    for w, times in result["session"].items():
        print(f"session, {w}: first run {times[0]:.2f} s; later runs {fmt(summary(times[1:]), 1, 2)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
