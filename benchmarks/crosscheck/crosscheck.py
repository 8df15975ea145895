"""raysim against implementations written elsewhere, on the same federation: per-round accuracy over seeds.

    .venv/bin/python benchmarks/crosscheck/crosscheck.py --pfllib PFLLIB_CHECKOUT --fednh FEDNH_CHECKOUT \
        [--peer-python PY] [--seeds 0-2] [--methods fedavg,fedprox,...] [--out benchmarks/out/crosscheck]

Peers (read from local checkouts; nothing is vendored or downloaded): PFLlib (github.com/TsingZ0/PFLlib) for
FedAvg, FedProx, MOON, FedProto, FedRoD, FedBABU and FedRep, and the FedNH authors' code
(github.com/Yutong-Dai/FedNH), since neither PFLlib nor FL-bench has FedNH. Each checkout's commit is read with
``git rev-parse`` or given (``--pfllib-commit``, ``--fednh-commit``, for an exported tree without .git).
``--peer-python`` runs the peers' side (PFLlib imports h5py, which raysim does not need): a Python that also sees
torch and raysim.

For every (method, seed), this script runs raysim on ``federation.yaml`` (+ the method's keys), then exports what
raysim built to the peer: every client's training and test tensors, exactly as raysim's workers see them, and the
initial weights of the method's model (after its ``adapt_model``); the peer runs its own server and clients on them
(``pfllib_runner.py``, ``fednh_runner.py``: glue that calls the peer's classes). Same partition, model, initial
weights, optimiser (plain SGD), batch size, local epochs, rounds and clients (all, every round). The metric is the
pooled test accuracy after each round (total correct over total test samples of all clients: raysim's
``acc_weighted``, PFLlib's ``rs_test_acc``, the FedNH code's per-client accuracies pooled by test size).

Writes ``OUT/results.json`` (every curve), ``OUT/table.md`` (the table of docs/crosscheck.md: mean over rounds and
final accuracy, raysim − peer, paired t-test over seeds) and ``OUT/curves.png``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FEDERATION = HERE / "federation.yaml"


@dataclass(frozen=True)
class Method:
    raysim: tuple[str, ...]  # overrides on federation.yaml
    peer: str  # pfllib | fednh
    algorithm: str  # the peer's name for it
    params: dict = field(default_factory=dict)  # the peer's hyper-parameters, matched to raysim's
    final_only: bool = False  # compare the last value only (the peer evaluates this once, after training)


METHODS: dict[str, Method] = {
    "fedavg": Method(("algorithm.name=fedavg",), "pfllib", "FedAvg"),
    "fedprox": Method(("algorithm.name=fedprox", "algorithm.mu=0.01"), "pfllib", "FedProx", {"mu": 0.01}),
    # MOON's two projection layers barely train at lr 0.05 in 20 rounds (μ = 0 too: 12 % on seed 0), so it runs at
    # lr 0.2 in both engines
    "moon": Method(("algorithm.name=moon", "algorithm.mu=1.0", "algorithm.tau=0.5", "algorithm.out_dim=32",
                    "train.lr=0.2"), "pfllib", "MOON", {"mu": 1.0, "tau": 0.5}),
    "fedproto": Method(("algorithm.name=fedproto", "algorithm.ld=1.0", "algorithm.predict=prototype",
                        "algorithm.aggregation=mean"), "pfllib", "FedProto", {"lamda": 1.0}),
    "fedrod": Method(("algorithm.name=fedrod",), "pfllib", "FedROD"),
    "fedbabu": Method(("algorithm.name=fedbabu", "algorithm.finetune_epochs=0"), "pfllib", "FedBABU",
                      {"fine_tuning_epochs": 5}),
    # PFLlib fine-tunes with the clients' own optimiser (the training lr): raysim's finetune_lr set to match
    "fedbabu-ft": Method(("algorithm.name=fedbabu", "algorithm.finetune_epochs=5", "algorithm.finetune_lr=0.05"),
                         "pfllib", "FedBABU", {"fine_tuning_epochs": 5}, final_only=True),
    "fedrep": Method(("algorithm.name=fedrep", "algorithm.head_epochs=1"), "pfllib", "FedRep", {"plocal_epochs": 1}),
    "fednh": Method(("algorithm.name=fednh", "algorithm.scale=1.0", "algorithm.learn_scale=true",
                     "algorithm.body_average=uniform", "algorithm.rho=0.9", "algorithm.clip_grad=10"),
                    "fednh", "FedNH", {"scale": 1.0, "rho": 0.9}),
}


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def commit_of(path: Path, given: Optional[str]) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        sys.exit(f"crosscheck: {path} is not a git checkout; give its commit with --pfllib-commit / --fednh-commit")


# ---------------------------------------------------------------------------------------------- raysim side
def run_raysim(method: Method, seed: int, run_dir: Path) -> list[float]:
    """raysim's pooled test accuracy after each round (``acc_weighted``)."""
    import raysim

    if run_dir.exists():
        shutil.rmtree(run_dir)
    result = raysim.run(str(FEDERATION), *method.raysim, f"seed={seed}", f"log.dir={run_dir}")
    return [float(v) for v in result.metrics["acc_weighted"]]


