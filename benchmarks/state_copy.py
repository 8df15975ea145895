"""The per-round cost of keeping client state where a node loss cannot take it (issue 28).

    .venv/bin/python benchmarks/state_copy.py [--repeats 3] [--rounds 5] [--workloads cnn,mlp] [--no-wait]

A client's new state comes back from a worker as an object in the store of the worker's node; when that node is not
the launching process's, the pool fetches the state and puts it again from the launching process
(``raysim.engine.pool.WorkerPool._fetch``), so losing the node loses no state. On a single machine every worker
is on the launching node and nothing is copied; the copy costs something only on a cluster. This measures it on a
2-node ``ray.cluster_utils.Cluster`` on this machine: the head, where this process (the driver) runs, with no CPU
for workers, and a 2-CPU node for the 2 workers, so every state is made on the other node and crosses Ray's object
transfer over loopback TCP.

Workloads: overhead.py's ``cnn`` (small CNN, MNIST sample) and ``mlp`` (the tiny MLP on sklearn's digits), 20
clients all sampled each round, 1 local epoch, with ``algorithm.name=local``: each client keeps its whole model, the
largest state an algorithm keeps (UNIDEAL keeps body and local head; MOON, FedRoD and the rest less). Each runs with
the copy (raysim as it is) and without (``_fetch`` without it, patched in this process for those runs only: the
driver runs here), the two in turn, alternating which goes first. Reported: steady round time (median of the
training-only rounds 2..R-1, logging and the checkpoint of every round included), the difference per round and per
client update, and the state's size. Without the copy, each round's checkpoint fetches the states from the other
node instead, so the copy moves that transfer more than it adds one.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT, fmt, loadavg, machine_info, save_json, summary, wait_quiet  # noqa: E402
from overhead import CLIENTS, load, steady  # noqa: E402


def timed_run(cfg: Any) -> dict[str, Any]:
    """One run on the script's Ray; each round's period as the host sees it (between consecutive rounds' metrics,
    so logging and the checkpoint count), as overhead.py measures it."""
    import shutil
    import time

    from raysim.engine.runner import run_experiment

    shutil.rmtree(cfg.log.dir, ignore_errors=True)
    stamps: list[float] = []
    _, rows, _ = run_experiment(cfg, on_start=lambda _: stamps.append(time.perf_counter()),
                                on_round=lambda _: stamps.append(time.perf_counter()))
    shutil.rmtree(cfg.log.dir, ignore_errors=True)
    return {"rounds": [{"round": r["round"], "loss": r["loss"], "acc_mean": r.get("acc_mean"), "wall_s": b - a}
                       for r, a, b in zip(rows, stamps, stamps[1:])]}


@contextlib.contextmanager
def without_copy() -> Iterator[None]:
    """The pool as before issue 28: a state stays in the store of the node that made it."""
    import ray

    from raysim.engine.pool import WorkerPool

    def fetch(self: Any, w: int, outs: list) -> list:
        return ray.get([out[0] if isinstance(out, list) else out for out in outs])

    saved = WorkerPool._fetch
    WorkerPool._fetch = fetch  # type: ignore[method-assign]
    try:
        yield
    finally:
        WorkerPool._fetch = saved  # type: ignore[method-assign]


def state_bytes(cfg: Any) -> int:
    """Bytes of one client's kept state (``local``: its whole model)."""
    from raysim.data import build_federated_data
    from raysim.models import build_model

    data = build_federated_data(cfg)
    model = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def start_cluster() -> Any:
    """A head with no CPU (this process runs the driver there) and one 2-CPU node for the workers."""
    import ray
    from ray.cluster_utils import Cluster

    from raysim.engine.resources import LOCAL_SYSTEM_CONFIG

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": dict(LOCAL_SYSTEM_CONFIG)})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    return cluster


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workloads", default="cnn,mlp")
    p.add_argument("--no-wait", action="store_true", help="don't wait for a quiet machine (debugging)")
    args = p.parse_args(argv)
    info = machine_info()
    result: dict[str, Any] = {"machine": info, "load_before": {}, "workloads": {}}
    print(f"[state_copy] {info}", flush=True)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    cluster = start_cluster()
    import ray

    try:
        for wl in [w for w in args.workloads.split(",") if w]:
            runs: dict[str, list[dict]] = {"copy": [], "no_copy": []}
            size = 0
            for rep in range(args.repeats):
                result["load_before"][f"{wl}-{rep}"] = wait_quiet(enabled=not args.no_wait)
                for way in ("copy", "no_copy") if rep % 2 == 0 else ("no_copy", "copy"):  # neither always first
                    cfg = load(wl, args.rounds, ["algorithm.name=local", "engine.num_workers=2",
                                                 f"log.dir={OUT / f'state-copy-{wl}-{way}'}"])
                    size = state_bytes(cfg)
                    with without_copy() if way == "no_copy" else contextlib.nullcontext():
                        runs[way].append(timed_run(cfg))
                line = "  ".join(f"{k} {steady(v[-1]['rounds']):.3f}s/round" for k, v in runs.items())
                print(f"[state_copy] {wl} rep {rep} (load {loadavg():.2f}): {line}", flush=True)
            same = [r["loss"] for r in runs["copy"][0]["rounds"]] == [r["loss"] for r in runs["no_copy"][0]["rounds"]]
            copy = [steady(r["rounds"]) for r in runs["copy"]]
            plain = [steady(r["rounds"]) for r in runs["no_copy"]]
            base = summary(plain)["median"]
            result["workloads"][wl] = {
                "state_bytes_per_client": size, "same_losses": same,
                "round_s": {"copy": summary(copy), "no_copy": summary(plain)},
                "cost_ms_per_round": summary((c - base) * 1e3 for c in copy),
                "cost_ms_per_client": summary((c - base) * 1e3 / CLIENTS for c in copy),
                "runs": runs}
    finally:
        ray.shutdown()
        cluster.shutdown()

    path = save_json("state_copy", result)
    print(f"\n[state_copy] results in {path}")
    for wl, e in result["workloads"].items():
        print(f"{wl}: state {e['state_bytes_per_client'] / 1024:.0f} KB per client; round s  copy "
              f"{fmt(e['round_s']['copy'])}  no copy {fmt(e['round_s']['no_copy'])}; cost per round "
              f"{fmt(e['cost_ms_per_round'], 1, 1)} ms, per client {fmt(e['cost_ms_per_client'], 1, 2)} ms; "
              f"same losses {e['same_losses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
