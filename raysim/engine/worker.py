"""ClientWorker: a Ray actor that can run any virtual client.

A worker holds no client's state between jobs: each job brings the client's state (an object-store reference) and
the round's payload, and returns the upload and the new state. Model objects are built once per architecture and
reset from their initial weights, so a job costs a ``load_state_dict``, not a model construction.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

import numpy as np
import ray
import torch

from raysim.algorithms.base import ClientContext, ServerContext
from raysim.engine.epochs import batch_bounds, epoch_batches  # noqa: F401 - batch_bounds: re-exported
from raysim.engine.jobs import ClientAccuracy, EvalJob, ServerTrainJob, TrainJob, TrainResult
from raysim.models import build_model, model_key
from raysim.registry import get_algorithm, import_plugins

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


EVAL_STREAM, SERVER_STREAM, AUGMENT_STREAM = 1, 2, 3  # tags that give evaluation, server-side training and
# augmentation (data.augment) streams of their own


def job_seed(seed: int, client_id: int, round: int, *stream: int) -> int:
    """Every (client, round) job draws its randomness from this seed alone, whichever worker runs it; a ``stream``
    tag separates the draws of evaluation and server-side training from those of training."""
    return int(np.random.SeedSequence([seed, client_id, round, *stream]).generate_state(1)[0])


def nbytes(tree: Any) -> int:
    """Bytes of every tensor in a nested dict/list: what crosses the network for that object."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(nbytes(v) for v in tree)
    return 0


def _float_tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        if tree.is_floating_point():
            yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _float_tensors(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _float_tensors(v)


def all_finite(tree: Any) -> bool:
    """True when no floating tensor in the tree holds NaN/Inf; one host sync for the whole tree, not one per tensor."""
    flags = [t.isfinite().all() for t in _float_tensors(tree)]
    if not flags:
        return True
    if len({f.device for f in flags}) == 1:
        return bool(torch.stack(flags).all())
    return all(bool(f) for f in flags)


def _reduce_tensor(t: torch.Tensor) -> tuple:
    """Ray's default pickling of a tensor runs a whole ``torch.save`` per storage (~2 ms for a small state dict,
    ~1.5 ms more to load it); a byte view as a numpy array goes through pickle 5's out-of-band buffers instead."""
    cpu = t.detach().cpu().contiguous()
    raw = cpu.reshape(-1).view(torch.uint8).numpy() if cpu.numel() else np.empty(0, dtype=np.uint8)
    return _rebuild_tensor, (raw, cpu.dtype, tuple(cpu.shape), t.requires_grad, str(t.device))


def _rebuild_tensor(raw: np.ndarray, dtype: torch.dtype, shape: tuple, requires_grad: bool,
                    device: str) -> torch.Tensor:
    """The tensor ``_reduce_tensor`` took apart: a private, writable copy (the buffer may be read-only shared
    memory)."""
    if raw.size == 0:  # an empty numpy buffer has stride 0, which torch cannot view as a wider dtype
        t = torch.empty(shape, dtype=dtype)
    else:
        t = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True)).view(dtype).reshape(shape)
    if device != "cpu":
        t = t.to(device)
    return t.requires_grad_(requires_grad) if requires_grad else t


def enable_fast_tensor_serialization() -> None:
    """Serialise plain ``torch.Tensor``s (uploads, payloads, client states) as byte arrays in this process.

    Called by every raysim process that puts tensors into the object store (workers, and the driver through the
    pool and the state store); the rebuilt tensors are equal bit for bit, with the same dtype, shape, device and
    ``requires_grad``. Subclasses (``nn.Parameter``) keep the default path. This is the table that
    ``ray.util.register_serializer`` fills; a reducer already there (Ray's own zero-copy one) is left alone.
    """
    import ray.cloudpickle

    ray.cloudpickle.CloudPickler.dispatch.setdefault(torch.Tensor, _reduce_tensor)


