"""WorkerPool: N ClientWorker actors that run any number of calls, surviving worker deaths.

Ray's ActorPool neither replaces dead actors nor re-runs their work, so this small pool does: each worker keeps
``jobs_per_worker`` calls in flight; when one dies its unfinished calls go back to the queue and a fresh actor takes
its place. A call (``raysim.engine.jobs``) is a pure function of (config, client states, payload, seed), so a re-run
gives the same result. The pool knows nothing of what a call does: it hands it to the worker's one verb
(``ClientWorker.run``) with its arguments and as many returns as the call declares.

State stays where a node loss cannot take it. A call's return values live in the object store of the node that made
them (those under Ray's inline limit, 100 KB, come back inside the driver's own process). A client's new state is
kept across rounds, read by evaluation and by the next round, so the pool fetches a large state made on another node
and puts it again from the driver, whose node holds it from then on: a lost worker node takes none with it (the
launch node, where the driver runs, is the run itself). Everything else the driver keeps across rounds (payloads,
``server_history`` objects) it puts itself. A result lost before the driver fetched it (its node died) is a lost
worker: its calls run again.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

import ray
from ray.exceptions import ObjectLostError, RayActorError, WorkerCrashedError

from raysim.engine.jobs import Call
from raysim.engine.placement import in_bundle, this_node, worker_bundle
from raysim.engine.worker import ClientWorker, enable_fast_tensor_serialization
from raysim.errors import RunStopped
from raysim.tables import counted

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

_WORKER_DIED = (RayActorError, WorkerCrashedError, ObjectLostError)  # a result lost with its node counts too


Submitted = Union[ray.ObjectRef, list]  # one ref, or the refs of a call with several returns


def kill_quietly(actors: list[Any]) -> None:
    """``ray.kill`` each actor; one already gone is no error."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


# ------------------------------------------------------------------------------------------- warm workers
# Inside warm_workers(), a run on Ray that ended hands its live workers to the next run in this process that asks for
# the same share of a node; each new worker process costs ~3 s of CPU here, most of it importing torch.
_warm: dict[str, Any] = {"depth": 0, "idle": []}  # idle: [(key, actor)] of ended runs, kept for the next


@contextlib.contextmanager
def warm_workers() -> Iterator[None]:
    """Runs on Ray inside this block (a notebook cell, a script that loops over configs) reuse the worker actors of
    the run before with the same ``engine.cpus_per_worker`` and ``engine.gpus_per_worker``, instead of starting new
    processes; leaving it ends them. A reused worker is reset to the new config before its data arrives, so it
    computes what a fresh one does (tested). Idle kept workers hold their CPUs, so anything else that schedules on
    this Ray meanwhile (a Tune sweep, a worker of another shape) ends them first."""
    _warm["depth"] += 1
    try:
        yield
    finally:
        _warm["depth"] -= 1
        if not _warm["depth"]:
            release_warm_workers()


def release_warm_workers() -> None:
    """End the kept workers (before something else needs their CPUs)."""
    idle, _warm["idle"] = _warm["idle"], []
    kill_quietly([actor for _, actor in idle])


def _warm_key(cfg: ExperimentConfig) -> tuple:
    """What a kept worker must share with a run to serve it: this Ray session (the driver's node, whose id is new with
    every Ray started, and its job) and the resources the worker holds."""
    context = ray.get_runtime_context()
    return (context.get_node_id(), context.get_job_id(), cfg.engine.cpus_per_worker, cfg.engine.gpus_per_worker)


def _keep(cfg: ExperimentConfig, actors: list[Any]) -> bool:
    """Keep ``actors`` for the next run (inside warm_workers(), on this Ray); False: the caller ends them."""
    if not _warm["depth"] or not ray.is_initialized():
        return False
    key = _warm_key(cfg)
    _warm["idle"].extend((key, actor) for actor in actors)
    return True


def _take_warm(cfg: ExperimentConfig, count: int) -> list[Any]:
    """Up to ``count`` kept workers that fit ``cfg``; every other kept worker is ended (its CPUs are for the new
    ones)."""
    key = _warm_key(cfg) if _warm["idle"] else None
    fit = [actor for k, actor in _warm["idle"] if k == key][:count]
    _warm["idle"] = [(k, actor) for k, actor in _warm["idle"] if not any(actor is f for f in fit)]
    release_warm_workers()
    return fit  # the pool's first call to each names its config (ClientWorker._serve)


def spawn_worker(cfg: ExperimentConfig, index: int, placement_group: Optional[Any] = None) -> Any:
    """Create worker ``index``'s actor (no data yet: the driver sends it with ``attach``); kept idle workers are
    ended first, so that their CPUs are free for it."""
    release_warm_workers()
    e = cfg.engine
    options: dict[str, Any] = {"num_cpus": e.cpus_per_worker, "num_gpus": e.gpus_per_worker, "max_restarts": 0}
    if placement_group is not None:
        options.update(in_bundle(placement_group, worker_bundle(e, placement_group, index)))
    return ray.remote(ClientWorker).options(**options).remote(cfg)


