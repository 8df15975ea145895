"""Where a run's processes go: the placement-group bundle layout, and the launch node.

**Bundles** (one layout for the runner, the pool and Tune). Bundle 0 holds the driver's CPUs (held by a Tune
trial's own actor; the driver itself runs on the launch node, below); then one bundle per worker. With
``driver_cpus = 0`` the head bundle is empty and Tune leaves it out of the group, so workers always take the group's
last ``num_workers`` bundles.

**The launch node.** Every process that reads or writes a run directory runs on the node where the command was typed.

Nodes of a cluster need not share a filesystem, so run directories, ``metrics.jsonl``, TensorBoard files,
checkpoints and the sweep table stay where ``raysim run`` / ``raysim tune`` was started, and everything else reaches
that node through Ray:

- ``raysim run``: the command's process prepares the run directory and runs the driver itself (it writes metrics,
  TensorBoard events and checkpoints); workers run anywhere and return results as Ray objects.
- a Tune trial: Tune places the trial's actor in the trial's placement group, on any node. On the launch node the
  actor runs the trial's raysim run itself (and a run of one CPU worker runs whole in it, on the in-process executor,
  computing on the CPU its bundle reserves: ``raysim.tune.trials.run_trial``). Elsewhere that actor only relays: it
  starts a :class:`TrialHost` on the launch node (``launch_node``, recorded by the sweep) and reports the rounds the
  host streams back. The host runs the trial's whole raysim run there (run directory, resume from its checkpoint,
  driver); the workers take the placement group's bundles on whatever nodes hold them. So a trial that Tune
  restarts on another node finds its checkpoint where it left it.

The host is created by the trial (Ray ends an actor when its owner dies) and runs the driver in its own process, so
a trial that ends, or is lost with its node, leaves nothing running; the placement group's first bundle holds the
driver's CPUs (``engine.driver_cpus``) for the trial, so the host itself asks for none.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterator

import ray


def run_bundles(engine: Any) -> list[dict[str, float]]:
    """The bundles a whole run asks for: the driver's, then one per worker (what a Tune trial reserves)."""
    head = {"CPU": float(engine.driver_cpus)} if engine.driver_cpus else {}
    worker = {"CPU": float(engine.cpus_per_worker)}
    if engine.gpus_per_worker:
        worker["GPU"] = float(engine.gpus_per_worker)
    return [head] + [dict(worker) for _ in range(engine.num_workers)]


def worker_bundle(engine: Any, placement_group: Any, index: int) -> int:
    """Worker ``index``'s bundle: counted from the end, since Tune drops an empty head bundle."""
    return placement_group.bundle_count - engine.num_workers + index


def in_bundle(placement_group: Any, bundle: int) -> dict[str, Any]:
    """Actor options that place it in ``bundle`` of ``placement_group``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=placement_group,
                                                                    placement_group_bundle_index=bundle)}


_DONE = object()


class TrialStopped(Exception):
    """Tune ended the trial (a scheduler stopped or paused it): its run ends as a killed run would."""


def this_node() -> str:
    """The Ray node id of the calling process (the launch node, when called where the command was typed)."""
    return ray.get_runtime_context().get_node_id()


def pinned_to(node_id: str) -> dict[str, Any]:
    """Actor options that keep an actor on ``node_id``, outside any placement group the caller runs in."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


class TrialHost:
    """Runs ``fn(*args, report=..., on_start=..., stopped=...)`` (a trial's raysim run) in a thread of this actor
    and streams what it reports; ``stop()`` ends the run as Tune ending the trial did when the run was in the
    trial's thread."""

    def __init__(self) -> None:
        from raysim.interrupts import quiet_exit_on_sigterm

        quiet_exit_on_sigterm()  # Ray ending this process is no error to print
        self._stopped = threading.Event()
        self._driver: Any = None
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[..., None], *args: Any) -> Iterator[dict]:
        out: queue.Queue = queue.Queue()

        def report(row: dict) -> None:
            if self._stopped.is_set():
                raise TrialStopped
            out.put(row)

        def on_start(info: dict) -> None:
            self._driver = info["control"]
            if self._stopped.is_set():
                raise TrialStopped

        def target() -> None:
            try:
                fn(*args, report=report, on_start=on_start, stopped=self._stopped.is_set)
                out.put(_DONE)
            except BaseException as exc:  # noqa: BLE001 - handed to the trial, which raises it to Tune
                out.put(exc)

        self._thread = threading.Thread(target=target, name="raysim-trial", daemon=True)
        self._thread.start()
        while True:
            item = out.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def stop(self, timeout: float = 30.0) -> None:
        """End the run: its driver is shut down (the runner then ends its workers and tidies the run directory)."""
        self._stopped.set()
        control = self._driver
        if control is not None:
            control.shutdown(timeout)
        if self._thread is not None:
            self._thread.join(timeout)


@contextlib.contextmanager
def trial_host(launch_node: str) -> Iterator[Callable[..., Iterator[dict]]]:
    """``with trial_host(node) as stream: for row in stream(fn, *args): ...``: ``fn`` runs on ``launch_node``."""
    host = ray.remote(TrialHost).options(num_cpus=0, max_concurrency=2, max_restarts=0,
                                         **pinned_to(launch_node)).remote()

    def stream(fn: Callable[..., None], *args: Any) -> Iterator[dict]:
        for ref in host.run.options(num_returns="streaming").remote(fn, *args):
            yield ray.get(ref)

    try:
        yield stream
    finally:
        with contextlib.suppress(Exception):
            ray.get(host.stop.remote(), timeout=60)
        with contextlib.suppress(Exception):
            ray.kill(host, no_restart=True)
