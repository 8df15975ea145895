"""Secure aggregation's tables (README, docs/reference.md *What travels*), three seeds each:

1. accuracy: FedAvg on experiments/compression/mnist100.yaml with and without secure aggregation (a 32-bit ring,
   the most fractional bits that fit), and QSGD at 4 bits with its levels summed in an 8-bit ring against the same
   levels in a 32-bit ring: final acc_global, the largest difference at any evaluation, and the bytes up a round;
2. overhead: experiments/secagg/mnist1000.yaml at 100 and 1,000 clients a round (clients.fraction 0.1, 1.0), plain,
   SecAgg (every client masks with every other) and SecAgg+ (k = 2 ceil(log2 n) neighbours): bytes up and down a
   client and a round's simulated seconds, and their ratio to the plain round.

    PYTHONPATH=. nice -n 10 python experiments/secagg/table.py [--out runs/secagg] [--seeds 0-2]

Every run is in this process (engine.backend=inline); a run already finished under --out is read, not run again.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from raysim.runlog import read_metrics

HERE = Path(__file__).resolve().parent
BASE = HERE.parent / "compression" / "mnist100.yaml"
QSGD = ["compression.up=qsgd", "compression.bits=4", "algorithm.weighting=uniform", "secagg.range=0.1"]
ACCURACY: dict[str, tuple[str, list[str], list[str]]] = {  # label: (its reference, its overrides, secure's)
    "FedAvg, float32 values in a 32-bit ring": ("FedAvg in the clear", [], ["secagg.enabled=true"]),
    "QSGD 4 bits on the shared scale, in an 8-bit ring": ("the same in a 32-bit ring",
                                                          [*QSGD, "secagg.enabled=true", "secagg.bits=32"],
                                                          [*QSGD, "secagg.enabled=true", "secagg.bits=8"]),
}
SIZES = {"100": 0.1, "1,000": 1.0}


def rows_of(run_dir: Path) -> list[dict] | None:
    """A finished run's rows (its last round evaluated), or None: not run, or stopped before its end."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    return rows if rows and rows[-1].get("acc_global") is not None else None


def run_one(run_dir: Path, config: Path, overrides: list[str]) -> list[dict]:
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    rows = rows_of(run_dir)
    if rows is None:
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        run_experiment(load_config(config, [*overrides, f"log.dir={run_dir}"], warn=False))
        rows = rows_of(run_dir)
    assert rows is not None, run_dir
    return rows


def cell(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def accuracy_table(out: Path, seeds: list[int]) -> None:
    print("| secure aggregation of | reference | its accuracy | with secure aggregation | largest difference | "
          "bytes up a round (reference, secure) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i, (label, (reference, clear, masked)) in enumerate(ACCURACY.items()):
        plain = [run_one(out / f"acc{i}-reference-s{s}", BASE, [*clear, f"seed={s}"]) for s in seeds]
        secure = [run_one(out / f"acc{i}-secure-s{s}", BASE, [*masked, f"seed={s}"]) for s in seeds]
        gap = max(abs(a["acc_global"] - b["acc_global"]) for p, q in zip(plain, secure) for a, b in zip(p, q)
                  if a.get("acc_global") is not None)
        print(f"| {label} | {reference} | {cell([r[-1]['acc_global'] for r in plain])} | "
              f"{cell([r[-1]['acc_global'] for r in secure])} | {gap:.4f} | "
              f"{plain[0][0]['bytes_up'] / 1e6:.3f} MB, {secure[0][0]['bytes_up'] / 1e6:.3f} MB |")


def overhead_table(out: Path, seeds: list[int]) -> None:
    config = HERE / "mnist1000.yaml"
    print("| clients a round | protocol | bytes up a client | bytes down a client | simulated seconds a round |")
    print("| --- | --- | --- | --- | --- |")
    for size, fraction in SIZES.items():
        n = round(1000 * fraction)
        k = 2 * math.ceil(math.log2(n))
        protocols = {"plain": [], "SecAgg": ["secagg.enabled=true"],
                     f"SecAgg+ (k = {k})": ["secagg.enabled=true", f"secagg.neighbours={k}"]}
        plain: dict = {}
        for name, extra in protocols.items():
            runs = [run_one(out / f"n{n}-{name.split()[0].replace('+', 'plus').lower()}-s{s}", config,
                            [f"clients.fraction={fraction}", *extra, f"seed={s}"]) for s in seeds]
            rows = [row for r in runs for row in r]
            up = statistics.mean(row["bytes_up"] / max(row["clients"], 1) for row in rows)
            down = statistics.mean(row["bytes_down"] / max(row["clients"], 1) for row in rows)
            sim = statistics.mean(row["round_sim_s"] for row in rows)
            if not plain:
                plain = {"up": up, "down": down, "sim": sim}
                print(f"| {size} | {name} | {up / 1e3:,.1f} kB | {down / 1e3:,.1f} kB | {sim:.3f} s |")
            else:
                print(f"| {size} | {name} | {up / 1e3:,.1f} kB ({up / plain['up']:.2f}x) | "
                      f"{down / 1e3:,.1f} kB ({down / plain['down']:.2f}x) | {sim:.3f} s ({sim / plain['sim']:.2f}x) |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/secagg")
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--tables", default="accuracy,overhead")
    args = parser.parse_args()
    low, _, high = args.seeds.partition("-")
    seeds = list(range(int(low), int(high or low) + 1))
    out, start = Path(args.out), time.perf_counter()
    if "accuracy" in args.tables:
        accuracy_table(out, seeds)
        print()
    if "overhead" in args.tables:
        overhead_table(out, seeds)
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
