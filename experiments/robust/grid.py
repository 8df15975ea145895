"""Run FedAvg's mean and each robust aggregator against each attack, over three seeds, and print the table.

    PYTHONPATH=. nice -n 10 python experiments/robust/grid.py [--out runs/robust-grid] [--seeds 0-2]

Every run is experiments/robust/digits-20.yaml with aggregator.name, attack.name and seed overridden, in this process
(engine.backend=inline); a run already finished under --out is read, not run again. The table gives the final
acc_global (the global model on every client's test split) as mean ± std over the seeds, and for the backdoors
(the pixel pattern, its model replacement by scaling, the distributed one) also the final attack success rate
(attack/asr).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from raysim.runlog import read_metrics

HERE = Path(__file__).resolve().parent
# a row: the aggregator, or aggregator@key=value+key=value for a setting other than the default (a key without a
# dot is aggregator.KEY). The honest updates' norms are 0.5-1.3 here, so the papers' M = 5 and τ = 10 never clip: the
# @ rows use a bound below them. FLTrust's root dataset is the server's holdout, 10 % of every client's training data
# (about 145 samples, of which it draws 100): that row's clients train on 90 % of what the others' do.
AGGREGATORS = ["mean", "median", "trimmed_mean", "krum", "multikrum", "bulyan", "norm_bound",
               "norm_bound@norm_bound=0.5", "centered_clip", "centered_clip@tau=0.5", "geomed",
               "fltrust@root=server_holdout+data.server_holdout=0.1", "foolsgold", "median@bucket=2", "krum@nnm=true"]
ATTACKS = ["none", "sign_flip", "gaussian", "alie", "ipm", "label_flip", "minmax", "minsum", "fang_krum", "fang_trim",
           "mimic", "backdoor", "scaling", "dba"]
BACKDOORS = ("backdoor", "scaling", "dba")  # their success rate gets a column of its own


def last_row(run_dir: Path) -> dict | None:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return rows[-1] if rows and rows[-1].get("acc_global") is not None else None


def run_one(out: Path, aggregator: str, attack: str, seed: int) -> dict:
    """The run's last row; ``{"diverged": True}`` where a client's update stopped being finite (the run stops, as a
    run does: FedAvg's mean under the Gaussian attack), run again on the next call (it is deterministic)."""
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment
    from raysim.errors import RunStopped

    name, _, settings = aggregator.partition("@")
    extra = [kv if "." in kv.partition("=")[0] else f"aggregator.{kv}" for kv in settings.split("+") if kv]
    label = aggregator.replace("@", "-").replace("=", "").replace("+", "-").replace("data.", "")
    run_dir = out / f"{label}-{attack}-s{seed}"
    row = last_row(run_dir)
    if row is None:
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        cfg = load_config(HERE / "digits-20.yaml", [f"aggregator.name={name}", *extra, f"attack.name={attack}",
                                               f"seed={seed}", f"log.dir={run_dir}", "log.tensorboard=false"],
                          warn=False)
        try:
            run_experiment(cfg)
        except RunStopped as stop:
            print(f"# {run_dir.name}: {stop}", file=sys.stderr)
            return {"diverged": True}
        row = last_row(run_dir)
    assert row is not None, run_dir
    return row


def cell(values: list[float | None]) -> str:
    """mean ± std of the seeds' values; None is a seed whose run diverged, counted beside the others."""
    finite = [v for v in values if v is not None]
    diverged = f"{len(values) - len(finite)}/{len(values)} diverged"
    if not finite:
        return diverged
    text = f"{finite[0]:.3f}" if len(finite) == 1 else f"{statistics.mean(finite):.3f} ± {statistics.stdev(finite):.3f}"
    return text + (f" ({diverged})" if len(finite) < len(values) else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/robust-grid")
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--aggregators", default=",".join(AGGREGATORS),
                        help="comma-separated rows; name@key=value+key=value sets aggregator.* (or dotted) keys")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    args = parser.parse_args()
    low, _, high = args.seeds.partition("-")
    seeds = list(range(int(low), int(high or low) + 1))
    aggregators, attacks = args.aggregators.split(","), args.attacks.split(",")
    out = Path(args.out)
    start = time.perf_counter()
    acc: dict = {}
    asr: dict = {}
    for aggregator in aggregators:
        for attack in attacks:
            for seed in seeds:
                row = run_one(out, aggregator, attack, seed)
                acc.setdefault((aggregator, attack), []).append(row.get("acc_global"))
                if row.get("attack/asr") is not None or (row.get("diverged") and attack in BACKDOORS):
                    asr.setdefault((aggregator, attack), []).append(row.get("attack/asr"))
            print(f"# {aggregator} / {attack} done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    names = {"none": "no attack", "sign_flip": "sign flip", "alie": "ALIE", "label_flip": "label flip",
             "backdoor": "backdoor", "minmax": "min-max", "minsum": "min-sum", "fang_krum": "Fang (Krum)",
             "fang_trim": "Fang (trim)", "mimic": "mimic", "dba": "DBA", "gaussian": "Gaussian", "ipm": "IPM",
             "scaling": "scaling"}
    backdoors = [a for a in attacks if a in BACKDOORS]
    header = ["aggregator", *[f"acc: {names.get(a, a)}" for a in attacks], *[f"{names[a]} ASR" for a in backdoors]]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for aggregator in aggregators:
        cells = [cell(acc[(aggregator, a)]) for a in attacks] + [cell(asr[(aggregator, a)]) for a in backdoors]
        label = aggregator.replace("@", " (").replace("+", ", ").replace("data.", "")
        label += ")" if "@" in aggregator else ""
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\n{len(aggregators) * len(attacks) * len(seeds)} runs, seeds {args.seeds}, "
          f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
