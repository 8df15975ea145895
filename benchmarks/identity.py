"""Every built-in algorithm's tiny run under every execution setting, its metrics written to one JSON file, so that
an engine change can be checked bit for bit against the commit before it:

    python benchmarks/identity.py --out before.json          # at the old commit
    python benchmarks/identity.py --out after.json --compare before.json

The settings: in process and on Ray (1 and 2 workers), partial sums on (groups of 3 and of 1) and off, calls of 3
clients, vectorised cohorts of 4 where the algorithm declares them. 12 clients, 9 sampled a round, 2 rounds. Every
metric but wall-clock times must be equal, and (``--compare``) equal to the file given. ``auto-groups`` runs
``engine.sum_group=auto``'s own groups: with ``--moved``, each metric's largest change from the file given is
printed instead (a change of the auto grouping moves the last float bits on purpose). A worker killed mid-job is
checked by the test suite (``helpers.killed_worker_matches_inline``), not here.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from engine.test_executor import ALGORITHM_TINY  # noqa: E402
from helpers import read_rows, strip_timing, tiny_overrides  # noqa: E402

SETTINGS: dict[str, dict] = {
    "inline": {"engine__backend": "inline"},
    "inline-nopartial": {"engine__backend": "inline", "engine__partial_sums": "false"},
    "inline-groups1": {"engine__backend": "inline", "engine__sum_group": 1},
    "inline-vec4": {"engine__backend": "inline", "engine__vectorize": 4},
    "ray1": {"engine__backend": "ray", "engine__num_workers": 1},
    "ray2": {"engine__backend": "ray", "engine__num_workers": 2},
    "ray2-nopartial": {"engine__backend": "ray", "engine__num_workers": 2, "engine__partial_sums": "false"},
    "ray2-calls3": {"engine__backend": "ray", "engine__num_workers": 2, "engine__clients_per_call": 3},
    "ray2-vec4": {"engine__backend": "ray", "engine__num_workers": 2, "engine__vectorize": 4},
    # engine.sum_group=auto's own groups (the others fix groups of 3): other groups, so other float bits; its
    # own file, compared across commits with --moved
    "auto-groups": {"engine__backend": "inline", "engine__sum_group": "auto"},
}
APART = ("auto-groups",)  # settings whose numbers are not the reference's: compared across commits only


def run(algorithm: str, setting: dict, work: Path) -> list[dict]:
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    extra = {**ALGORITHM_TINY.get(algorithm, {}), "algorithm__name": algorithm, "clients__num": 12,
             "clients__fraction": 0.75, "data__partition": "dirichlet", "rounds": 2, "engine__sum_group": 3,
             **setting}
    if algorithm in ("fapd", "fedpcl"):
        key = "algorithm__teacher__cache_dir" if algorithm == "fapd" else "algorithm__pretrain__cache_dir"
        extra[key] = str(work / "cache")
    cfg = load_config(None, tiny_overrides(work / f"{algorithm}-{time.monotonic_ns()}", **extra))
    run_dir, _, _ = run_experiment(cfg)
    return strip_timing(read_rows(run_dir))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="a file an earlier run wrote: every entry must be equal")
    parser.add_argument("--algorithms", help="comma-separated (default: every built-in)")
    parser.add_argument("--settings", help="comma-separated names of SETTINGS (default: all)")
    parser.add_argument("--moved", help="a file an earlier run wrote: print each metric's largest change from it")
    args = parser.parse_args()

    import ray

    from raysim.registry import builtin_names, get_algorithm

    algorithms = args.algorithms.split(",") if args.algorithms else builtin_names("algorithm")
    settings = args.settings.split(",") if args.settings else list(SETTINGS)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out: dict[str, list[dict]] = {}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in algorithms:
            vectorizes = get_algorithm(algorithm).vectorizes()
            reference = None
            for name in settings:
                if name.endswith("vec4") and not vectorizes:
                    continue
                start = time.perf_counter()
                rows = run(algorithm, SETTINGS[name], Path(tmp))
                for row in rows:
                    row.pop("vectorize", None)  # the setting itself
                out[f"{algorithm}/{name}"] = rows
                if name in APART:
                    print(f"{algorithm:12s} {name:16s} {time.perf_counter() - start:5.1f} s  (its own groups)")
                    continue
                same = reference is None or rows == reference
                reference = rows if reference is None else reference
                exact = name.endswith("vec4") and not same  # cohorts of batch-norm models: within rounding only
                status = "ok" if same else ("DIFFERS (cohort)" if exact else "DIFFERS")
                if not same and not exact:
                    failures.append(f"{algorithm}/{name}: differs from {settings[0]}")
                print(f"{algorithm:12s} {name:16s} {time.perf_counter() - start:5.1f} s  {status}", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        for key, rows in out.items():
            if key in before and before[key] != rows and key.split("/")[1] not in APART:
                failures.append(f"{key}: differs from {args.compare}")
        missing = sorted(set(before) - set(out))
        print(f"compared {len(set(before) & set(out))} runs with {args.compare}; not rerun: {len(missing)}")
    if args.moved:
        print_moves(json.loads(Path(args.moved).read_text()), {k: v for k, v in out.items()
                                                               if k.split("/")[1] in APART})
    for line in failures:
        print("FAIL", line)
    print(f"{len(out)} runs, {len(failures)} failures")
    return 1 if failures else 0


def print_moves(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> None:
    """Each numeric metric's largest absolute change over the runs both files hold, and in how many runs it moved."""
    moves: dict[str, list[float]] = {}
    for key in sorted(set(before) & set(after)):
        for old, new in zip(before[key], after[key]):
            for metric, value in new.items():
                if isinstance(value, (int, float)) and isinstance(old.get(metric), (int, float)):
                    moves.setdefault(metric, []).append(abs(float(value) - float(old[metric])))
    runs = len(set(before) & set(after))
    print(f"moved, over {runs} runs (largest |change|, rows that changed of all rows):")
    for metric, diffs in sorted(moves.items()):
        print(f"  {metric:28s} {max(diffs):.3g}  {sum(d > 0 for d in diffs)}/{len(diffs)}")


if __name__ == "__main__":
    raise SystemExit(main())
