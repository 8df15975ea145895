"""The curriculum study's per-seed results, compactly: what docs/curriculum-study.md rests on, as CSV.

    .venv/bin/python experiments/sweeps/curriculum-study-data.py runs/study docs/curriculum-study/data

Reads the run directories that experiments/sweeps/curriculum-study.sh writes (STUDY) and writes to OUT what they
hold (a part the study did not reach is left out, and so is a run that stopped before its last round):

  unideal-search.csv, fapd-search.csv   every trial of the two searches: its settings, best metric, rounds run
  seeds.csv         every 5-seed rerun: experiment (niid1, niid2, fapd), method, seed, best acc_mean, best
                    acc_global, the offline teacher's accuracy and the last round's k (FAPD)
  scale.csv         the paired data-size grid: samples per domain, schedule shape, seed, best acc_mean

Per-round curves are not written: the document's plots are committed as images, and no number it prints needs them.

tests/test_curriculum_study.py recomputes every mean, difference, p-value and Holm value of the document from these
files with raysim report's own statistics. Values are written with 10 significant digits.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, Optional

import yaml

SEED_SETS = {"niid1": "niid1", "niid2": "niid2", "fapd": "fapd"}  # experiment -> directory under STUDY


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def best(rows: list[dict], key: str) -> Optional[float]:
    values = [r[key] for r in rows if r.get(key) is not None]
    return max(values) if values else None


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def write(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([cell(row.get(c)) for c in columns])
    print(f"wrote {path} ({len(rows)} rows)")


def search(results: Path) -> tuple[list[str], list[dict]]:
    """A sweep's results.csv without its run directories (trial ids kept: Tune's, stable for a seeded search)."""
    with open(results) as fh:
        rows = list(csv.DictReader(fh))
    columns = [c for c in rows[0] if c not in ("run_dir",)]
    return columns, [{c: r[c] for c in columns} for r in rows]


def finished(run_dir: Path) -> bool:
    """The run reached its configured last round."""
    rows = rows_of(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    rounds = yaml.safe_load((run_dir / "config.yaml").read_text())["rounds"]
    return bool(rows) and rows[-1]["round"] == rounds


def seed_dirs(method_dir: Path) -> list[tuple[int, Path]]:
    return [(int(d.name.split("-", 1)[1]), d) for d in sorted(method_dir.glob("seed-*")) if finished(d)]


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    study, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name, folder in (("unideal-search", "unideal-niid1-search"), ("fapd-search", "fapd-search")):
        if (study / folder / "results.csv").is_file():
            columns, rows = search(study / folder / "results.csv")
            write(out / f"{name}.csv", columns, rows)
    seeds = []
    for experiment, folder in SEED_SETS.items():
        if not (study / folder).is_dir():
            continue
        for method_dir in sorted(p for p in (study / folder).iterdir() if p.is_dir()):
            for seed, run in seed_dirs(method_dir):
                rows = rows_of(run)
                last = rows[-1]
                seeds.append({"experiment": experiment, "method": method_dir.name, "seed": seed,
                              "rounds": len(rows), "best_acc_mean": best(rows, "acc_mean"),
                              "best_acc_global": best(rows, "acc_global"),
                              "teacher_acc": last.get("curriculum/teacher_acc"), "final_k": last.get("k")})
    write(out / "seeds.csv", ["experiment", "method", "seed", "rounds", "best_acc_mean", "best_acc_global",
                              "teacher_acc", "final_k"], seeds)
    if not (study / "unideal-scale" / "results.csv").is_file():
        return
    scale = []
    with open(study / "unideal-scale" / "results.csv") as fh:
        for r in csv.DictReader(fh):
            scale.append({"samples_per_domain": int(r["data.samples_per_domain"]),
                          "shape": r["algorithm.schedule.shape"], "seed": int(r["seed"]),
                          "best_acc_mean": best(rows_of(Path(r["run_dir"])), "acc_mean")})
    scale.sort(key=lambda r: (r["samples_per_domain"], r["shape"], r["seed"]))
    write(out / "scale.csv", ["samples_per_domain", "shape", "seed", "best_acc_mean"], scale)


if __name__ == "__main__":
    main()
