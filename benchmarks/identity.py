"""Every built-in algorithm's tiny run under every execution setting, its metrics written to one JSON file, so that
an engine change can be checked bit for bit against the commit before it:

    python benchmarks/identity.py --out before.json          # at the old commit
    python benchmarks/identity.py --out after.json --compare before.json

The settings: in process and on Ray (1 and 2 workers), partial sums on (groups of 3 and of 1) and off, calls of 3
clients, stacked clients of 4 where the algorithm declares them. 12 clients, 9 sampled a round, 2 rounds. Every
metric but wall-clock times must be equal, and (``--compare``) equal to the file given.

``--subsystems`` runs the round's features instead (:data:`SUBSYSTEMS`): DP-FedAvg (fixed-size and Poisson
sampling, a calibrated target ε, adaptive clipping), DP-SGD, every robust rule and attack, the system model
(dropouts, availability, deadlines with late clients dropped or doing partial work; the deployed server's departures
mid-job, report timeout and abandoned rounds; speeds in FLOP/s), FedAsync and FedBuff, compression (every encoding,
error feedback, downloads) and secure aggregation (with DP-FedAvg, QSGD in the ring, dropouts in simulated time,
named statistics), and the shipped privacy, robust and simulated-time experiments cut to a few rounds, each in
process and on 2 Ray workers (partial sums on, groups of 3): the metrics, ε included, must be equal between the two
and to the file given.

``auto-groups`` runs ``engine.sum_group=auto``'s own groups: with ``--moved``, each metric's largest change from the
file given is printed instead (a change of the auto grouping moves the last float bits on purpose). A worker killed
mid-job is checked by the test suite (``helpers.killed_worker_matches_inline``), not here.
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
APART = ("auto-groups",)

TINY_DP = {"privacy__enabled": "true", "privacy__clip": 0.5, "privacy__noise_multiplier": 0.7}
TINY_ROBUST = {"clients__fraction": 1.0, "aggregator__f": 2, "attack__fraction": 0.2}
TINY_SYSTEM = {"system__enabled": "true", "system__speed__median": 50, "system__speed__spread": 10,
               "system__dropout": 0.2, "system__latency__median": 0.5}
TINY_ASYNC = {"asynchronous__concurrency": 4, "rounds": 4}
# the server as deployed (issue 55): clients leave mid-job, the server waits for a report timeout
TINY_DEPLOYED = {"system__availability__mode": "onoff", "system__availability__mean_on_s": 5,
                 "system__availability__mean_off_s": 5, "system__availability__whole_job": "true",
                 "system__report_timeout_s": 12}
# the round's features: (config file or None for the tiny fedavg, its overrides)
SUBSYSTEMS: dict[str, tuple[str | None, dict]] = {
    "dp-fixed": (None, TINY_DP),
    "dp-poisson": (None, {**TINY_DP, "privacy__sampling": "poisson"}),
    "dp-target": (None, {**TINY_DP, "privacy__noise_multiplier": "null", "privacy__target_epsilon": 8}),
    "dp-adaptive": (None, {**TINY_DP, "privacy__adaptive_clip": "true", "privacy__count_noise": 1.0}),
    "dp-fedprox": (None, {**TINY_DP, "algorithm__name": "fedprox", "algorithm__mu": 0.1}),
    "dpsgd": (None, {"privacy__dpsgd": "true", "privacy__dpsgd_noise": 1.0}),
    "dpsgd-central": (None, {**TINY_DP, "privacy__dpsgd": "true"}),
    **{f"rule-{rule}": (None, {**TINY_ROBUST, "aggregator__name": rule, "attack__name": "sign_flip"})
       for rule in ("median", "trimmed_mean", "krum", "multikrum", "bulyan", "norm_bound", "centered_clip")},
    **{f"attack-{attack}": (None, {**TINY_ROBUST, "attack__name": attack})
       for attack in ("label_flip", "sign_flip", "gaussian", "scaling", "alie", "ipm", "backdoor")},
    "attack-alie-krum": (None, {**TINY_ROBUST, "attack__name": "alie", "aggregator__name": "krum"}),
    "attack-backdoor-median": (None, {**TINY_ROBUST, "attack__name": "backdoor", "aggregator__name": "median"}),
    # issue 54: the newer rules, pre-aggregation steps and attacks (FLTrust's root dataset from the server's holdout)
    **{f"rule-{rule}": (None, {**TINY_ROBUST, "aggregator__name": rule, "attack__name": "sign_flip", **more})
       for rule, more in (("geomed", {}), ("foolsgold", {}),
                          ("fltrust", {"aggregator__root": "server_holdout", "aggregator__root_samples": 30,
                                       "data__server_holdout": 0.1}))},
    "rule-krum-nnm": (None, {**TINY_ROBUST, "aggregator__name": "krum", "aggregator__nnm": "true",
                             "attack__name": "alie"}),
    "rule-median-bucket": (None, {**TINY_ROBUST, "aggregator__name": "median", "aggregator__bucket": 3,
                                  "attack__name": "ipm"}),
    **{f"attack-{attack}": (None, {**TINY_ROBUST, "attack__name": attack, "aggregator__name": rule})
       for attack, rule in (("minmax", "mean"), ("minsum", "median"), ("fang_krum", "krum"),
                            ("fang_trim", "trimmed_mean"), ("mimic", "centered_clip"))},
    "attack-dba": (None, {**TINY_ROBUST, "attack__name": "dba", "attack__dba_size": 3}),
    "attack-alie-karimireddy": (None, {**TINY_ROBUST, "attack__name": "alie", "attack__z_rule": "karimireddy",
                                       "aggregator__name": "trimmed_mean"}),
    "system-sync": (None, TINY_SYSTEM),
    "system-diurnal": (None, {**TINY_SYSTEM, "system__availability__mode": "diurnal",
                              "system__availability__period_s": 30, "system__wait_s": 1}),
    "system-deadline-drop": (None, {**TINY_SYSTEM, "system__deadline_s": 3.5, "system__over_selection": 0.3,
                                    "clients__fraction": 0.5}),
    "system-deadline-partial": (None, {**TINY_SYSTEM, "system__deadline_s": 3.5, "system__over_selection": 0.3,
                                       "system__late": "partial", "clients__fraction": 0.5}),
    "fedasync": (None, {**TINY_ASYNC, "asynchronous__mode": "fedasync", "rounds": 6}),
    "fedbuff": (None, {**TINY_ASYNC, "asynchronous__mode": "fedbuff", "asynchronous__buffer_size": 2}),
    "fedbuff-system": (None, {**TINY_ASYNC, **TINY_SYSTEM, "asynchronous__mode": "fedbuff",
                              "asynchronous__buffer_size": 2}),
    "fedasync-fedadam": (None, {**TINY_ASYNC, "asynchronous__mode": "fedasync", "algorithm__name": "fedadam"}),
    "system-deployed": (None, {**TINY_SYSTEM, **TINY_DEPLOYED, "system__min_reports": 2, "rounds": 4}),
    "system-flops": (None, {**TINY_SYSTEM, "system__speed_unit": "flops", "system__speed__median": 6e5}),
    "fedbuff-deployed": (None, {**TINY_ASYNC, **TINY_SYSTEM, **TINY_DEPLOYED, "asynchronous__mode": "fedbuff",
                                "asynchronous__buffer_size": 2, "rounds": 6}),
    "compress-topk-ef": (None, {"compression__up": "topk", "compression__ratio": 0.1,
                                "compression__error_feedback": "true"}),
    "compress-randk": (None, {"compression__up": "randk", "compression__ratio": 0.25}),
    "compress-qsgd-down": (None, {"compression__up": "qsgd", "compression__bits": 2, "compression__down": "qsgd"}),
    "compress-sign-ef-half": (None, {"compression__up": "sign", "compression__error_feedback": "true",
                                     "compression__down": "half"}),
    "compress-dp": (None, {**TINY_DP, "compression__up": "qsgd", "compression__bits": 4}),
    "secagg": (None, {"secagg__enabled": "true"}),
    "secagg-plus-dp": (None, {**TINY_DP, "secagg__enabled": "true", "secagg__neighbours": 4,
                              "compression__up": "topk", "compression__ratio": 0.2}),
    "secagg-qsgd-ring": (None, {"secagg__enabled": "true", "secagg__bits": 12, "secagg__range": 0.25,
                                "compression__up": "qsgd", "algorithm__weighting": "uniform"}),
    "secagg-system": (None, {**TINY_SYSTEM, "secagg__enabled": "true", "secagg__neighbours": 4}),
    "secagg-deployed": (None, {**TINY_SYSTEM, **TINY_DEPLOYED, "system__min_reports": 2, "rounds": 4,
                               "secagg__enabled": "true", "secagg__threshold": 0.3}),
    "secagg-scaffold": (None, {"secagg__enabled": "true", "algorithm__name": "scaffold"}),
    "shipped-dpfedavg": ("experiments/privacy/dpfedavg-mnist500.yaml", {"rounds": 3, "eval__every": 1}),
    **{f"shipped-robust-{attack}-{rule}": ("experiments/robust/digits-20.yaml",
                                           {"rounds": 2, "attack__name": attack, "aggregator__name": rule,
                                            "eval__every": 1})
       for attack, rule in (("sign_flip", "mean"), ("alie", "trimmed_mean"), ("backdoor", "bulyan"),
                            ("label_flip", "multikrum"), ("ipm", "centered_clip"))},
    "shipped-sync": ("experiments/async/sync.yaml", {"rounds": 2}),
    "shipped-sync-deadline": ("experiments/async/sync-deadline.yaml", {"rounds": 2}),
    "shipped-fedasync": ("experiments/async/fedasync.yaml", {"rounds": 20}),
    "shipped-fedbuff": ("experiments/async/fedbuff.yaml", {"rounds": 4}),
    "shipped-sync-deployed": ("experiments/async/sync-deployed.yaml", {"rounds": 3}),
    "shipped-sync-deadline-deployed": ("experiments/async/sync-deadline-deployed.yaml", {"rounds": 3}),
    "shipped-fedbuff-deployed": ("experiments/async/fedbuff-deployed.yaml", {"rounds": 4}),
}
SUBSYSTEM_SETTINGS = ("inline", "ray2")  # settings whose numbers are not the reference's: compared across commits only


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


def run_subsystem(name: str, setting: dict, work: Path) -> list[dict]:
    """One of :data:`SUBSYSTEMS` under an execution setting; partial sums on, in groups of 3."""
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    path, extra = SUBSYSTEMS[name]
    run_dir = work / f"{name}-{time.monotonic_ns()}"
    if path is None:
        overrides = tiny_overrides(run_dir, **{"clients__num": 12, "clients__fraction": 0.75, "rounds": 2,
                                               "data__partition": "dirichlet", "engine__sum_group": 3,
                                               **extra, **setting})
    else:
        overrides = [f"{k.replace('__', '.')}={v}" for k, v in {**extra, "engine__sum_group": 3, **setting}.items()]
        overrides.append(f"log.dir={run_dir / 'run'}")
    cfg = load_config(str(ROOT / path) if path else None, overrides)
    out, _, _ = run_experiment(cfg)
    return strip_timing(read_rows(out))


def _same(a: list[dict], b: list[dict]) -> bool:
    """Equal rows, a NaN equal to a NaN (an abandoned round's loss, a round nobody reported to)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="a file an earlier run wrote: every entry must be equal")
    parser.add_argument("--algorithms", help="comma-separated (default: every built-in)")
    parser.add_argument("--settings", help="comma-separated names of SETTINGS (default: all)")
    parser.add_argument("--moved", help="a file an earlier run wrote: print each metric's largest change from it")
    parser.add_argument("--subsystems", action="store_true", help="the round's features (SUBSYSTEMS), not the "
                        "algorithms; --algorithms then names cases of SUBSYSTEMS")
    args = parser.parse_args()

    import ray

    from raysim.registry import builtin_names, get_algorithm

    if args.subsystems:
        cases = args.algorithms.split(",") if args.algorithms else list(SUBSYSTEMS)
        settings = args.settings.split(",") if args.settings else list(SUBSYSTEM_SETTINGS)
    else:
        cases = args.algorithms.split(",") if args.algorithms else builtin_names("algorithm")
        settings = args.settings.split(",") if args.settings else list(SETTINGS)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out: dict[str, list[dict]] = {}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases if args.subsystems else []:
            reference = None
            for name in settings:
                start = time.perf_counter()
                rows = run_subsystem(case, SETTINGS[name], Path(tmp))
                for row in rows:
                    row.pop("vectorize", None)
                out[f"{case}/{name}"] = rows
                same = reference is None or _same(rows, reference)
                reference = rows if reference is None else reference
                if not same:
                    failures.append(f"{case}/{name}: differs from {settings[0]}")
                print(f"{case:34s} {name:8s} {time.perf_counter() - start:5.1f} s  {'ok' if same else 'DIFFERS'}",
                      flush=True)
        for algorithm in cases if not args.subsystems else []:
            vectorizes = get_algorithm(algorithm).refusal("stack") is None
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
                exact = name.endswith("vec4") and not same  # stacks of batch-norm models: within rounding only
                status = "ok" if same else ("DIFFERS (stack)" if exact else "DIFFERS")
                if not same and not exact:
                    failures.append(f"{algorithm}/{name}: differs from {settings[0]}")
                print(f"{algorithm:12s} {name:16s} {time.perf_counter() - start:5.1f} s  {status}", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        for key, rows in out.items():
            if key in before and not _same(before[key], rows) and key.split("/")[1] not in APART:
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
