"""ClientWorker: a Ray actor around the client-job core (``raysim.engine.core.ClientJobs``).

A worker holds no client's state between jobs: each job brings the client's state (an object-store reference) and
the round's payload, and returns the upload and the new state. The actor only resolves references, fetches the
round's shared payload once, and hands values to the core, which does the work exactly as the in-process executor
does.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import ray
import torch

from raysim.engine.central import run_here
from raysim.engine.cohort import choose_cohort_size, train_cohort, train_groups_stacked
from raysim.engine.core import ClientJobs
from raysim.engine.device import configure, cuda_unusable, job_guard, memory_info, node_name, refuse_gpu_share
from raysim.engine.jobs import ClientAccuracy, EvalJob, GroupResult, ServerTrainJob, TrainJob, TrainResult
from raysim.errors import NotOnCPU, UserError
from raysim.registry import import_plugins

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


def _reduce_tensor(t: torch.Tensor) -> tuple:
    """Ray's default pickling of a tensor runs a whole ``torch.save`` per storage (~2 ms for a small state dict,
    ~1.5 ms more to load it); a byte view as a numpy array goes through pickle 5's out-of-band buffers instead.

    Only CPU tensors enter the object store: the engine moves uploads, kept states and server states to the CPU
    before they leave a job, so a device tensor here is a tensor that escaped that path (a hook's own object), and
    one that would be rebuilt on a device the reader may not have (a CPU driver) or on GPU 0."""
    if t.device.type != "cpu":
        raise NotOnCPU(f"a {t.device} tensor of shape {list(t.shape)} was about to enter Ray's object store, which "
                       f"holds CPU tensors only; move it to the CPU (.cpu()) in the hook that returns it")
    cpu = t.detach().contiguous()
    raw = cpu.reshape(-1).view(torch.uint8).numpy() if cpu.numel() else np.empty(0, dtype=np.uint8)
    return _rebuild_tensor, (raw, cpu.dtype, tuple(cpu.shape), t.requires_grad)


def _rebuild_tensor(raw: np.ndarray, dtype: torch.dtype, shape: tuple, requires_grad: bool) -> torch.Tensor:
    """The CPU tensor ``_reduce_tensor`` took apart: a private, writable copy (the buffer may be read-only shared
    memory)."""
    if raw.size == 0:  # an empty numpy buffer has stride 0, which torch cannot view as a wider dtype
        t = torch.empty(shape, dtype=dtype)
    else:
        t = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True)).view(dtype).reshape(shape)
    return t.requires_grad_(requires_grad) if requires_grad else t


def enable_fast_tensor_serialization() -> None:
    """Serialise plain ``torch.Tensor``s (uploads, payloads, client states) as byte arrays in this process.

    Called by every raysim process that puts tensors into the object store (workers, and the driver through the
    pool and the state store); the rebuilt tensors are equal bit for bit, with the same dtype, shape and
    ``requires_grad``, on the CPU (a device tensor is refused: :class:`NotOnCPU`). Subclasses (``nn.Parameter``)
    keep their own reduction, whose plain data tensor comes back here. This is the table that
    ``ray.util.register_serializer`` fills; a reducer already there (Ray's own zero-copy one) is left alone.
    """
    import ray.cloudpickle

    ray.cloudpickle.CloudPickler.dispatch.setdefault(torch.Tensor, _reduce_tensor)


class ClientWorker:
    """The actor body (wrapped with ``ray.remote`` by the pool, which sets its CPU/GPU share).

    A worker that holds a GPU share trains on CUDA or not at all: where CUDA is unusable (no driver, one too old for
    this torch's CUDA build), every call raises one line naming the node and the cause (raised from calls, not from
    here: Ray reports an exception in an actor's constructor without its message)."""

    def __init__(self, cfg: ExperimentConfig):
        import torch._dynamo  # noqa: F401 - torch.optim imports it on first use (~1.6 s): paid before attach()
        # reports this worker ready, so no job of round 1 waits on it
        threads = max(1, int(math.floor(cfg.engine.cpus_per_worker)))
        torch.set_num_threads(threads)  # a worker's share of the cores, so workers don't fight over them
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        enable_fast_tensor_serialization()
        import_plugins(cfg.plugins)
        self.cfg = cfg
        self.device = torch.device("cpu")
        self._refusal: Optional[str] = None
        gpu_ids = ray.get_gpu_ids()
        if gpu_ids:
            cause = cuda_unusable()
            if cause is None:
                self.device = torch.device("cuda")
            else:
                self._refusal = refuse_gpu_share(cfg.engine.gpus_per_worker, gpu_ids, cause, node_name())
        configure(self.device, cfg.engine.deterministic, cfg.engine.gpus_per_worker)
        self.where = f"worker pid {os.getpid()} on {node_name()} ({self.device})"
        self.jobs: Optional[ClientJobs] = None  # the core, made once the data arrives (attach)
        self._payload_ref: Optional[ray.ObjectRef] = None
        self._payload: dict = {}

    def _guard(self, what: Any) -> Any:
        """Every call: refuse a GPU share this process cannot use; an out-of-memory error in ``what`` is one line."""
        if self._refusal is not None:
            raise UserError(self._refusal)
        return job_guard(what, self.where, self.cfg)

    def attach(self, data: Any) -> dict:
        """Receive the run's dataset (an object-store reference that Ray resolves for this call); returns info().

        Data comes after construction so that a worker's process can be started before the driver has built the
        data: the host creates the workers beside the driver, and their cold starts overlap instead of queueing.
        """
        with self._guard("attaching the data"):
            self.jobs = ClientJobs(self.cfg, data, self.device)
        return self.info()

    def info(self) -> dict:
        """pid, device, torch threads, Ray node id and, on a GPU, this process's peak CUDA memory."""
        with self._guard("reporting its state"):
            return {"pid": os.getpid(), "device": str(self.device), "threads": torch.get_num_threads(),
                    "node": ray.get_runtime_context().get_node_id(), **memory_info(self.device)}

    def _shared(self, ref: Any) -> dict:
        """The round's shared payload, fetched and deserialised once per worker and round (the core gives every
        job its own copy)."""
        if ref != self._payload_ref:
            self._payload = ray.get(ref)
            self._payload_ref = ref
        return self._payload

    # ------------------------------------------------------------------ jobs
    @ray.method(num_returns=2)
    def train(self, job: TrainJob, state: Optional[dict]) -> tuple[TrainResult, Optional[dict]]:
        """Local training of one client for one round; returns (its result with the upload, its new state)."""
        with self._guard(f"client {job.client_id}'s training in round {job.round}"):
            own = ray.get(job.own_payload_ref) if job.own_payload_ref is not None else None
            return self.jobs.train(job, self._shared(job.payload_ref), own, state)

    def train_many(self, jobs: list[TrainJob], *states: Optional[dict]) -> list:
        """Several clients in one Ray call (``engine.clients_per_call``), one after another exactly as ``train``
        runs them; returns [result, state] per client, flat, so that each becomes its own object in the store
        (the caller sets ``num_returns=2 * len(jobs)``). States arrive as separate arguments, so Ray resolves them."""
        out: list = []
        for job, state in zip(jobs, states):
            out.extend(self.train(job, state))
        return out

    def train_group(self, jobs: list[TrainJob], *states: Optional[dict], stacked: bool = False) -> list:
        """A fixed group of clients (``engine.sum_group``) in one call, their uploads summed here; returns
        [GroupResult (the sum and each client's result without its upload), new state per client], flat, so that
        each state becomes its own object in the store (the caller sets ``num_returns=1 + len(jobs)``).
        ``stacked`` (``engine.vectorize``): the group trains as one cohort."""
        return self.train_groups([jobs], *states, stacked=stacked)

    def train_groups(self, groups: list[list[TrainJob]], *states: Optional[dict], stacked: bool = False) -> list:
        """Several sum groups in one call (``engine.clients_per_call``: short clients; ``engine.vectorize``: one
        cohort's groups, trained together as one batched computation with ``stacked``), each summed on its own;
        returns [GroupResult per group, then every client's new state, in order] (the caller sets
        ``num_returns``)."""
        results, kept, at = [], [], 0
        parts = []
        for jobs in groups:
            parts.append(list(states[at:at + len(jobs)]))
            at += len(jobs)
        with self._guard(lambda: f"client {self.jobs.busy}'s training in round {groups[0][0].round}"):
            shared = self._shared(groups[0][0].payload_ref)
            owns = [self._owns(jobs) for jobs in groups]
            if stacked:
                summed = train_groups_stacked(self.jobs, groups, shared, owns, parts)
            else:
                summed = [self.jobs.train_group(jobs, shared, own, part)
                          for jobs, own, part in zip(groups, owns, parts)]
        for total, done in summed:
            results.append(GroupResult(upload_sum=total, results=[result for result, _ in done]))
            kept.extend(keep for _, keep in done)
        return results + kept

    def train_cohort(self, jobs: list[TrainJob], *states: Optional[dict]) -> list:
        """One cohort (``engine.vectorize``): its clients stacked and trained as one batched computation
        (``raysim.engine.cohort``); returns [result, state] per client, flat, as ``train_many`` does."""
        with self._guard(f"client {jobs[0].client_id}'s training in round {jobs[0].round} (a cohort of {len(jobs)})"):
            done = train_cohort(self.jobs, jobs, self._shared(jobs[0].payload_ref), self._owns(jobs), list(states))
        return [value for pair in done for value in pair]

    def choose_cohort_size(self, jobs: list[TrainJob], *states: Optional[dict]) -> tuple[int, dict]:
        """``engine.vectorize=auto``: the cohort size a probe on these clients chooses, and what it measured."""
        with self._guard(f"the engine.vectorize=auto probe in round {jobs[0].round}"):
            return choose_cohort_size(self.jobs, jobs, self._shared(jobs[0].payload_ref), self._owns(jobs),
                                      list(states))

    @staticmethod
    def _owns(jobs: list[TrainJob]) -> list[Optional[dict]]:
        """The jobs' own payloads (``client_payload``), fetched in one call; None where a client has none."""
        refs = [j.own_payload_ref for j in jobs]
        present = [r for r in refs if r is not None]
        fetched = iter(ray.get(present)) if present else iter(())
        return [next(fetched) if r is not None else None for r in refs]

    def evaluate(self, job: EvalJob, state_refs: list) -> list[ClientAccuracy]:
        """Test accuracy of the model each client would use after this round's aggregation."""
        with self._guard(f"the evaluation of clients {job.client_ids} after round {job.round}"):
            present = [r for r in state_refs if r is not None]
            fetched = iter(ray.get(present)) if present else iter(())
            states = [next(fetched) if ref is not None else None for ref in state_refs]
            own_refs = job.own_payload_refs or [None] * len(job.client_ids)
            present_own = [r for r in own_refs if r is not None]
            fetched_own = iter(ray.get(present_own)) if present_own else iter(())
            owns = [next(fetched_own) if ref is not None else None for ref in own_refs]
            return self.jobs.evaluate(job, self._shared(job.payload_ref), owns, states)

    def server_train(self, job: ServerTrainJob) -> dict:
        """The algorithm's server-side training for one round, on this worker's reserved CPU/GPU share."""
        with self._guard(f"the server-side training of round {job.round}"):
            state, updates = ray.get([job.state_ref, job.updates_ref])
            history = {cid: ray.get(list(refs)) for cid, refs in job.history_refs.items()}
            return self.jobs.server_train(job.round, state, updates, history)

    def central(self, train: Callable[[torch.device], Any]) -> Any:
        """Central training (FAPD's offline teacher, FedPCL's stand-in backbones) on this worker's reserved CPU/GPU
        share: ``train(device)``, its result on the CPU (``raysim.engine.central.run_reserved``)."""
        with self._guard("central training"):
            return run_here(train, self.device)