def export(method: Method, seed: int, work: Path) -> None:
    """What raysim built for (method, seed), in the peers' formats: client tensors, the model's initial weights."""
    import torch

    from raysim.config import load_config, to_yaml
    from raysim.data import build_federated_data
    from raysim.models import build_model
    from raysim.registry import get_algorithm

    cfg = load_config(FEDERATION, list(method.raysim) + [f"seed={seed}"])
    data = get_algorithm(cfg.algorithm.name)(cfg).prepare_data(build_federated_data(cfg))
    if work.exists():
        shutil.rmtree(work)
    (work / "system").mkdir(parents=True)
    for part in ("train", "test"):
        folder = work / "dataset" / "crosscheck" / part
        folder.mkdir(parents=True)
        for cid in range(data.num_clients):
            x, y, _ = data.tensors(cid, part)
            with open(folder / f"{cid}.npz", "wb") as fh:  # PFLlib's format: np.load(f)['data'].tolist()
                np.savez_compressed(fh, data={"x": x.numpy(), "y": y.numpy()})
    model = build_model(cfg, cfg.model.name, data.input_shape(0), data.num_classes, 0,
                        get_algorithm(cfg.algorithm.name)(cfg))
    torch.save(model.state_dict(), work / "init.pt")
    (work / "config.yaml").write_text(to_yaml(cfg))
    t = cfg.train
    (work / "federation.json").write_text(json.dumps({
        "num_clients": data.num_clients, "num_classes": data.num_classes, "rounds": cfg.rounds, "lr": t.lr,
        "batch_size": t.batch_size, "local_epochs": t.local_epochs, "seed": seed}))


# ---------------------------------------------------------------------------------------------- peer side
def run_peer(method: Method, seed: int, work: Path, peers: dict[str, Path], python: str, log: Path,
             extra: tuple[str, ...] = ()) -> list[float]:
    runner = HERE / f"{method.peer}_runner.py"
    out = work / "peer.json"
    python = str(Path(python).absolute()) if "/" in python else python  # it runs with cwd = the export
    cmd = [python, str(runner), "--peer", str(peers[method.peer]), "--work", str(work), "--algorithm",
           method.algorithm, "--params", json.dumps(method.params), "--seed", str(seed), "--out", str(out), *extra]
    with open(log, "w") as fh:
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=str(work))
    if done.returncode != 0:
        sys.exit(f"crosscheck: the peer's {method.algorithm} failed (exit {done.returncode}); see {log}")
    return json.loads(out.read_text())["acc"]


