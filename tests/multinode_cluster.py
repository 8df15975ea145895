"""A 3-node Ray cluster on this machine whose nodes share no disk, as far as raysim can tell; run by
tests/engine/test_multinode.py in a process of its own (it needs its own Ray, not the suite's).

``ray.cluster_utils.Cluster`` starts a head with no CPU (so every worker and every Tune trial actor runs on another
node, as on a cluster whose head only coordinates) and two 2-CPU nodes. Every worker process of the job gets an
audit hook (``worker_process_setup_hook``): on any node but the launch node, touching a path under the runs root
(open, mkdir, rename, remove, listdir, rmtree) raises PermissionError and is logged, as a node without the launch
node's disk would fail. The plugin algorithm (tests/plugins/held.py: FedAvg that can hold a round's start until the
test has acted) is importable here only, so workers get it through the job's runtime environment (``py_modules``) or
not at all.

Then: a run; seeds 0 and 1 through Ray Tune, whose nodes are lost after round 1, and their --resume on fresh nodes;
and the run again, losing the node of one of its workers after round 1. Writes its findings as JSON for the test.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ["rounds=3", "clients.num=6", "data.name=sklearn_digits", "data.partition=iid", "model.name=mlp",
       "model.hidden=[16]", "model.feature_dim=8", "train.batch_size=32", "plugins=[held]",
       "algorithm.name=held_fedavg", "engine.num_workers=2", "log.progress=false"]


def no_disk_but_the_launch_nodes() -> None:
    """Ray's worker_process_setup_hook: this process sees no file under the runs root unless on the launch node."""
    import os
    import sys

    import ray

    launch, root, log = (os.environ[k] for k in ("RAYSIM_TEST_LAUNCH_NODE", "RAYSIM_TEST_ROOT",
                                                 "RAYSIM_TEST_VIOLATIONS"))
    here = ray.get_runtime_context().get_node_id()
    if here == launch:
        return
    events = {"open", "os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.listdir", "os.scandir",
              "shutil.rmtree", "os.truncate", "os.chmod"}

    def audit(event: str, args: tuple) -> None:
        if event not in events or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        if path == root or path.startswith(root + os.sep):
            with open(log, "a") as fh:
                fh.write(f"{here[:8]} pid {os.getpid()} {event} {path}\n")
            raise PermissionError(13, "not on this node (no shared disk)", path)

    sys.addaudithook(audit)


