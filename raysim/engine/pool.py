"""WorkerPool: N ClientWorker actors that run any number of virtual-client jobs, surviving worker deaths.

Ray's ActorPool neither replaces dead actors nor re-runs their jobs, so this small pool does: each worker keeps
``jobs_per_worker`` jobs in flight; when one dies its unfinished jobs go back to the queue and a fresh actor takes its
place. Jobs are pure functions of (config, client state, payload, seed), so a re-run gives the same result.

State stays where a node loss cannot take it. A job's return values live in the object store of the node that made
them (those under Ray's inline limit, 100 KB, come back inside the driver's own process). A client's new state is
kept across rounds, read by evaluation and by the next round, so the pool fetches a large state made on another node
and puts it again from the driver, whose node holds it from then on: a lost worker node takes none with it (the
launch node, where the driver runs, is the run itself). Everything else the driver keeps across rounds (payloads,
``server_history`` objects) it puts itself. A result lost before the driver fetched it (its node died) is a lost
worker: its jobs run again.

Many clients per call: a client update shorter than a Ray round trip is dominated by the hand-offs around it, so
training jobs are sent several to a call (``ClientWorker.train_many``) when ``engine.clients_per_call`` says so, or,
with ``auto``, as many as make a call about ``TARGET_CALL_S`` of the measured per-client time. Each client still
gets its own result and state object, and a batch whose worker dies is re-queued client by client. Sum groups
(``engine.sum_group``: clients whose uploads are summed where they train) are batched whole, several to a
``ClientWorker.train_groups`` call, by the same measure.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import ray
from ray.exceptions import ObjectLostError, RayActorError, WorkerCrashedError

from raysim.engine.placement import in_bundle, this_node, worker_bundle
from raysim.engine.worker import ClientWorker, enable_fast_tensor_serialization
from raysim.errors import RunStopped

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

_WORKER_DIED = (RayActorError, WorkerCrashedError, ObjectLostError)  # a result lost with its node counts too


Submitted = Union[ray.ObjectRef, list]  # one ref, or the refs of a ``num_returns > 1`` method


@dataclass
class Job:
    """One unit of work: ``submit(actor)`` starts it on a worker and returns its object ref(s).

    Like ``ActorPool.submit(fn, value)``, the work is a callable, so the pool needs no knowledge of what the
    workers can do. A job must be a pure function of its inputs: after a worker dies it is submitted again.
    """

    key: int  # results are returned keyed by this (client id, chunk index, ...)
    submit: Callable[[Any], Submitted]
    clients: list[int]  # for error messages
    round: int
    kind: str = "train"  # what the progress line calls this work: train | evaluate | server
    tries: int = field(default=0)
    # (TrainJob, state ref) of a training job that may share one ``train_many`` call with others; None: never
    batch: Optional[tuple[Any, Any]] = None
    # ([TrainJob], [state ref]) of a sum group (``engine.sum_group``) that may share one ``train_groups`` call with
    # the groups after it; its refs are (GroupResult, its clients' states)
    sum_group: Optional[tuple[list, list]] = None
    # engine.vectorize: the jobs of one cohort go to one ``train_cohort`` call, whatever clients_per_call says
    cohort: Optional[int] = None


TARGET_CALL_S = 0.02  # auto batching: a call carries about this much measured client time
MAX_CLIENTS_PER_CALL = 64


def kill_quietly(actors: list[Any]) -> None:
    """``ray.kill`` each actor; one already gone is no error."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def spawn_worker(cfg: ExperimentConfig, index: int, placement_group: Optional[Any] = None) -> Any:
    """Create worker ``index``'s actor (no data yet: the driver sends it with ``attach``)."""
    e = cfg.engine
    options: dict[str, Any] = {"num_cpus": e.cpus_per_worker, "num_gpus": e.gpus_per_worker, "max_restarts": 0}
    if placement_group is not None:
        options.update(in_bundle(placement_group, worker_bundle(e, placement_group, index)))
    return ray.remote(ClientWorker).options(**options).remote(cfg)