# ---------------------------------------------------------------------------------------------- comparison
def compare(curves: dict, methods: list[str], seeds: list[int]) -> list[dict]:
    """Per method: mean over rounds and final accuracy for each engine, their paired differences over seeds and
    the paired t-test (two-sided) of each."""
    from scipy import stats

    rows = []
    for m in methods:
        r = np.array([curves[m]["raysim"][str(s)] for s in seeds])  # [seeds, rounds]
        p = np.array([curves[m]["peer"][str(s)] for s in seeds])
        row = {"method": m, "seeds": len(seeds), "final_only": METHODS[m].final_only}
        for name, a, b in (("final", r[:, -1], p[:, -1]), ("mean", r.mean(1), p.mean(1))):
            diff = a - b
            test = stats.ttest_rel(a, b) if len(seeds) > 1 and np.any(diff != diff[0]) else None
            row[name] = {"raysim": float(a.mean()), "raysim_std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
                         "peer": float(b.mean()), "peer_std": float(b.std(ddof=1)) if len(b) > 1 else 0.0,
                         "diff": float(diff.mean()), "diff_std": float(diff.std(ddof=1)) if len(diff) > 1 else 0.0,
                         "p": None if test is None else float(test.pvalue)}
        row["max_round_gap"] = float(np.abs(r.mean(0) - p.mean(0)).max())
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.2f}"

    def p(v: Optional[float]) -> str:
        return "—" if v is None else (f"{v:.3f}" if v >= 0.001 else f"{v:.1e}")

    out = ["| method | raysim final | peer final | Δ final (paired p) | raysim mean over rounds | peer mean over "
           "rounds | Δ mean (paired p) | largest gap in a round |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        f, m = row["final"], row["mean"]
        mean_cells = ["—", "—", "—", "—"] if row["final_only"] else [
            f"{pct(m['raysim'])} ± {pct(m['raysim_std'])}", f"{pct(m['peer'])} ± {pct(m['peer_std'])}",
            f"{pct(m['diff']):>6} ± {pct(m['diff_std'])} ({p(m['p'])})", pct(row["max_round_gap"])]
        out.append(f"| {row['method']} | {pct(f['raysim'])} ± {pct(f['raysim_std'])} | {pct(f['peer'])} ± "
                   f"{pct(f['peer_std'])} | {pct(f['diff'])} ± {pct(f['diff_std'])} ({p(f['p'])}) | "
                   + " | ".join(mean_cells) + " |")
    return "\n".join(out) + "\n"


def plot(curves: dict, methods: list[str], seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [m for m in methods if not METHODS[m].final_only]
    if not shown:
        return  # only final values: nothing to draw per round
    cols = 4
    rows = (len(shown) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False, sharey=True)
    for ax, m in zip(axes.flat, shown):
        for engine, color in (("raysim", "tab:blue"), ("peer", "tab:orange")):
            c = np.array([curves[m][engine][str(s)] for s in seeds])
            x = np.arange(1, c.shape[1] + 1)
            ax.plot(x, c.mean(0), color=color, label=engine if engine == "raysim" else curves[m]["peer_name"])
            ax.fill_between(x, c.min(0), c.max(0), color=color, alpha=0.2)
        ax.set_title(m)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    axes[0][0].set_ylabel("pooled test accuracy")
    fig.suptitle(f"raysim vs. an independent implementation: mean and range over seeds {seeds[0]}-{seeds[-1]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pfllib", type=Path, required=True, help="a checkout of github.com/TsingZ0/PFLlib")
    p.add_argument("--fednh", type=Path, help="a checkout of github.com/Yutong-Dai/FedNH (for fednh)")
    p.add_argument("--pfllib-commit")
    p.add_argument("--fednh-commit")
    p.add_argument("--peer-python", default=sys.executable)
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "crosscheck")
    p.add_argument("--peer-keep-last", action="store_true",
                   help="diagnostic: PFLlib trains on each epoch's last, partial batch too (it drops it: drop_last)")
    p.add_argument("--peer-finetune-global", action="store_true",
                   help="diagnostic: PFLlib's FedBABU fine-tunes from the global body (it starts from local models)")
    a = p.parse_args()
    methods = [m for m in a.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        sys.exit(f"crosscheck: unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if any(METHODS[m].peer == "fednh" for m in methods) and a.fednh is None:
        sys.exit("crosscheck: fednh needs --fednh (a checkout of github.com/Yutong-Dai/FedNH)")
    seeds = parse_seeds(a.seeds)
    peers = {"pfllib": a.pfllib.resolve()}
    commits = {"pfllib": commit_of(a.pfllib, a.pfllib_commit)}
    if a.fednh is not None:
        peers["fednh"] = a.fednh.resolve()
        commits["fednh"] = commit_of(a.fednh, a.fednh_commit)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    curves = results.setdefault("curves", {})
    names = {"pfllib": f"PFLlib {commits['pfllib'][:7]}" + (" (keep last batch)" if a.peer_keep_last else "")
             + (" (fine-tune from the global body)" if a.peer_finetune_global else ""),
             "fednh": f"FedNH (authors) {commits.get('fednh', '')[:7]}"}
    for m in methods:
        method = METHODS[m]
        entry = curves.setdefault(m, {"raysim": {}, "peer": {}})
        entry["peer_name"] = names[method.peer]
        for seed in seeds:
            if str(seed) in entry["raysim"] and str(seed) in entry["peer"]:
                continue  # a rerun continues where it stopped
            start = time.perf_counter()
            ray_curve = run_raysim(method, seed, out / "runs" / m / f"seed-{seed}")
            work = out / "export" / m / f"seed-{seed}"
            export(method, seed, work)
            (out / "logs").mkdir(exist_ok=True)
            extra = ("--keep-last",) if a.peer_keep_last and method.peer == "pfllib" else ()
            if a.peer_finetune_global and method.algorithm == "FedBABU":
                extra += ("--finetune-global",)
            peer_curve = run_peer(method, seed, work, peers, a.peer_python, out / "logs" / f"{m}-seed-{seed}.log",
                                  extra)
            rounds = len(ray_curve)
            # the peer evaluates before each round's training: its entry r is the model after r rounds
            peer_rounds = peer_curve[1:rounds + 1] if not method.final_only else peer_curve
            if method.final_only:  # compare the last value of each only
                ray_curve, peer_rounds = ray_curve[-1:], peer_curve[-1:]
            entry["raysim"][str(seed)] = ray_curve
            entry["peer"][str(seed)] = peer_rounds
            results["commits"] = commits
            results_path.write_text(json.dumps(results, indent=1))
            print(f"crosscheck: {m} seed {seed}: raysim {ray_curve[-1]:.4f}, {names[method.peer]} "
                  f"{peer_rounds[-1]:.4f} ({time.perf_counter() - start:.0f}s)", flush=True)
    rows = compare(curves, methods, seeds)
    results["table"] = rows
    results_path.write_text(json.dumps(results, indent=1))
    header = (f"Peers: PFLlib at {commits['pfllib']}" + (f", FedNH (authors) at {commits['fednh']}" if "fednh" in
                                                          commits else "") + f"; seeds {seeds}.\n\n")
    (out / "table.md").write_text(header + table(rows))
    plot(curves, methods, seeds, out / "curves.png")
    print(header + table(rows))
    print(f"crosscheck: wrote {out / 'table.md'}, {out / 'curves.png'}, {results_path}")


if __name__ == "__main__":
    main()
