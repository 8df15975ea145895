"""Engine overhead and parallel efficiency: one FedAvg workload as a plain serial PyTorch loop and in raysim.

    .venv/bin/python benchmarks/overhead.py [--repeats 3] [--no-wait] [--set engine.clients_per_call=1 ...]

Workloads (20 clients, all sampled each round, 1 local epoch, 5 rounds, evaluation after the last round):
  cnn  the small CNN on the embedded MNIST sample (compute-bound: ~200 training images per client)
  mlp  a tiny MLP on scikit-learn's 8x8 digits (~70 samples per client: the engine's overhead dominates)

Each runs three ways: the reference (a serial loop in this process, no Ray: raysim's own data and model builders,
job seeds and FedAvg average, so it is the same computation — its per-round losses must equal raysim's), raysim
with 1 worker and raysim with 2 workers. Reported: steady-state round time (median of the training-only rounds
2..R-1, so neither Ray/worker start-up nor the final evaluation is in it), parallel efficiency
``T_serial / (W * T_raysim(W))``, overhead per client update ``(W * T_raysim(W) - T_serial) / clients``, and the
seconds from launching ``raysim run`` (a subprocess, its own Ray) to the end of round 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _common import (OUT, fmt, loadavg, machine_info, run_cli, save_json, start_ray, summary,  # noqa: E402
                     wait_quiet)

CLIENTS = 20
ROUNDS = 5
WORKLOADS: dict[str, list[str]] = {
    "cnn": ["data.name=mnist", "data.partition=iid", "model.name=cnn", "model.width=32", "model.feature_dim=64",
            "train.lr=0.05", "train.batch_size=32"],
    "mlp": ["data.name=sklearn_digits", "data.partition=iid", "model.name=mlp", "model.hidden=[32]",
            "model.feature_dim=16", "train.lr=0.1", "train.batch_size=32"],
}


def overrides(workload: str, rounds: int = ROUNDS, clients: int = CLIENTS) -> list[str]:
    return [f"name=overhead-{workload}", "seed=0", f"rounds={rounds}", f"clients.num={clients}",
            "clients.fraction=1.0", "train.local_epochs=1", f"eval.every={rounds}", "engine.cpus_per_worker=1",
            *WORKLOADS[workload]]


def load(workload: str, rounds: int, extra: list[str] = ()) -> Any:
    from raysim.config import load_config

    return load_config(None, overrides(workload, rounds) + list(extra))


# ---------------------------------------------------------------------------------------------------- reference
def reference(cfg: Any) -> dict[str, Any]:
    """FedAvg as a plain serial loop on one core: what raysim computes, with no engine around it."""
    from raysim.algorithms.base import ClientUpdate
    from raysim.data import build_federated_data
    from raysim.engine.sampling import sample_clients
    from raysim.engine.core import job_seed
    from raysim.algorithms.training import batch_bounds
    from raysim.algorithms.aggregation import sum_in_groups
    from raysim.engine.plan import group_size
    from raysim.models import build_model

    torch.set_num_threads(1)  # one raysim worker's share (engine.cpus_per_worker=1)
    t_start = time.perf_counter()
    data = build_federated_data(cfg)
    model = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train = {c: data.tensors(c, "train")[:2] for c in range(data.num_clients)}
    tcfg = cfg.train
    rounds: list[dict] = []
    for rnd in range(1, cfg.rounds + 1):
        t0 = time.perf_counter()
        uploads, weights, losses = [], [], []
        sampled = sample_clients(cfg.seed, rnd, cfg.clients.num, cfg.clients.fraction)
        for cid in sampled:
            seed = job_seed(cfg.seed, cid, rnd)
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            model.load_state_dict(global_state)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=tcfg.lr, momentum=tcfg.momentum,
                                  weight_decay=tcfg.weight_decay)
            x, y = train[cid]
            n = len(y)
            loss_sum = torch.zeros((), dtype=torch.float64)
            for _ in range(tcfg.local_epochs):
                order = torch.randperm(n, generator=gen)
                for b, e in batch_bounds(n, tcfg.batch_size):
                    bi = order[b:e]
                    loss = F.cross_entropy(model(x[bi]), y[bi])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    loss_sum += loss.detach().double() * len(bi)
            uploads.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            weights.append(n)
            losses.append(float(loss_sum) / (n * tcfg.local_epochs))
        # FedAvg's mean as raysim takes it (the same groups, the same order: raysim.algorithms.aggregation)
        updates = [ClientUpdate(c, u, w) for c, u, w in zip(sampled, uploads, weights)]
        global_state = sum_in_groups(updates, sampled, group_size(cfg.engine.sum_group, len(sampled))).mean()
        loss = sum(l * w for l, w in zip(losses, weights)) / float(sum(weights))
        rounds.append({"round": rnd, "loss": loss, "wall_s": time.perf_counter() - t0})
    model.load_state_dict(global_state)
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for cid in range(data.num_clients):
            x, y, _ = data.tensors(cid, "test")
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return {"rounds": rounds, "acc_global": correct / total, "total_s": time.perf_counter() - t_start}


# ---------------------------------------------------------------------------------------------------- raysim
def raysim_run(cfg: Any) -> dict[str, Any]:
    """One in-process ``run_experiment`` on the script's Ray; the driver times each round itself (``wall_s``)."""
    from raysim.engine.runner import run_experiment

    if cfg.log.dir and Path(cfg.log.dir).exists():
        shutil.rmtree(cfg.log.dir)
    stamps: list[float] = []
    t0 = time.perf_counter()
    _, rows, _ = run_experiment(cfg, on_start=lambda _: stamps.append(time.perf_counter()),
                                on_round=lambda _: stamps.append(time.perf_counter()))
    total = time.perf_counter() - t0
    shutil.rmtree(cfg.log.dir, ignore_errors=True)
    # a round's period as the host sees it (between consecutive rounds' metrics), so logging and checkpointing,
    # which the driver's own wall_s leaves out, count; round 1 counts from the driver being ready
    periods = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"rounds": [{"round": r["round"], "loss": r["loss"], "wall_s": p, "driver_wall_s": r["wall_s"]}
                       for r, p in zip(rows, periods)],
            "acc_global": rows[-1]["acc_global"], "total_s": total, "setup_s": stamps[0] - t0}


