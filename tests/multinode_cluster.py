"""A 3-node Ray cluster on this machine whose nodes share no disk, as far as raysim can tell; run by
tests/engine/test_multinode.py in a process of its own (it needs its own Ray, not the suite's).

``ray.cluster_utils.Cluster`` starts a head with no CPU (so every worker and every Tune trial actor runs on another
node, as on a cluster whose head only coordinates) and two 2-CPU nodes. Every worker process of the job gets an
audit hook (``worker_process_setup_hook``): on any node but the launch node, touching a path under the runs root
(open, mkdir, rename, remove, listdir, rmtree) raises PermissionError and is logged, as a node without the launch
node's disk would fail. The plugin algorithms (tests/plugins/held.py: algorithms that can hold a round until the
test has acted) are importable here only, so workers get them through the job's runtime environment
(``py_modules``) or not at all.

Parts (``python tests/multinode_cluster.py OUT.json [PART ...]``, all by default):

- ``run``: a run;
- ``healing``: seeds 0 and 1 through Ray Tune, whose nodes are lost after round 1: Tune restarts both trials on
  fresh nodes from their checkpoints, and the set ends done without ``--resume``;
- ``lossy``: the run again, losing the node of one of its workers between rounds 1 and 2;
- ``stateful``: clients that keep state above Ray's inline limit (and a server that keeps their uploads), every
  node that holds a worker lost mid-round 2, after the round's clients trained and before evaluation read their
  new states: the metrics of an undisturbed run (computed in this process, ``engine.backend=inline``).

Writes its findings as JSON for the test.
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
# per-client state of ~270 KB (the whole model, kept and uploaded), above Ray's 100 KB inline limit
STATEFUL = RUN[:-3] + ["model.hidden=[512]", "model.feature_dim=64", "algorithm.name=held_stateful",
                       "engine.num_workers=2", "log.progress=false"]
PARTS = ("run", "healing", "lossy", "stateful")


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


def main(out: Path, temp: Path, parts: tuple[str, ...] = PARTS) -> None:
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

    def held(gate: Path, at: str = "start", reached: Path | None = None) -> list[str]:
        """Round 2 waits at ``at`` until the test has acted (tests/plugins/held.py)."""
        return ["algorithm.hold_round=2", f"algorithm.hold_at={at}", f"algorithm.hold_until={gate}",
                *([f"algorithm.hold_reached={reached}"] if reached else [])]

    def worker_nodes() -> set[str]:
        return {a["Address"]["NodeID"] for a in ray._private.state.actors().values()
                if a.get("ActorClassName") == "ClientWorker" and a.get("State") == "ALIVE"}

    if "run" in parts:
        t = time.monotonic()
        _, found["run"], _ = run_experiment(load_config(None, RUN + [f"log.dir={root / 'run'}"]))
        found["run_s"] = time.monotonic() - t

    if "healing" in parts:
        # seeds through Tune; once both trials have round 1 checkpointed, the nodes of their actors and workers go
        # (two fresh nodes come): Tune restarts the trials, on the fresh nodes, from their checkpoints
        t = time.monotonic()
        seeds_args = (None, RUN + [f"log.dir={root / 'seeds'}", "engine.num_workers=1", *held(temp / "go-seeds")],
                      [0, 1])
        first_rows: dict[int, str] = {}
        lines: list[str] = []
        healed: list = []  # Tune in a thread: only the main thread may add nodes (Ray's Node sets signal handlers)
        sweep = threading.Thread(target=lambda: healed.append(run_seeds(*seeds_args, quiet=True,
                                                                        out=lines.append)))
        sweep.start()
        deadline = time.monotonic() + 300
        while len(first_rows) < 2 and time.monotonic() < deadline and sweep.is_alive():
            for seed in (0, 1):
                with contextlib.suppress(OSError):
                    rows = (root / "seeds" / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
                    if rows:
                        first_rows[seed] = rows[0]
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
        found["seeds_s"] = time.monotonic() - t
        found["seeds"] = [r["status"] for r in healed[0].rows]
        found["seeds_lines"] = lines
        found["seed0"] = [json.loads(line) for line in (root / "seeds" / "seed-0" / "metrics.jsonl").read_text()
                          .splitlines()]
        found["first_rows_kept"] = all((root / "seeds" / f"seed-{seed}" / "metrics.jsonl").read_text()
                                       .splitlines()[0] == line for seed, line in first_rows.items()) \
            and len(first_rows) == 2
        found["fresh_nodes"] = [n.node_id for n in nodes]
        found["tune_failures"] = sorted(p.read_text().count("Failure #")
                                        for p in (root / "seeds" / "tune").glob("*/error.txt"))

    if "lossy" in parts:  # a run that loses the node of one of its workers between rounds 1 and 2
        lost: list[str] = []

        def lose_a_worker_node(metrics: dict) -> None:
            if metrics["round"] == 1:
                node = next(n for n in nodes if n.node_id in worker_nodes())  # never the launch node: it has no CPU
                cluster.remove_node(node)
                lost.append(node.node_id)
                nodes.remove(node)
                (temp / "go-lossy").touch()

        t = time.monotonic()
        _, found["lossy"], _ = run_experiment(load_config(None, RUN + [f"log.dir={root / 'lossy'}",
                                                                       *held(temp / "go-lossy")]),
                                              on_round=lose_a_worker_node)
        found["lossy_s"] = time.monotonic() - t
        found["lost"] = lost

    if "stateful" in parts:
        # mid-round 2, once its clients trained on the workers' nodes and before anything read their new states:
        # every node holding a worker goes (fresh ones come first, so replacements have room)
        t = time.monotonic()
        gate, reached = temp / "go-stateful", temp / "at-stateful"
        def stateful_run() -> None:
            try:
                found["stateful"] = run_experiment(load_config(None, STATEFUL + [
                    f"log.dir={root / 'stateful'}", *held(gate, "aggregate", reached)]))[1]
            except BaseException as exc:  # noqa: BLE001 - the test shows it
                found["stateful_error"] = f"{type(exc).__name__}: {exc}"

        run = threading.Thread(target=stateful_run)
        run.start()
        deadline = time.monotonic() + 300
        while not reached.exists() and run.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        found["stateful_reached"] = reached.exists()
        holding = worker_nodes()
        fresh = [cluster.add_node(num_cpus=2) for _ in range(2)]
        removed = [n for n in nodes if n.node_id in holding]
        for node in removed:
            cluster.remove_node(node)
            nodes.remove(node)
        nodes.extend(fresh)
        found["stateful_lost"] = sorted(n.node_id for n in removed)
        found["stateful_holding"] = sorted(holding)
        gate.touch()
        run.join()
        found["stateful_s"] = time.monotonic() - t
        # the same config undisturbed, in this process: the same numbers (the gate is open by now)
        found["stateful_plain"] = run_experiment(load_config(None, STATEFUL + [
            f"log.dir={temp / 'plain-stateful'}", "engine.backend=inline", *held(gate, "aggregate")]))[1]

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
        main(Path(sys.argv[1]), temp_dir, tuple(sys.argv[2:]) or PARTS)
    finally:  # Ray's session files too (the Cluster's processes end with this process: shutdown_at_exit)
        shutil.rmtree(temp_dir, ignore_errors=True)
