"""FedAvg with each upload compressor, over three seeds: the table of final accuracy against total bytes up, and the
plot of accuracy against bytes up (README, docs/reference.md *What travels*).

    PYTHONPATH=. nice -n 10 python experiments/compression/table.py [--out runs/compression] [--seeds 0-2]

Every run is experiments/compression/mnist100.yaml with the row's compression.* and the seed overridden, in this
process (engine.backend=inline); a run already finished under --out is read, not run again. The table gives the final
acc_global (the global model on every client's test split) as mean ± std over the seeds, the total bytes the
clients uploaded over the run (the encodings' exact bytes, the same for every seed but random-k's), and that total
against uncompressed FedAvg's; the plot, each row's mean accuracy at every evaluation against its bytes up so far.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

from raysim.runlog import read_metrics

HERE = Path(__file__).resolve().parent
# a row: its label and its overrides
ROWS: dict[str, list[str]] = {
    "none (float32)": [],
    "top-k 10 %": ["compression.up=topk", "compression.ratio=0.1"],
    "top-k 10 % + error feedback": ["compression.up=topk", "compression.ratio=0.1", "compression.error_feedback=true"],
    "top-k 1 %": ["compression.up=topk", "compression.ratio=0.01"],
    "top-k 1 % + error feedback": ["compression.up=topk", "compression.ratio=0.01", "compression.error_feedback=true"],
    "QSGD 8 bits": ["compression.up=qsgd", "compression.bits=8"],
    "QSGD 4 bits": ["compression.up=qsgd", "compression.bits=4"],
    "QSGD 2 bits": ["compression.up=qsgd", "compression.bits=2"],
    "scaled sign + error feedback": ["compression.up=sign", "compression.error_feedback=true"],
}


def slug(label: str) -> str:
    return re.sub("-+", "-", "".join(c if c.isalnum() else "-" for c in label.lower())).strip("-")


def rows_of(run_dir: Path) -> list[dict] | None:
    """A finished run's rows (its last round evaluated), or None: not run, or stopped before its end."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    return rows if rows and rows[-1].get("acc_global") is not None else None


def run_one(out: Path, label: str, seed: int, config: Path = HERE / "mnist100.yaml") -> list[dict]:
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    run_dir = out / f"{slug(label)}-s{seed}"
    rows = rows_of(run_dir)
    if rows is None:
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        cfg = load_config(config, [*ROWS[label], f"seed={seed}", f"log.dir={run_dir}"], warn=False)
        run_experiment(cfg)
        rows = rows_of(run_dir)
    assert rows is not None, run_dir
    return rows


def cell(values: list[float]) -> str:
    return f"{values[0]:.3f}" if len(values) == 1 else f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def plot(curves: dict[str, tuple[list[float], list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, (mb, acc) in curves.items():
        style = "--" if "error feedback" in label else "-"
        ax.plot(mb, acc, style, marker="o", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("total bytes up (MB, log scale)")
    ax.set_ylabel("accuracy of the global model")
    ax.set_title("FedAvg, 100 MNIST clients, 10 a round, 50 rounds (mean of 3 seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/compression")
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated labels of ROWS")
    parser.add_argument("--plot", default=str(HERE / "accuracy-vs-bytes.png"))
    args = parser.parse_args()
    low, _, high = args.seeds.partition("-")
    seeds = list(range(int(low), int(high or low) + 1))
    out, start = Path(args.out), time.perf_counter()
    results = {label: [run_one(out, label, seed) for seed in seeds] for label in args.rows.split(",")}
    base = statistics.mean(runs[-1]["bytes_up_total"] for runs in results[next(iter(results))])
    print("| upload | final accuracy (3 seeds) | total bytes up | against float32 |")
    print("| --- | --- | --- | --- |")
    curves = {}
    for label, runs in results.items():
        total = statistics.mean(r[-1]["bytes_up_total"] for r in runs)
        print(f"| {label} | {cell([r[-1]['acc_global'] for r in runs])} | {total / 1e6:.2f} MB | "
              f"{base / total:.1f}x smaller |" if total < base else
              f"| {label} | {cell([r[-1]['acc_global'] for r in runs])} | {total / 1e6:.2f} MB | 1x |")
        evaluated = [i for i, row in enumerate(runs[0]) if row.get("acc_global") is not None]
        curves[label] = ([statistics.mean(r[i]["bytes_up_total"] for r in runs) / 1e6 for i in evaluated],
                         [statistics.mean(r[i]["acc_global"] for r in runs) for i in evaluated])
    plot(curves, Path(args.plot))
    print(f"\n{len(results) * len(seeds)} runs in {time.perf_counter() - start:.0f} s; plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
