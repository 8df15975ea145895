"""ClientWorker: a Ray actor around the client-job core (``raysim.engine.core.ClientJobs``).

A worker holds no client's state between calls: each call (``raysim.engine.jobs``) brings its clients' states
(object-store references that Ray resolves) and the round's payload, and returns its result and the new states. The
actor has one verb, :meth:`ClientWorker.run`, as Flower's backend has ``process_message``: it fetches the round's
shared payload once and hands the call to the core, which does the work exactly as the in-process executor does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import ray
import torch

from raysim.algorithms.training import threads_for
from raysim.engine.core import ClientJobs
from raysim.engine.device import configure, cuda_unusable, job_guard, memory_info, node_name, refuse_gpu_share
from raysim.engine.jobs import Call
from raysim.errors import NotOnCPU, UserError
from raysim.interrupts import quiet_exit_on_sigterm
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
        quiet_exit_on_sigterm()  # Ray ending this process is no error to print (raysim.interrupts)
        # a worker's share of the cores, so workers don't fight over them
        torch.set_num_threads(threads_for(cfg.engine.cpus_per_worker))
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

    def _serve(self, cfg: Optional[ExperimentConfig]) -> None:
        """Serve the run of ``cfg`` (None: the one it serves): a worker kept from another run
        (``raysim.engine.pool.warm_workers``) drops everything made from that run's config and data and makes it
        again from ``cfg``, as a fresh worker would; only the process stays."""
        if cfg is not None:
            self.__init__(cfg)  # type: ignore[misc]

    def _guard(self, what: Any) -> Any:
        """Every call: refuse a GPU share this process cannot use; an out-of-memory error in ``what`` is one line."""
        if self._refusal is not None:
            raise UserError(self._refusal)
        return job_guard(what, self.where, self.cfg)

    def attach(self, data: Any, cfg: Optional[ExperimentConfig] = None) -> dict:
        """Receive the run's dataset (an object-store reference that Ray resolves for this call), for the run of
        ``cfg`` (the pool's first call to a worker names it); returns info().

        Data comes after construction so that a worker's process can be started before the driver has built the
        data: the host creates the workers beside the driver, and their cold starts overlap instead of queueing.
        """
        self._serve(cfg)
        with self._guard("attaching the data"):
            self.jobs = ClientJobs(self.cfg, data, self.device)
        return self.info()

    def info(self, cfg: Optional[ExperimentConfig] = None) -> dict:
        """pid, device, torch threads, Ray node id and, on a GPU, this process's peak CUDA memory (``cfg``: first
        serve that run, as in :meth:`attach`)."""
        self._serve(cfg)
        with self._guard("reporting its state"):
            return {"pid": os.getpid(), "device": str(self.device), "threads": torch.get_num_threads(),
                    "node": ray.get_runtime_context().get_node_id(), **memory_info(self.device)}

    def shared(self, ref: Any) -> dict:
        """The round's shared payload, fetched and deserialised once per worker and round (the core gives every
        job its own copy)."""
        if ref != self._payload_ref:
            self._payload = ray.get(ref)
            self._payload_ref = ref
        return self._payload

    @staticmethod
    def fetch(refs: list) -> list:
        """The values of object references carried inside a call's records, fetched in one ``ray.get`` (None
        stays None)."""
        present = [r for r in refs if r is not None]
        fetched = iter(ray.get(present)) if present else iter(())
        return [next(fetched) if r is not None else None for r in refs]

    def run(self, call: Call, *values: Any) -> Any:
        """Run one call (its arguments resolved by Ray); returns its ``returns`` objects (the pool sets
        ``num_returns`` to that number), one object as itself."""
        with self._guard(lambda: call.describe(self)):
            out = call.run(self, list(values))
        return out if call.returns > 1 else out[0]