def main(out: Path, temp: Path) -> None:
    # Ray's session files, and the ray_current_cluster record the Cluster writes, go there: away from /tmp/ray,
    # where other runs on the machine look for a running cluster
    os.environ["RAY_TMPDIR"] = str(temp)
    root, violations = temp / "runs", temp / "violations.txt"
    root.mkdir()
    violations.touch()
    sys.path.insert(0, str(ROOT / "tests" / "plugins"))  # here only: not in the nodes' PYTHONPATH

    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raysim.config import load_config
    from raysim.engine.resources import LOCAL_SYSTEM_CONFIG, plugin_runtime_env
    from raysim.engine.runner import run_experiment
    from raysim.tune import run_seeds

    started = time.monotonic()
    system = {**LOCAL_SYSTEM_CONFIG, "health_check_period_ms": 500, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": system})
    nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
    launch = cluster.head_node.node_id
    env = {"RAYSIM_TEST_LAUNCH_NODE": launch, "RAYSIM_TEST_ROOT": str(root), "RAYSIM_TEST_VIOLATIONS": str(violations)}
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={**plugin_runtime_env(["held"]), "env_vars": env,
                          "worker_process_setup_hook": no_disk_but_the_launch_nodes})
    found: dict = {"cluster_s": time.monotonic() - started, "launch": launch}

    @ray.remote(num_cpus=0)
    def try_write(path: str) -> str:
        try:
            Path(path).write_text("x")
            return "wrote"
        except PermissionError:
            return "refused"

    def on(node_id: str) -> dict:
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}

    # the simulation bites: another node cannot write the runs root, the launch node can
    found["probe"] = ray.get([try_write.options(**on(n)).remote(str(root / f"probe-{i}"))
                              for i, n in enumerate([launch, nodes[0].node_id])])
    violations.write_text("")

    def held(gate: Path) -> list[str]:  # round 2 starts once the test has acted (tests/plugins/held.py)
        return ["algorithm.hold_round=2", f"algorithm.hold_until={gate}"]

    def worker_nodes() -> set[str]:
        return {a["Address"]["NodeID"] for a in ray._private.state.actors().values()
                if a.get("ActorClassName") == "ClientWorker" and a.get("State") == "ALIVE"}

    t = time.monotonic()
    _, found["run"], _ = run_experiment(load_config(None, RUN + [f"log.dir={root / 'run'}"]))
    found["run_s"] = time.monotonic() - t

    # seeds through Tune; once both trials have round 1 checkpointed, the nodes of their actors and workers go (two
    # fresh nodes come): the trials fail, and --resume restarts them, on the fresh nodes, from their checkpoints
    t = time.monotonic()
    seeds_args = (None, RUN + [f"log.dir={root / 'seeds'}", "engine.num_workers=1", *held(temp / "go-seeds")],
                  [0, 1])
    first_rows: dict[int, str] = {}

    lost_sweep: list = []  # Tune in a thread: only the main thread may add nodes (Ray's Node sets signal handlers)
    sweep = threading.Thread(target=lambda: lost_sweep.append(run_seeds(*seeds_args, quiet=True,
                                                                        out=lambda line: None)))
    sweep.start()
    deadline = time.monotonic() + 300
    while len(first_rows) < 2 and time.monotonic() < deadline and sweep.is_alive():
        for seed in (0, 1):
            with contextlib.suppress(OSError):
                lines = (root / "seeds" / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
                if lines:
                    first_rows[seed] = lines[0]
        time.sleep(0.1)
    found["trial_nodes"] = sorted(worker_nodes())
    found["seeds_round1_s"] = time.monotonic() - t
    fresh = [cluster.add_node(num_cpus=2) for _ in range(2)]
    for node in nodes:
        cluster.remove_node(node)
    nodes[:] = fresh
    (temp / "go-seeds").touch()
    found["seeds_surgery_s"] = time.monotonic() - t
    sweep.join()
    found["seeds_lost_s"] = time.monotonic() - t
    found["seeds_lost"] = [r["status"] for r in lost_sweep[0].rows]
    seeds = run_seeds(*seeds_args, resume_dir=root / "seeds", quiet=True, out=lambda line: None)
    found["seeds_s"] = time.monotonic() - t
    found["seeds"] = [r["status"] for r in seeds.rows]
    found["seed0"] = [json.loads(line) for line in (root / "seeds" / "seed-0" / "metrics.jsonl").read_text()
                      .splitlines()]
    found["first_rows_kept"] = all((root / "seeds" / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()[0]
                                   == line for seed, line in first_rows.items()) and len(first_rows) == 2
    found["fresh_nodes"] = [n.node_id for n in nodes]

    # a run that loses the node of one of its workers between rounds 1 and 2
    lost: list[str] = []

    def lose_a_worker_node(metrics: dict) -> None:
        if metrics["round"] == 1:
            node = next(n for n in nodes if n.node_id in worker_nodes())  # never the launch node: it has no CPU
            cluster.remove_node(node)
            lost.append(node.node_id)
            (temp / "go-lossy").touch()

    t = time.monotonic()
    _, found["lossy"], _ = run_experiment(load_config(None, RUN + [f"log.dir={root / 'lossy'}",
                                                                   *held(temp / "go-lossy")]),
                                          on_round=lose_a_worker_node)
    found["lossy_s"] = time.monotonic() - t
    found["lost"] = lost
    found["files"] = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                            and not p.name.startswith(".") and "tune" not in p.parts)
    found["violations"] = violations.read_text().splitlines()
    found["root"] = str(root)
    out.write_text(json.dumps(found, default=str))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    temp_dir = Path(tempfile.mkdtemp(prefix="rmn"))  # a short path: Ray's socket paths must stay short
    try:
        main(Path(sys.argv[1]), temp_dir)
    finally:  # Ray's session files too (the Cluster's processes end with this process: shutdown_at_exit)
        shutil.rmtree(temp_dir, ignore_errors=True)
