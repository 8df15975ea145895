"""Executors: how a run's jobs run. The round loop (``raysim.engine.driver``) does not know which.

- :class:`InlineExecutor` (``engine.backend=inline``) runs every job in the calling process, one after another,
  with no Ray: notebooks, debuggers (a ``breakpoint()`` in a hook stops in your terminal) and fast tests.
- :class:`RayExecutor` (``engine.backend=ray``) runs them on a :class:`~raysim.engine.pool.WorkerPool` of Ray
  actors, on CPUs or fractional GPUs of any node, re-running the jobs of a worker that dies.

Both hand the same typed jobs to the same core (``raysim.engine.core.ClientJobs``), so they give the same numbers.
An executor also owns the run's objects: ``put`` returns a handle (a Ray object reference, or a private snapshot
in-process) that jobs and the client-state stores carry, and ``get`` returns the values of handles.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch

from raysim.engine.central import run_here
from raysim.engine.cohort import (choose_cohort_size, plan_cohorts, runs_of_cohorts, train_cohort,
                                  train_groups_stacked)
from raysim.engine.core import ClientJobs, copy_tree, threads_for
from raysim.engine.device import configure, cuda_unusable, job_guard, node_name, restore
from raysim.engine.jobs import ClientAccuracy, EvalJob, ServerTrainJob, TrainJob, TrainResult
from raysim.engine.partial import UploadSum
from raysim.engine.state import require_cpu

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

BACKENDS = ("auto", "ray", "inline")


def _recorded_ray_cluster() -> bool:
    """Whether ``ray start`` recorded a cluster on this machine (the file ``ray.init()`` with no address reads),
    found without importing Ray (~1 s): ``$RAY_TMPDIR``, else ``$TMPDIR``, else /tmp, then ``ray/ray_current_cluster``
    (as ``ray._common.utils.get_ray_address_file``)."""
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or os.path.join(os.sep, "tmp")
    return os.path.isfile(os.path.join(tmp, "ray", "ray_current_cluster"))


def choose_backend(engine: Any) -> str:
    """``engine.backend`` resolved: ``ray`` or ``inline``.

    ``auto`` is ``inline`` for a run that Ray would give nothing: one worker (``engine.num_workers=1``), no GPU
    share, no object-store budget (``engine.state_memory_gb``), and no Ray cluster in sight (``engine.address``
    null or ``local``, no ``RAY_ADDRESS``, no cluster recorded by ``ray start``, no Ray already initialised in this
    process, such as a notebook's own ``ray.init()`` or a test session's). Everything else is ``ray``."""
    if engine.backend != "auto":
        return engine.backend
    if engine.num_workers > 1 or engine.gpus_per_worker > 0 or engine.state_memory_gb is not None:
        return "ray"
    if engine.address not in (None, "local"):
        return "ray"
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return "ray"
    if engine.address is None and (os.environ.get("RAY_ADDRESS") or _recorded_ray_cluster()):
        return "ray"
    return "inline"


def inline_device(engine: Any) -> str:
    """The in-process executor's device: the CPU, or CUDA for ``engine.gpus_per_worker > 0`` (a one-line error
    where this process cannot use CUDA)."""
    if engine.gpus_per_worker <= 0:
        return "cpu"
    from raysim.errors import UserError

    cause = cuda_unusable()
    if cause is not None:
        raise UserError(f"config key 'engine.gpus_per_worker': {engine.gpus_per_worker:g} GPU asked for, but this "
                        f"process on {node_name()} cannot use CUDA (engine.backend=inline): {cause}; set "
                        f"engine.gpus_per_worker=0")
    return "cuda"


class Executor:
    """The verbs the round loop uses; results come back keyed by client id (training) or job index."""

    replacements: int = 0  # workers replaced after dying, this invocation (Ray only)
    progress: tuple[int, int, str] = (0, 0, "")  # (jobs done, jobs in this phase, "train" | "evaluate" | "server")

    def put(self, obj: Any) -> Any:
        raise NotImplementedError

    def get(self, handles: list) -> list:
        raise NotImplementedError

    def start(self, workers: Optional[list[Any]] = None) -> None:
        """Get ready to run jobs (the Ray executor takes or creates its workers here); the data comes later."""

    def central(self, train: Callable[[torch.device], Any]) -> Any:
        """Central training as a job with reserved resources: ``train(device)`` where client jobs run, its result
        on the CPU (``raysim.engine.central.run_reserved``, while the driver prepares the data)."""
        raise NotImplementedError

    def attach(self, data: Any) -> None:
        """Hand the run's prepared data to where the jobs run (once, before the first client job)."""
        raise NotImplementedError

    def train(self, jobs: list[TrainJob], states: list[Any],
              cohort_size: int = 1) -> dict[int, tuple[TrainResult, Any]]:
        """Train every job's client; returns {client id: (result, handle of its new state)}. With ``cohort_size``
        > 1 (``engine.vectorize``), the jobs (in client-id order) are cut into fixed cohorts of that many, each
        trained in one process as one batched computation (``raysim.engine.cohort``)."""
        raise NotImplementedError

    def choose_cohort_size(self, jobs: list[TrainJob], states: list[Any]) -> tuple[int, dict]:
        """``engine.vectorize=auto``: the cohort size a probe on these jobs chooses (nothing it trains is kept),
        and what it measured."""
        raise NotImplementedError

    def train_groups(self, groups: list[list[TrainJob]], states: list[list[Any]],
                     cohorts: Optional[list[int]] = None) -> tuple[dict[int, tuple[TrainResult, Any]], list[UploadSum]]:
        """Train each group's clients in one call and sum their uploads there (``engine.partial_sums``); returns
        ({client id: (result without its upload, handle of its new state)}, each group's sum in group order).
        ``cohorts`` (``engine.vectorize``): each group's cohort; the groups of a cohort train in one call as one
        batched computation, each still summed on its own."""
        raise NotImplementedError

    def evaluate(self, jobs: list[EvalJob], states: list[list[Any]]) -> dict[int, list[ClientAccuracy]]:
        """Evaluate every job's clients (``states[i]``: their state handles); returns {job index: rows}."""
        raise NotImplementedError

    def server_train(self, job: ServerTrainJob) -> dict:
        raise NotImplementedError

    def info(self) -> list[dict]:
        return []

    def shutdown(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------- in-process
class InlineExecutor(Executor):
    """Every job in this process, one after another, on ``engine.cpus_per_worker`` torch threads.

    Handles are private snapshots: what is put (a payload, a kept state, an upload) is copied, and every job gets
    its own copy of the states it reads, so a hook that changes a tensor in place changes nothing anyone else sees,
    exactly as when the objects cross Ray's object store."""

    def __init__(self, cfg: ExperimentConfig, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.where = f"this process on {node_name()} ({self.device})"
        self.jobs: Optional[ClientJobs] = None  # made once the data is prepared (attach)
        self._restore = configure(self.device, cfg.engine.deterministic, cfg.engine.gpus_per_worker)

    def attach(self, data: Any) -> None:
        self.jobs = ClientJobs(self.cfg, data, self.device)

    def central(self, train: Callable[[torch.device], Any]) -> Any:
        with self._threads(), self._guard("central training"):
            return run_here(train, self.device)

    def _guard(self, what: Any) -> Any:
        return job_guard(what, self.where, self.cfg)

    def shutdown(self) -> None:
        """Give the process back its torch settings (a GPU run switched determinism on)."""
        restore(self._restore)
        self._restore = {}

    def put(self, obj: Any) -> Any:
        """A private copy, as Ray's object store would give: of CPU tensors only, as there."""
        require_cpu(obj, "an object put into the store")
        return copy_tree(obj)

    def get(self, handles: list) -> list:
        return list(handles)

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        saved = torch.get_num_threads()
        torch.set_num_threads(threads_for(self.cfg.engine.cpus_per_worker))
        try:
            yield
        finally:
            torch.set_num_threads(saved)

    def train(self, jobs: list[TrainJob], states: list[Any],
              cohort_size: int = 1) -> dict[int, tuple[TrainResult, Any]]:
        out: dict[int, tuple[TrainResult, Any]] = {}
        self.progress = (0, len(jobs), "train")
        with self._threads():
            for cohort in plan_cohorts(len(jobs), cohort_size):
                group = [jobs[i] for i in cohort]
                group_states = [copy_tree(states[i]) for i in cohort]
                first = group[0]
                with self._guard(f"client {first.client_id}'s training in round {first.round}"
                                 + (f" (a cohort of {len(group)})" if len(group) > 1 else "")):
                    if len(group) == 1:
                        done = [self.jobs.train(first, first.payload_ref, first.own_payload_ref, group_states[0])]
                    else:
                        done = train_cohort(self.jobs, group, first.payload_ref, [j.own_payload_ref for j in group],
                                            group_states)
                for job, (result, keep) in zip(group, done):
                    result.upload = copy_tree(result.upload)  # a snapshot: nothing of the job's model stays shared
                    out[job.client_id] = (result, copy_tree(keep))
                self.progress = (len(out), len(jobs), "train")
        return out

    def train_groups(self, groups: list[list[TrainJob]], states: list[list[Any]],
                     cohorts: Optional[list[int]] = None) -> tuple[dict[int, tuple[TrainResult, Any]], list[UploadSum]]:
        out: dict[int, tuple[TrainResult, Any]] = {}
        sums: list[UploadSum] = []
        self.progress = (0, len(groups), "train")
        with self._threads():
            for batch in runs_of_cohorts(len(groups), cohorts):  # one group, or a cohort's groups stacked
                part = [groups[i] for i in batch]
                part_states = [[copy_tree(s) for s in states[i]] for i in batch]
                rnd = part[0][0].round
                with self._guard(lambda: f"client {self.jobs.busy}'s training in round {rnd}"):  # noqa: B023
                    if cohorts is None:
                        summed = [self.jobs.train_group(part[0], part[0][0].payload_ref,
                                                        [j.own_payload_ref for j in part[0]], part_states[0])]
                    else:
                        summed = train_groups_stacked(self.jobs, part, part[0][0].payload_ref,
                                                      [[j.own_payload_ref for j in g] for g in part], part_states)
                for total, done in summed:
                    sums.append(total)
                    out.update((result.client_id, (result, copy_tree(keep))) for result, keep in done)
                self.progress = (len(sums), len(groups), "train")
        return out, sums

    def choose_cohort_size(self, jobs: list[TrainJob], states: list[Any]) -> tuple[int, dict]:
        with self._threads(), self._guard(f"the engine.vectorize=auto probe in round {jobs[0].round}"):
            return choose_cohort_size(self.jobs, jobs, jobs[0].payload_ref, [j.own_payload_ref for j in jobs],
                                      [copy_tree(s) for s in states])

    def evaluate(self, jobs: list[EvalJob], states: list[list[Any]]) -> dict[int, list[ClientAccuracy]]:
        out: dict[int, list[ClientAccuracy]] = {}
        self.progress = (0, len(jobs), "evaluate")
        with self._threads():
            for i, (job, chunk_states) in enumerate(zip(jobs, states)):
                owns = job.own_payload_refs or [None] * len(job.client_ids)
                with self._guard(f"the evaluation of clients {job.client_ids} after round {job.round}"):
                    out[i] = self.jobs.evaluate(job, job.payload_ref, owns, [copy_tree(s) for s in chunk_states])
                self.progress = (len(out), len(jobs), "evaluate")
        return out

    def server_train(self, job: ServerTrainJob) -> dict:
        self.progress = (0, 1, "server")
        with self._threads(), self._guard(f"the server-side training of round {job.round}"):
            history = {cid: copy_tree(list(objs)) for cid, objs in job.history_refs.items()}
            return self.jobs.server_train(job.round, job.state_ref, job.updates_ref, history)


# ---------------------------------------------------------------------------------------------------- Ray
class RayExecutor(Executor):
    """Jobs on a pool of ``ClientWorker`` actors (``raysim.engine.pool``); objects in Ray's object store."""

    def __init__(self, cfg: ExperimentConfig, placement_group: Any = None):
        import ray

        from raysim.engine.worker import enable_fast_tensor_serialization

        enable_fast_tensor_serialization()  # the driver's payload puts and result gets
        self.cfg = cfg
        self._ray = ray
        self._placement_group = placement_group
        self.pool: Any = None

    @property
    def replacements(self) -> int:  # type: ignore[override]
        return self.pool.replacements if self.pool is not None else 0

    @property
    def progress(self) -> tuple[int, int, str]:  # type: ignore[override]
        return getattr(self.pool, "progress", (0, 0, ""))

    def put(self, obj: Any) -> Any:
        return self._ray.put(obj)

    def get(self, handles: list) -> list:
        return self._ray.get(list(handles)) if handles else []

    def start(self, workers: Optional[list[Any]] = None) -> None:
        from raysim.engine.pool import WorkerPool

        if self.pool is None:
            self.pool = WorkerPool(self.cfg, None, self._placement_group, workers)

    def attach(self, data: Any) -> None:
        self.start()
        self.pool.attach(self._ray.put(data))  # once per run; jobs carry client ids, never samples

    def central(self, train: Callable[[torch.device], Any]) -> Any:
        """On whichever worker is free first, with its reserved CPU/GPU share; re-run elsewhere if it dies."""
        from raysim.engine.pool import Job

        self.start()
        return self.pool.run([Job(key=0, submit=lambda w: w.central.remote(train), clients=[], round=0,
                                  kind="central")])[0]

    def train(self, jobs: list[TrainJob], states: list[Any],
              cohort_size: int = 1) -> dict[int, tuple[TrainResult, Any]]:
        from raysim.engine.pool import Job

        cohort_of = {i: c for c, positions in enumerate(plan_cohorts(len(jobs), cohort_size)) for i in positions}

        def job(i: int, work: TrainJob, state: Any) -> Job:
            return Job(key=work.client_id, submit=lambda w: w.train.remote(work, state), clients=[work.client_id],
                       round=work.round, batch=(work, state), cohort=cohort_of[i] if cohort_size > 1 else None)

        done = self.pool.run([job(i, w, s) for i, (w, s) in enumerate(zip(jobs, states))])
        return {cid: (result, refs[0]) for cid, (result, refs) in done.items()}

    def train_groups(self, groups: list[list[TrainJob]], states: list[list[Any]],
                     cohorts: Optional[list[int]] = None) -> tuple[dict[int, tuple[TrainResult, Any]], list[UploadSum]]:
        from raysim.engine.pool import Job

        stacked = cohorts is not None

        def job(i: int, works: list[TrainJob], group_states: list[Any]) -> Job:
            return Job(key=i, submit=lambda w: w.train_group.options(num_returns=1 + len(works)).remote(
                works, *group_states, stacked=stacked), clients=[j.client_id for j in works], round=works[0].round,
                sum_group=(works, group_states), cohort=cohorts[i] if stacked else None)

        done = self.pool.run([job(i, g, s) for i, (g, s) in enumerate(zip(groups, states))])
        out: dict[int, tuple[TrainResult, Any]] = {}
        for i in range(len(groups)):
            group, state_refs = done[i]
            out.update((result.client_id, (result, ref)) for result, ref in zip(group.results, state_refs))
        return out, [done[i][0].upload_sum for i in range(len(groups))]

    def choose_cohort_size(self, jobs: list[TrainJob], states: list[Any]) -> tuple[int, dict]:
        from raysim.engine.pool import Job

        probe = Job(key=0, submit=lambda w: w.choose_cohort_size.remote(jobs, *states), clients=[],
                    round=jobs[0].round)
        return self.pool.run([probe])[0]

    def evaluate(self, jobs: list[EvalJob], states: list[list[Any]]) -> dict[int, list[ClientAccuracy]]:
        from raysim.engine.pool import Job

        def job(i: int, work: EvalJob, chunk_states: list) -> Job:
            return Job(key=i, submit=lambda w: w.evaluate.remote(work, chunk_states), clients=work.client_ids,
                       round=work.round, kind="evaluate")

        return self.pool.run([job(i, w, s) for i, (w, s) in enumerate(zip(jobs, states))])

    def server_train(self, job: ServerTrainJob) -> dict:
        from raysim.engine.pool import Job

        done = self.pool.run([Job(key=0, submit=lambda w: w.server_train.remote(job), clients=[], round=job.round,
                                  kind="server")])
        return done[0]

    def info(self) -> list[dict]:
        return self.pool.info() if self.pool is not None else []

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