class ClientWorker:
    """The actor body (wrapped with ``ray.remote`` by the pool, which sets its CPU/GPU share)."""

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
        self.data: Any = None  # the federated dataset, given by the driver through attach()
        self.algorithm = get_algorithm(cfg.algorithm.name)(cfg)
        gpu = bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        self.device = torch.device("cuda" if gpu else "cpu")
        self._models: dict[tuple, tuple[torch.nn.Module, list[torch.Tensor], list[torch.Tensor]]] = {}
        self._payload_ref: Optional[ray.ObjectRef] = None
        self._payload: dict = {}

    def attach(self, data: Any) -> dict:
        """Receive the run's dataset (an object-store reference that Ray resolves for this call); returns info().

        Data comes after construction so that a worker's process can be started before the driver has built the
        data: the host creates the workers beside the driver, and their cold starts overlap instead of queueing.
        """
        self.data = data
        return self.info()

    def info(self) -> dict:
        return {"pid": os.getpid(), "device": str(self.device), "threads": torch.get_num_threads(),
                "node": ray.get_runtime_context().get_node_id()}

    # ------------------------------------------------------------------ helpers
    def _model(self, client_id: int) -> torch.nn.Module:
        key = model_key(self.cfg, self.data, client_id)
        if key not in self._models:
            model = build_model(self.cfg, key[0], self.data.input_shape(client_id), self.data.num_classes,
                                client_id, self.algorithm).to(self.device)
            live = list(model.state_dict(keep_vars=True).values())  # the module's own parameters and buffers
            self._models[key] = (model, live, [t.detach().clone() for t in live])
        model, live, initial = self._models[key]
        # the values load_state_dict(initial) would give, without its per-module Python walk (~1 ms a job)
        with torch.no_grad():
            for dst, src in zip(live, initial):
                dst.copy_(src)
        return model

    def _seed(self, seed: int) -> None:
        """``torch.manual_seed`` also queues a seed for every accelerator, capturing a Python stack trace each time
        CUDA is not initialised (~1 ms a job); a CPU worker, which uses no accelerator RNG, seeds the CPU one only."""
        if self.device.type == "cpu" and not torch.cuda.is_initialized():
            torch.default_generator.manual_seed(seed)
        else:
            torch.manual_seed(seed)

    def _payload_for(self, ref: Any, own_ref: Any = None) -> dict:
        """A private copy of the round's payload (merged with the client's own, if any) for one job.

        The shared payload is fetched and deserialised once per worker and round; each job gets its own copy of
        the tensors, so a client that changes its payload in place cannot change what the next job here sees.
        """
        if ref != self._payload_ref:
            self._payload = _to_device(ray.get(ref), self.device)
            self._payload_ref = ref
        payload = _copy_tree(self._payload)
        if own_ref is not None:
            payload.update(_to_device(ray.get(own_ref), self.device))
        return payload

    def _augment(self, client_id: int) -> Any:
        """data.augment: the batch augmentation for this client's domain (None when off)."""
        if not self.cfg.data.augment:
            return None
        from raysim.data.augment import BatchAugment

        domain = self.data.domains[self.data.split(client_id).domain]
        return BatchAugment(domain.mean, domain.std)

    def _optimizer(self, params: list, lr: Optional[float] = None) -> torch.optim.Optimizer:
        t = self.cfg.train
        lr = t.lr if lr is None else lr
        if t.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr, weight_decay=t.weight_decay)
        return torch.optim.SGD(params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)

    # ------------------------------------------------------------------ jobs
    def _context(self, cid: int, rnd: int, payload: dict, state: Optional[dict], with_data: bool) -> ClientContext:
        train = tuple(t.to(self.device) for t in self.data.tensors(cid, "train")) if with_data else None
        return ClientContext(client_id=cid, round=rnd, total_rounds=self.cfg.rounds, epoch=0, num_epochs=0,
                             payload=payload, state=_to_device(state, self.device) or {}, meta=self.data.meta,
                             num_classes=self.data.num_classes, device=self.device, train_data=train)

    @ray.method(num_returns=2)
    def train(self, job: TrainJob, state: Optional[dict]) -> tuple[TrainResult, Optional[dict]]:
        """Local training of one client for one round; returns (its result with the upload, its new state)."""
        start = time.perf_counter()
        cid, rnd = job.client_id, job.round
        seed = job_seed(self.cfg.seed, cid, rnd)
        model = self._model(cid)  # first: building a model reseeds torch's global RNG (deterministic weights)
        self._seed(seed)  # so that a hook drawing from the global RNG gets the same numbers on any worker
        gen = torch.Generator().manual_seed(seed)
        ctx = self._context(cid, rnd, self._payload_for(job.payload_ref, job.own_payload_ref), state, True)
        if state is None:
            ctx.state = self.algorithm.init_client_state(model, ctx) or {}
        self.algorithm.client_setup(model, ctx.state, ctx.payload, ctx)
        phases = self.algorithm.local_phases(model, ctx)
        ctx.num_epochs = sum(phase[1] for phase in phases)
        x, y, idx = ctx.train_data
        n, bs = len(y), self.cfg.train.batch_size
        augment = self._augment(cid)
        aug_gen = torch.Generator().manual_seed(job_seed(self.cfg.seed, cid, rnd, AUGMENT_STREAM)) if augment else None
        model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        part_sums: dict[str, torch.Tensor] = {}
        seen = 0
        finite = True
        all_params = list(model.parameters())
        for params, epochs, *lr in phases:  # (parameters, epochs[, learning rate: train.lr when absent])
            active = {id(p) for p in params}
            for p in all_params:
                p.requires_grad_(id(p) in active)
            opt = self._optimizer(params, lr[0] if lr else None)
            for _ in range(epochs):
                for bi in epoch_batches(n, bs, gen, self.device):
                    ctx.sample_idx = idx[bi]
                    xb = x[bi] if augment is None else augment(x[bi], aug_gen)
                    loss, parts = self.algorithm.client_loss(model, xb, y[bi], ctx)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if self.algorithm.clip_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(params, self.algorithm.clip_grad_norm)
                    opt.step()
                    loss_sum += loss.detach().double() * len(bi)
                    for k, v in parts.items():
                        part_sums[k] = part_sums.get(k, 0.0) + v.detach().double() * len(bi)
                    seen += len(bi)
                ctx.epoch += 1
                if not bool(torch.isfinite(loss_sum)):
                    finite = False
                    break
            if not finite:
                break
        for p in all_params:
            p.requires_grad_(True)
        ctx.sample_idx = None
        upload = self.algorithm.client_upload(model, ctx)
        keep = self.algorithm.client_keep(model, ctx)
        finite = finite and all_finite(upload) and all_finite(keep)
        result = TrainResult(client_id=cid, round=rnd, upload=upload, num_samples=n, finite=finite,
                             loss=float(loss_sum) / max(seen, 1),
                             parts={k: float(v) / max(seen, 1) for k, v in part_sums.items()},
                             seconds=time.perf_counter() - start, has_state=bool(keep))
        return result, (keep or None)

    def train_many(self, jobs: list[TrainJob], *states: Optional[dict]) -> list:
        """Several clients in one Ray call (``engine.clients_per_call``), one after another exactly as ``train``
        runs them; returns [result, state] per client, flat, so that each becomes its own object in the store
        (the caller sets ``num_returns=2 * len(jobs)``). States arrive as separate arguments, so Ray resolves them."""
        out: list = []
        for job, state in zip(jobs, states):
            out.extend(self.train(job, state))
        return out

    @torch.no_grad()
    def evaluate(self, job: EvalJob, state_refs: list) -> list[ClientAccuracy]:
        """Test accuracy of the model each client would use after this round's aggregation."""
        present = [r for r in state_refs if r is not None]
        fetched = iter(ray.get(present)) if present else iter(())
        own_refs = job.own_payload_refs or [None] * len(job.client_ids)
        out = []
        for cid, ref, own_ref in zip(job.client_ids, state_refs, own_refs):
            state = next(fetched) if ref is not None else None
            model = self._model(cid)
            ctx = self._context(cid, -1, self._payload_for(job.payload_ref, own_ref), state,
                                self.algorithm.eval_needs_train_data)
            # evaluation that trains (fine-tuning) is seeded
            self._seed(job_seed(self.cfg.seed, cid, job.round, EVAL_STREAM))
            if state is None:  # a client that has not trained yet holds what it would start its first round with
                ctx.state = self.algorithm.init_client_state(model, ctx) or {}
            self.algorithm.eval_setup(model, ctx.state, ctx.payload, ctx)
            model.eval()
            x, y, _ = self.data.tensors(cid, "test")
            correct = 0
            for b in range(0, len(y), 1024):
                pred = self.algorithm.predict(model, x[b:b + 1024].to(self.device), ctx).argmax(dim=1)
                correct += int((pred.cpu() == y[b:b + 1024]).sum())
            out.append(ClientAccuracy(cid, correct, len(y)))
        return out

    def server_train(self, job: ServerTrainJob) -> dict:
        """The algorithm's server-side training for one round, on this worker's reserved CPU/GPU share."""
        seed = job_seed(self.cfg.seed, 0, job.round, SERVER_STREAM)
        self._seed(seed)
        state, updates = ray.get([job.state_ref, job.updates_ref])
        history = {cid: ray.get(list(refs)) for cid, refs in job.history_refs.items()}
        ctx = ServerContext(round=job.round, total_rounds=self.cfg.rounds, seed=seed, device=self.device,
                            num_classes=self.data.num_classes, meta=self.data.meta, history=history)
        new_state = self.algorithm.server_train(_to_device(_copy_tree(state), self.device), updates, ctx)
        return _to_device_cpu(new_state)


def _copy_tree(tree: Any) -> Any:
    """Fresh tensors (and containers) with the same values: what a job may change without anyone else seeing it."""
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: _copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy_tree(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_copy_tree(v) for v in tree)
    return tree


def _to_device_cpu(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _to_device_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_device_cpu(v) for v in tree)
    return tree


def _to_device(tree: Any, device: torch.device) -> Any:
    if device.type == "cpu" or tree is None:
        return tree
    if isinstance(tree, torch.Tensor):
        return tree.to(device, non_blocking=True)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_device(v, device) for v in tree)
    return tree
