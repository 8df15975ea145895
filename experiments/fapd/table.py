"""Markdown table of a FAPD comparison: best acc_global (mean ± std over seeds) and rounds to reach a target.

    python experiments/fapd/table.py runs/fapd-digits --target 0.85

Run directories are named VARIANT-sSEED (as the commands in experiments/fapd/README.md make them).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="directory holding VARIANT-sSEED run directories")
    ap.add_argument("--target", type=float, default=0.85, help="acc_global to reach (a fraction)")
    args = ap.parse_args()
    runs: dict[str, list[list[dict]]] = defaultdict(list)
    for run in sorted(p for p in args.root.iterdir() if (p / "metrics.jsonl").is_file()):
        m = re.fullmatch(r"(.+)-s(\d+)", run.name)
        if m:
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
            runs[m.group(1)].append([r for r in rows if r.get("acc_global") is not None])
    print(f"| method | seeds | best acc_global (mean ± std) | final acc_global | rounds to {args.target:.2f} "
          f"(mean ± std; runs that reached it) | final k |")
    print("|---|---|---|---|---|---|")
    order = ["fedavg", "fapd", "fapd-nadpt", "fapd-ncont"]
    for name, seeds in sorted(runs.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 9, kv[0])):
        best = [max(r["acc_global"] for r in rows) for rows in seeds]
        final = [rows[-1]["acc_global"] for rows in seeds]
        reach = [next((r["round"] for r in rows if r["acc_global"] >= args.target), None) for rows in seeds]
        hit = [r for r in reach if r is not None]
        ks = sorted({rows[-1].get("k") for rows in seeds if rows[-1].get("k") is not None})
        print(f"| {name} | {len(seeds)} | {_ms(best)} | {_ms(final)} | "
              f"{_ms(hit, '.1f') if hit else '—'} ({len(hit)}/{len(seeds)}) | {', '.join(map(str, ks)) or '—'} |")


def _ms(values: list[float], fmt: str = ".4f") -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{fmt}} ± {sd:{fmt}}"


if __name__ == "__main__":
    main()
