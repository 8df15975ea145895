"""What ``privacy.target_epsilon`` adds before round 1: calibrating DP-FedAvg's noise multiplier (issue 52, item 7).

    .venv/bin/python benchmarks/calibration.py [--repeats 3] [--no-wait] [--no-launch]

On the shipped DP config (``experiments/privacy/dpfedavg-mnist500.yaml``: 500 clients, 100 a round without
replacement, 30 rounds, RDP with replace-one neighbours, δ = 0.01/500), for target ε 1, 4 and 8:

1. In process, what the privacy stage does before any worker starts (``CentralDPStage.prepare``): with the target,
   the calibration and the accountant (``target_s``); with the noise multiplier given (the z the calibration found),
   the accountant alone (``given_s``). ``adds_s`` = target_s - given_s, the issue's target: at most 2 s. Beside it,
   dp-accounting's ``calibrate_dp_mechanism`` over every RDP order, the calibration before issue 52
   (``every_order_s``), and the two z.
2. ``raysim run ... rounds=1`` launched as a subprocess with the target and with the noise multiplier given:
   seconds from launch to the end of round 1 (``round 1/`` on stdout), the issue's own measure (18.9 s against 7.1 s
   before, on a quiet machine).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import OUT, ROOT, loadavg, machine_info, save_json, summary, wait_quiet  # noqa: E402

CONFIG = ROOT / "experiments" / "privacy" / "dpfedavg-mnist500.yaml"


def in_process(target: float, repeats: int) -> dict:
    import dp_accounting as dpa

    from raysim.config import load_config
    from raysim.privacy import accounting
    from raysim.privacy.stage import CentralDPStage

    cfg = load_config(str(CONFIG), [f"privacy.target_epsilon={target}"], warn=False)
    times, z = [], None
    for _ in range(repeats):
        stage = CentralDPStage(cfg)
        t0 = time.perf_counter()
        stage.prepare()
        times.append(time.perf_counter() - t0)
        z = stage.central.z
    given_cfg = load_config(str(CONFIG), [f"privacy.noise_multiplier={z}"], warn=False)
    given = []
    for _ in range(repeats):
        stage = CentralDPStage(given_cfg)
        t0 = time.perf_counter()
        stage.prepare()
        given.append(time.perf_counter() - t0)
    t0 = time.perf_counter()  # once: the search before issue 52, over every order (~20 evaluations)
    with accounting._quiet():
        old = dpa.calibrate_dp_mechanism(
            lambda: accounting.fresh_accountant(cfg),
            lambda x: dpa.SelfComposedDpEvent(accounting.round_event(cfg, x), cfg.rounds),
            target, accounting.delta_of(cfg), dpa.ExplicitBracketInterval(1e-3, 1000.0), tol=1e-4)
    every = time.perf_counter() - t0
    t_med, g_med = summary(times)["median"], summary(given)["median"]
    return {"target": target, "z": z, "z_every_order": old, "target_s": summary(times), "given_s": summary(given),
            "adds_s": t_med - g_med, "every_order_s": every}


def launch(extra: str, run_dir: Path) -> float:
    """Seconds from launching ``raysim run`` (one round) to its round-1 line."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [str(ROOT / ".venv" / "bin" / "raysim"), "run", str(CONFIG), "rounds=1", extra, f"log.dir={run_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("round 1/") and seen is None:
            seen = time.perf_counter() - t0
    rc = proc.wait()
    shutil.rmtree(run_dir, ignore_errors=True)
    if rc != 0 or seen is None:
        raise RuntimeError(f"raysim run {extra} exited {rc}")
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-wait", action="store_true")
    parser.add_argument("--no-launch", action="store_true")
    args = parser.parse_args()
    out: dict = {"machine": machine_info(), "in_process": [], "launch": {}}
    for target in (1.0, 4.0, 8.0):
        load = wait_quiet(enabled=not args.no_wait)
        row = in_process(target, args.repeats)
        row["load"] = load
        out["in_process"].append(row)
        print(f"target ε {target:g}: z {row['z']:.4f} (every order {row['z_every_order']:.4f}); prepare "
              f"{row['target_s']['median']:.2f} s with the target, {row['given_s']['median']:.2f} s with z given: "
              f"adds {row['adds_s']:.2f} s; every order's search {row['every_order_s']:.1f} s (load {load:.1f})",
              flush=True)
    if not args.no_launch:
        z4 = out["in_process"][1]["z"]
        for name, extra in (("target", "privacy.target_epsilon=4"), ("given", f"privacy.noise_multiplier={z4}")):
            load = wait_quiet(enabled=not args.no_wait)
            secs = [launch(extra, OUT / "calibration-run") for _ in range(args.repeats)]
            out["launch"][name] = {"round1_s": summary(secs), "load": load, "load_after": loadavg()}
            print(f"raysim run rounds=1, {name}: launch to round 1 {summary(secs)['median']:.1f} s (median of "
                  f"{len(secs)}, load {load:.1f})", flush=True)
    save_json("calibration", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