def spawn_workers(cfg: ExperimentConfig, placement_group: Optional[Any] = None) -> list[Any]:
    """All of a run's workers, created by the host right after the driver so that the processes of all three
    start at once; Ray prestarts only ``num_cpus`` processes, and a process that starts cold imports torch (~4 s).
    Inside :func:`warm_workers`, the kept workers of the run before come first."""
    kept = _take_warm(cfg, cfg.engine.num_workers) if placement_group is None else []
    return kept + [spawn_worker(cfg, i, placement_group) for i in range(len(kept), cfg.engine.num_workers)]


def end_workers(actors: list[Any]) -> None:
    """End ``actors``, except those a pool kept for the next run (:func:`warm_workers`)."""
    kept = [actor for _, actor in _warm["idle"]]
    kill_quietly([a for a in actors if not any(a is k for k in kept)])


class WorkerPool:
    """The run's ClientWorker actors, running any number of calls with ``jobs_per_worker`` in flight on each.

    Like Ray's ``ActorPool``, but a worker that dies is replaced by a fresh actor in its bundle and its unfinished
    calls go back to the queue (up to ``engine.max_retries`` times each); every worker has the federated data
    attached before it takes a call. Results come back in the calls' order, whatever order they finish in.
    """

    def __init__(self, cfg: ExperimentConfig, data_ref: Optional[ray.ObjectRef], placement_group: Optional[Any] = None,
                 workers: Optional[list[Any]] = None):
        enable_fast_tensor_serialization()  # the driver's payload puts and result gets
        self.cfg = cfg
        self._data_ref = data_ref  # None until the driver has prepared the data (central jobs run before: attach)
        self._pg = placement_group
        # a worker's first call (attach) completes once its process is up; until then no job is queued on it, so
        # the first round starts on the workers that are ready instead of waiting for the slowest cold start
        self._starting: list[Optional[ray.ObjectRef]] = []
        self._here = this_node()  # the driver's node: where kept state must live
        self._nodes: list[Optional[str]] = []  # each worker's node, once its first call returned (None: not yet)
        actors = workers if workers is not None else spawn_workers(cfg, placement_group)
        self.workers: list[Any] = [self._attach(i, a) for i, a in enumerate(actors)]
        self.replacements = 0
        self._closed = False

    def attach(self, data_ref: ray.ObjectRef) -> None:
        """Send the run's data to every worker (after the central jobs that prepared it); a worker takes no client
        job before its copy has arrived."""
        self._data_ref = data_ref
        for i, worker in enumerate(self.workers):
            self._attach(i, worker)

    def _attach(self, index: int, actor: Any) -> Any:
        # the first call names the run's config, which a worker kept from another run then serves (warm_workers)
        probe = (actor.attach.remote(self._data_ref, self.cfg) if self._data_ref is not None
                 else actor.info.remote(self.cfg))
        if index < len(self._starting):
            self._starting[index], self._nodes[index] = probe, None
        else:
            self._starting.append(probe)
            self._nodes.append(None)
        return actor

    def _fetch(self, w: int, outs: list[Submitted]) -> list[Any]:
        """The values of a finished call's first returns. A training job's new states that live on another node than
        the driver's (worker ``w`` is elsewhere, and a state is above Ray's inline limit, or spilled there) are
        fetched too and put again from here: ``outs`` then holds the new references."""
        kept: list[tuple[int, int]] = []  # (which call output, which of its state refs)
        if self._nodes[w] != self._here:
            from ray.experimental import get_object_locations

            states = [(i, k) for i, out in enumerate(outs) if isinstance(out, list) for k in range(1, len(out))]
            where = get_object_locations([outs[i][k] for i, k in states]) if states else {}
            kept = [(i, k) for i, k in states if _elsewhere(where.get(outs[i][k]), self._here)]
        got = ray.get([out[0] if isinstance(out, list) else out for out in outs] + [outs[i][k] for i, k in kept])
        for (i, k), state in zip(kept, got[len(outs):]):
            if state is not None:
                outs[i] = [*outs[i][:k], ray.put(state), *outs[i][k + 1:]]
        return got[:len(outs)]

    def info(self) -> list[dict]:
        """pid, device and thread count of every live worker (waits until all have started)."""
        return ray.get([w.info.remote() for w in self.workers])

    def _replace(self, index: int) -> None:
        kill_quietly([self.workers[index]])
        self.workers[index] = self._attach(index, spawn_worker(self.cfg, index, self._pg))
        self.replacements += 1

    @staticmethod
    def _submit(call: Call, worker: Any) -> Submitted:
        """Start ``call`` on ``worker``: its arguments as top-level arguments (Ray resolves them), its returns as
        separate objects."""
        method = worker.run.options(num_returns=call.returns) if call.returns > 1 else worker.run
        return method.remote(call, *call.args())

    @staticmethod
    def _started(probe: ray.ObjectRef) -> Optional[str]:
        """Raise what a worker's first call raised (a GPU share it cannot use, data it cannot load), in its own
        words; a worker that died is replaced when its first job fails. Returns the worker's node (None: it died)."""
        try:
            return ray.get(probe)["node"]
        except _WORKER_DIED:
            return None

    def run(self, calls: list[Call], on_result: Optional[Callable[[int, Any], None]] = None) -> list[Any]:
        """Run every call once (re-running those whose worker died) and return their results in order; for a call
        with several returns the result is (first value, [the other refs]), so a client's state stays in the
        object store. ``on_result(index, first value)``: told of each call once, as its result is fetched."""
        queue: deque[int] = deque(range(len(calls)))
        tries = [0] * len(calls)
        inflight: dict[ray.ObjectRef, tuple[int, int, Submitted]] = {}  # wait ref -> (call, worker, its refs)
        load = [0] * len(self.workers)
        results: dict[int, Any] = {}
        kind = calls[0].kind if calls else ""
        self.progress = (0, len(calls), kind)  # (done, total, kind), read by Driver.progress
        per_worker = self.cfg.engine.jobs_per_worker
        while queue or inflight:
            # breadth first: each ready worker takes one call before any takes a second, so that a round of two
            # calls (two evaluation blocks, two sum groups) runs on two workers, not queued on the first
            while queue:
                ready = [w for w in range(len(self.workers)) if load[w] < per_worker and self._starting[w] is None]
                if not ready:
                    break
                w = min(ready, key=lambda k: load[k])
                index = queue.popleft()
                out = self._submit(calls[index], self.workers[w])
                inflight[out[-1] if isinstance(out, list) else out] = (index, w, out)
                load[w] += 1
            starting = [r for r in self._starting if r is not None]
            ready, _ = ray.wait(list(inflight) + starting, num_returns=1)
            ref = ready[0]
            if ref not in inflight:  # a worker came up (or died starting: its first call is then re-queued)
                at = self._starting.index(ref)
                self._starting[at] = None
                self._nodes[at] = self._started(ref)
                continue
            index, w, out = inflight.pop(ref)
            load[w] -= 1
            try:
                fetched = [out]  # _fetch puts a kept state made on another node again from here, in place
                value = self._fetch(w, fetched)[0]
                out = fetched[0]
            except _WORKER_DIED as exc:
                if self._closed:
                    raise RunStopped("the worker pool was shut down during a round") from None
                lost = [index] + [i for i, jw, _ in inflight.values() if jw == w]
                for r in [r for r, (_, jw, _) in inflight.items() if jw == w]:
                    inflight.pop(r)
                load[w] = 0
                self._replace(w)
                for i in lost:
                    tries[i] += 1
                    if tries[i] > self.cfg.engine.max_retries:
                        raise RunStopped(_gave_up(calls[i], tries[i], self.cfg.engine.max_retries, exc)) from None
                    queue.appendleft(i)
                continue
            results[index] = (value, out[1:]) if isinstance(out, list) else value
            if on_result is not None:
                on_result(index, value)
            self.progress = (len(results), len(calls), kind)
        return [results[i] for i in range(len(calls))]

    def shutdown(self, keep: bool = False) -> None:
        """End the workers; ``keep`` (a run that ended, no call in flight): inside :func:`warm_workers`, keep them
        for the next run instead (never those of a Tune trial's placement group)."""
        self._closed = True
        if not (keep and self._pg is None and _keep(self.cfg, self.workers)):
            kill_quietly(self.workers)
        self.workers = []


def _elsewhere(location: Optional[dict], here: str) -> bool:
    """Whether an object, by ``ray.experimental.get_object_locations``, is in the store of another node only (or
    spilled to a disk): a small return value is inside the driver's own process (no node at all)."""
    if not location:
        return True  # unknown: copy, to be safe
    nodes = location.get("node_ids") or []
    return bool(location.get("did_spill")) or (bool(nodes) and here not in nodes)


def _gave_up(call: Call, tries: int, limit: int, exc: BaseException) -> str:
    """Why the run stops after ``call``'s worker died ``tries`` times (more than ``engine.max_retries``)."""
    clients = call.clients
    who = (f"client {clients[0]}" if len(clients) == 1 else f"clients {clients}" if clients
           else call.describe())
    what = "an object it needed was lost" if isinstance(exc, ObjectLostError) else "worker died"
    return (f"{who} in round {call.round}: {what} {counted(tries, 'time')} (engine.max_retries={limit}); last cause: "
            f"{_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