def spawn_workers(cfg: ExperimentConfig, placement_group: Optional[Any] = None) -> list[Any]:
    """All of a run's workers, created by the host right after the driver so that the processes of all three
    start at once; Ray prestarts only ``num_cpus`` processes, and a process that starts cold imports torch (~4 s)."""
    return [spawn_worker(cfg, i, placement_group) for i in range(cfg.engine.num_workers)]


class WorkerPool:
    """The run's ClientWorker actors, running any number of jobs with ``jobs_per_worker`` in flight on each.

    Like Ray's ``ActorPool``, but a worker that dies is replaced by a fresh actor in its bundle and its unfinished
    jobs go back to the queue (up to ``engine.max_retries`` times each); every worker has the federated data attached
    before it takes a job. Results come back keyed by ``Job.key``, whatever order they finish in.
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
        self._client_s: Optional[float] = None  # running mean of one client update's time, as workers measure it

    def attach(self, data_ref: ray.ObjectRef) -> None:
        """Send the run's data to every worker (after the central jobs that prepared it); a worker takes no client
        job before its copy has arrived."""
        self._data_ref = data_ref
        for i, worker in enumerate(self.workers):
            self._attach(i, worker)

    def _attach(self, index: int, actor: Any) -> Any:
        probe = actor.attach.remote(self._data_ref) if self._data_ref is not None else actor.info.remote()
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

    def clients_per_call(self, queued: int) -> int:
        """How many batchable jobs the next call takes: ``engine.clients_per_call``, or with ``auto`` enough to make
        a call ~TARGET_CALL_S of measured work, never more than an even share of the queue over the workers' slots
        (so no worker idles while another holds a long batch), and 1 until a job time has been measured."""
        setting = self.cfg.engine.clients_per_call
        if setting != "auto":
            return max(1, int(setting))
        if self._client_s is None:
            return 1
        wanted = math.ceil(TARGET_CALL_S / max(self._client_s, 1e-4))
        share = math.ceil(queued / (len(self.workers) * self.cfg.engine.jobs_per_worker))
        return max(1, min(wanted, share, MAX_CLIENTS_PER_CALL))

    def _submit(self, queue: deque, worker: Any) -> tuple[list[Job], list[Submitted]]:
        """Start the next job, or the next run of batchable jobs in one call; returns (jobs, each job's refs)."""
        group = [queue.popleft()]
        if group[0].cohort is not None:  # engine.vectorize: a cohort's jobs (clients or sum groups), whole, in one call
            while queue and queue[0].cohort == group[0].cohort:
                group.append(queue.popleft())
            if group[0].sum_group is not None:
                return group, self._submit_groups(group, worker, stacked=True)
        elif group[0].batch is not None:
            k = self.clients_per_call(len(queue) + 1)
            while len(group) < k and queue and queue[0].batch is not None and queue[0].cohort is None:
                group.append(queue.popleft())
        elif group[0].sum_group is not None:  # whole groups, as many as make about k clients
            k, clients = self.clients_per_call(len(queue) + 1), len(group[0].sum_group[0])
            while queue and queue[0].sum_group is not None and queue[0].cohort is None \
                    and clients + len(queue[0].sum_group[0]) <= k:
                clients += len(queue[0].sum_group[0])
                group.append(queue.popleft())
            if len(group) > 1:
                return group, self._submit_groups(group, worker)
        if len(group) == 1:
            return group, [group[0].submit(worker)]
        method = worker.train_cohort if group[0].cohort is not None else worker.train_many
        refs = method.options(num_returns=2 * len(group)).remote(
            [j.batch[0] for j in group], *[j.batch[1] for j in group])
        return group, [refs[2 * i:2 * i + 2] for i in range(len(group))]

    @staticmethod
    def _started(probe: ray.ObjectRef) -> Optional[str]:
        """Raise what a worker's first call raised (a GPU share it cannot use, data it cannot load), in its own
        words; a worker that died is replaced when its first job fails. Returns the worker's node (None: it died)."""
        try:
            return ray.get(probe)["node"]
        except _WORKER_DIED:
            return None

    @staticmethod
    def _submit_groups(jobs: list[Job], worker: Any, stacked: bool = False) -> list[Submitted]:
        """Several sum groups in one ``train_groups`` call (``stacked``: one cohort's, trained as one batched
        computation); each job's refs are [its GroupResult, its states]."""
        works = [j.sum_group[0] for j in jobs]
        refs = worker.train_groups.options(num_returns=len(jobs) + sum(len(w) for w in works)).remote(
            works, *[s for j in jobs for s in j.sum_group[1]], stacked=stacked)
        outs, at = [], len(jobs)
        for i, w in enumerate(works):
            outs.append([refs[i], *refs[at:at + len(w)]])
            at += len(w)
        return outs

    def _measured(self, value: Any) -> None:
        seconds = getattr(value, "seconds", None)  # a TrainResult's, or a GroupResult's mean per client
        if isinstance(seconds, (int, float)) and seconds > 0:
            self._client_s = seconds if self._client_s is None else 0.7 * self._client_s + 0.3 * seconds

    def run(self, jobs: list[Job]) -> dict[int, Any]:
        """Run every job once (re-running those whose worker died) and return {job.key: result}; for a job that
        returns several objects the result is (first value, [the other refs]), so a client's state stays in the
        object store."""
        queue: deque[Job] = deque(jobs)
        inflight: dict[ray.ObjectRef, tuple[list[Job], int, list[Submitted]]] = {}
        load = [0] * len(self.workers)
        results: dict[int, Any] = {}
        self.progress = (0, len(jobs), jobs[0].kind if jobs else "")  # (done, total, kind), read by Driver.progress
        per_worker = self.cfg.engine.jobs_per_worker
        while queue or inflight:
            for w in range(len(self.workers)):
                while queue and load[w] < per_worker and self._starting[w] is None:
                    group, outs = self._submit(queue, self.workers[w])
                    wait_ref = outs[-1][0] if isinstance(outs[-1], list) else outs[-1]
                    inflight[wait_ref] = (group, w, outs)
                    load[w] += 1
            starting = [r for r in self._starting if r is not None]
            ready, _ = ray.wait(list(inflight) + starting, num_returns=1)
            ref = ready[0]
            if ref not in inflight:  # a worker came up (or died starting: its first job is then re-queued)
                index = self._starting.index(ref)
                self._starting[index] = None
                self._nodes[index] = self._started(ref)
                continue
            group, w, outs = inflight.pop(ref)
            load[w] -= 1
            try:
                values = self._fetch(w, outs)
            except _WORKER_DIED as exc:
                if self._closed:
                    raise RunStopped("the worker pool was shut down during a round") from None
                lost = group + [j for r, (js, jw, _) in list(inflight.items()) if jw == w for j in js]
                for r in [r for r, (_, jw, _) in inflight.items() if jw == w]:
                    inflight.pop(r)
                load[w] = 0
                self._replace(w)
                for j in lost:
                    j.tries += 1
                    if j.tries > self.cfg.engine.max_retries:
                        who = f"client {j.clients[0]}" if len(j.clients) == 1 else f"clients {j.clients}"
                        what = "an object it needed was lost" if isinstance(exc, ObjectLostError) else "worker died"
                        raise RunStopped(f"{who} in round {j.round}: {what} {j.tries} times "
                                         f"(engine.max_retries={self.cfg.engine.max_retries}); last cause: "
                                         f"{_first_line(exc)}") from None
                    queue.appendleft(j)
                continue
            for job, out, value in zip(group, outs, values):
                results[job.key] = (value, out[1:]) if isinstance(out, list) else value
                self._measured(value)
            self.progress = (len(results), len(jobs), group[0].kind)
        return results

    def shutdown(self) -> None:
        self._closed = True
        kill_quietly(self.workers)
        self.workers = []


def _elsewhere(location: Optional[dict], here: str) -> bool:
    """Whether an object, by ``ray.experimental.get_object_locations``, is in the store of another node only (or
    spilled to a disk): a small return value is inside the driver's own process (no node at all)."""
    if not location:
        return True  # unknown: copy, to be safe
    nodes = location.get("node_ids") or []
    return bool(location.get("did_spill")) or (bool(nodes) and here not in nodes)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