def steady(rounds: list[dict]) -> float:
    """Median wall time of the training-only rounds 2..R-1 (round 1 starts workers, round R also evaluates)."""
    import statistics

    body = [r["wall_s"] for r in rounds[1:-1]] or [r["wall_s"] for r in rounds]
    return statistics.median(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--workloads", default="cnn,mlp")
    p.add_argument("--launch-repeats", type=int, default=3, help="`raysim run` launches timed to round 1")
    p.add_argument("--no-wait", action="store_true", help="don't wait for a quiet machine (debugging)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra config override for the raysim runs (e.g. engine.clients_per_call=1)")
    p.add_argument("--out", default="overhead", help="results go to benchmarks/out/OUT.json")
    args = p.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    info = machine_info()
    result: dict[str, Any] = {"machine": info, "set": args.set, "load_before": {}, "launch": {}, "workloads": {}}
    print(f"[overhead] {info}", flush=True)

    # time to round 1 from a cold `raysim run` (its own Ray), before this script starts one
    result["load_before"]["launch"] = wait_quiet(enabled=not args.no_wait)
    launches = []
    for i in range(args.launch_repeats):
        run_dir = OUT / f"overhead-launch-{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        launches.append(run_cli(overrides("cnn", args.rounds) + ["engine.num_workers=2", f"log.dir={run_dir}"]))
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"[overhead] launch {i}: round 1 at {launches[-1]['round1_s']:.2f}s, exit at "
              f"{launches[-1]['total_s']:.2f}s", flush=True)
    result["launch"] = {"round1_s": summary(l["round1_s"] for l in launches),
                        "total_s": summary(l["total_s"] for l in launches), "runs": launches}

    start_ray(num_cpus=2)
    import ray

    try:
        for wl in workloads:
            result["load_before"][wl] = wait_quiet(enabled=not args.no_wait)
            runs: dict[str, list[dict]] = {"serial": [], "w1": [], "w2": []}
            for rep in range(args.repeats):
                if rep:  # every repeat starts on a quiet machine, not only the first
                    result["load_before"][f"{wl}-{rep}"] = wait_quiet(enabled=not args.no_wait)
                runs["serial"].append(reference(load(wl, args.rounds)))
                for w in (1, 2):
                    cfg = load(wl, args.rounds, [f"engine.num_workers={w}", f"log.dir={OUT / f'overhead-{wl}-w{w}'}",
                                                 *args.set])
                    runs[f"w{w}"].append(raysim_run(cfg))
                line = "  ".join(f"{k} {steady(v[-1]['rounds']):.3f}s/round" for k, v in runs.items())
                print(f"[overhead] {wl} rep {rep} (load {loadavg():.2f}): {line}", flush=True)
            ref_losses = [r["loss"] for r in runs["serial"][0]["rounds"]]
            same = {k: [r["loss"] for r in v[0]["rounds"]] == ref_losses for k, v in runs.items()}
            t_serial = summary(steady(r["rounds"]) for r in runs["serial"])
            entry: dict[str, Any] = {"same_losses_as_reference": same,
                                     "acc_global": {k: v[0]["acc_global"] for k, v in runs.items()},
                                     "round_s": {k: summary(steady(r["rounds"]) for r in v) for k, v in runs.items()},
                                     "round1_s": {k: summary(r["rounds"][0]["wall_s"] for r in v)
                                                  for k, v in runs.items()},
                                     "total_s": {k: summary(r["total_s"] for r in v) for k, v in runs.items()},
                                     "runs": runs}
            for w in (1, 2):
                # pair each raysim repeat with the serial median (the reference's spread is small)
                ts = t_serial["median"]
                vals = [steady(r["rounds"]) for r in runs[f"w{w}"]]
                entry[f"efficiency_w{w}"] = summary(ts / (w * v) for v in vals)
                entry[f"overhead_ms_per_update_w{w}"] = summary((w * v - ts) / CLIENTS * 1e3 for v in vals)
            result["workloads"][wl] = entry
    finally:
        ray.shutdown()

    path = save_json(args.out, result)
    print(f"\n[overhead] results in {path}")
    print(f"launch -> end of round 1: {fmt(result['launch']['round1_s'], 1, 2)} s  (target <= 10 s)")
    for wl, e in result["workloads"].items():
        print(f"{wl}: round s  serial {fmt(e['round_s']['serial'])}  w1 {fmt(e['round_s']['w1'])}  "
              f"w2 {fmt(e['round_s']['w2'])}")
        print(f"{wl}: efficiency w1 {fmt(e['efficiency_w1'], 1, 2)}  w2 {fmt(e['efficiency_w2'], 1, 2)}  "
              f"(target w2 >= 0.85, compute-bound)")
        print(f"{wl}: overhead ms/update w1 {fmt(e['overhead_ms_per_update_w1'], 1, 1)}  "
              f"w2 {fmt(e['overhead_ms_per_update_w2'], 1, 1)}  (target <= 5 ms, tiny MLP)")
        print(f"{wl}: same per-round losses as the reference: {e['same_losses_as_reference']}; "
              f"acc_global {e['acc_global']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
