"""Executors: how a run's jobs run. The round loop (``raysim.engine.driver``) does not know which.

- :class:`InlineExecutor` (``engine.backend=inline``) runs every job in the calling process, one after another,
  with no Ray: notebooks, debuggers (a ``breakpoint()`` in a hook stops in your terminal) and fast tests.
- :class:`RayExecutor` (``engine.backend=ray``) runs them on a :class:`~raysim.engine.pool.WorkerPool` of Ray
  actors, on CPUs or fractional GPUs of any node, re-running the jobs of a worker that dies.

An executor has Flower's backend shape: ``put`` and ``get`` for the run's objects (a handle is a Ray object
reference, or a private snapshot in-process, that calls and the client-state stores carry), ``run(calls)`` for the
work, and ``shutdown``; ``start`` and ``attach`` set it up. A call (``raysim.engine.jobs``) says what it runs on a
process's client-job core (``raysim.engine.core.ClientJobs``), so both executors hand the same calls to the same
core and give the same numbers; neither knows what a call does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from raysim.algorithms.training import torch_threads
from raysim.engine.device import configure, cuda_unusable, job_guard, node_name, restore
from raysim.engine.jobs import Call, CallResult
from raysim.engine.state import require_cpu
from raysim.trees import copy_tree

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


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
    """The verbs the round loop uses."""

    replacements: int = 0  # workers replaced after dying, this invocation (Ray only)
    progress: tuple[int, int, str] = (0, 0, "")  # (calls done, calls in this batch, what they do)
    slots: int = 1  # calls in flight at once (what the plan shares a round's clients over)
    workers: int = 1  # processes that take calls at once (what the plan splits a round's last groups over)

    def put(self, obj: Any) -> Any:
        raise NotImplementedError

    def get(self, handles: list) -> list:
        raise NotImplementedError

    def start(self, workers: Optional[list[Any]] = None) -> None:
        """Get ready to run calls (the Ray executor takes or creates its workers here); the data comes later."""

    def attach(self, data: Any) -> None:
        """Hand the run's prepared data to where the calls run (once, before the first client call)."""
        raise NotImplementedError

    def run(self, calls: list[Call], on_result: Optional[Callable[[int, Any], None]] = None) -> list[Any]:
        """Run every call; returns their results in order: a call's one object, or (its first object, handles of
        the others) for a call with several returns (a training call's kept states). ``on_result(index, first
        object)`` is told of each call as its result comes in, in any order (the round's sum is taken so)."""
        raise NotImplementedError

    def info(self) -> list[dict]:
        return []

    def shutdown(self, keep_workers: bool = False) -> None:
        """Release what the executor holds; ``keep_workers``: the run ended, so its Ray workers may serve the next
        one (``raysim.engine.pool.warm_workers``)."""


# ---------------------------------------------------------------------------------------------------- in-process
class InlineExecutor(Executor):
    """Every call in this process, one after another, on ``engine.cpus_per_worker`` torch threads.

    Handles are private snapshots: what is put (a payload, a kept state, an upload) is copied, every call gets its
    own copy of the handles it reads, and what leaves a call is copied, so a hook that changes a tensor in place
    changes nothing anyone else sees, exactly as when the objects cross Ray's object store."""

    def __init__(self, cfg: ExperimentConfig, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.where = f"this process on {node_name()} ({self.device})"
        self.jobs: Any = None  # the client-job core, made once the data is prepared (attach)
        self._restore = configure(self.device, cfg.engine.deterministic, cfg.engine.gpus_per_worker)

    def attach(self, data: Any) -> None:
        from raysim.engine.core import ClientJobs

        self.jobs = ClientJobs(self.cfg, data, self.device)

    def shutdown(self, keep_workers: bool = False) -> None:
        """Give the process back its torch settings (a GPU run switched determinism on)."""
        restore(self._restore)
        self._restore = {}

    def put(self, obj: Any) -> Any:
        """A private copy, as Ray's object store would give: of CPU tensors only, as there."""
        require_cpu(obj, "an object put into the store")
        return copy_tree(obj)

    def get(self, handles: list) -> list:
        return list(handles)

    # what a call sees of this process (raysim.engine.jobs.Host): handles are the values themselves
    def fetch(self, handles: list) -> list:
        return [copy_tree(h) for h in handles]

    def shared(self, handle: Any) -> Any:
        return handle  # the core gives every job its own copy of the shared payload

    def run(self, calls: list[Call], on_result: Optional[Callable[[int, Any], None]] = None) -> list[Any]:
        out = []
        self.progress = (0, len(calls), calls[0].kind if calls else "")
        with torch_threads(self.cfg.engine.cpus_per_worker):
            for call in calls:
                values = [copy_tree(v) for v in call.args()]
                with job_guard(lambda: call.describe(self), self.where, self.cfg):  # noqa: B023
                    got = _private(call.run(self, values))
                out.append((got[0], got[1:]) if call.returns > 1 else got[0])
                if on_result is not None:
                    on_result(len(out) - 1, got[0])
                self.progress = (len(out), len(calls), call.kind)
        return out


def _private(objects: list) -> list:
    """What leaves an in-process call, copied so that nothing of the call's models stays shared: every tensor,
    except the buffers of a training call's sums, which the sum made itself, and the uploads the core marks
    ``private`` (the base ``client_upload``'s clones: a second copy of 100 held uploads cost FedBuff ~3.5 ms a step)."""
    first = objects[0]
    if not isinstance(first, CallResult):
        return copy_tree(objects)
    for result in first.results:
        if not result.private:
            result.upload = copy_tree(result.upload)
    for total in first.sums:
        total.single = copy_tree(total.single)
    return [first, *copy_tree(objects[1:])]


# ---------------------------------------------------------------------------------------------------- Ray
class RayExecutor(Executor):
    """Calls on a pool of ``ClientWorker`` actors (``raysim.engine.pool``); objects in Ray's object store."""

    def __init__(self, cfg: ExperimentConfig, placement_group: Any = None):
        import ray

        from raysim.engine.worker import enable_fast_tensor_serialization

        enable_fast_tensor_serialization()  # the driver's payload puts and result gets
        self.cfg = cfg
        self._ray = ray
        self._placement_group = placement_group
        self.pool: Any = None
        self.slots = cfg.engine.num_workers * cfg.engine.jobs_per_worker
        self.workers = cfg.engine.num_workers

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
        self.pool.attach(self._ray.put(data))  # once per run; calls carry client ids, never samples

    def run(self, calls: list[Call], on_result: Optional[Callable[[int, Any], None]] = None) -> list[Any]:
        """On whichever worker is free first; a call whose worker dies runs again elsewhere."""
        self.start()
        return self.pool.run(calls, on_result)

    def info(self) -> list[dict]:
        return self.pool.info() if self.pool is not None else []

    def shutdown(self, keep_workers: bool = False) -> None:
        if self.pool is not None:
            self.pool.shutdown(keep=keep_workers)
