"""The client-job core: the only place a virtual client is trained or evaluated, with no Ray in sight.

A job is a plain function of its inputs: the config, the federated data, the job record (client, round), the
round's payload and the client's kept state. :class:`ClientJobs` runs such jobs in whatever process holds it:

- the Ray executor's ``ClientWorker`` actors (``raysim.engine.worker``) resolve object references and call it;
- the in-process executor (``engine.backend=inline``) calls it directly, so a ``breakpoint()`` in a hook stops in
  the user's own terminal;
- feature export (``raysim report --tsne``) rebuilds each client's evaluation model with :meth:`eval_model`.

Training one client: build or reset the model, seed (seed, client, round), build the context, set up, run the
local phases, upload, keep. Every job gets its own copy of the payload, and what leaves a job (upload, kept state,
server state) is a detached CPU copy, so no job can change what another job, the driver or the object store sees.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

import numpy as np
import torch
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext, ServerContext
from raysim.engine.epochs import epoch_batches
from raysim.engine.jobs import ClientAccuracy, EvalJob, TrainJob, TrainResult
from raysim.engine.partial import UploadSum, sum_results
from raysim.models import build_model, model_key

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig
    from raysim.data.base import FederatedData


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


def copy_tree(tree: Any) -> Any:
    """Fresh tensors (and containers) with the same values: what a job may change without anyone else seeing it."""
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [copy_tree(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(copy_tree(v) for v in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):  # ClientUpdate, TrainResult
        return dataclasses.replace(tree, **{f.name: copy_tree(getattr(tree, f.name))
                                            for f in dataclasses.fields(tree) if f.init})
    return tree


def to_device(tree: Any, device: torch.device) -> Any:
    """The tree with its tensors on ``device`` (unchanged on the CPU: no copy)."""
    if device.type == "cpu" or tree is None:
        return tree
    if isinstance(tree, torch.Tensor):
        return tree.to(device, non_blocking=True)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    return tree


def detached_cpu(tree: Any, copy: bool = False) -> Any:
    """The tree with every tensor detached and on the CPU (``copy``: a private copy even where it already was)."""
    if isinstance(tree, torch.Tensor):
        out = tree.detach()
        if out.device.type != "cpu":
            return out.cpu()
        return out.clone() if copy else out
    if isinstance(tree, dict):
        return {k: detached_cpu(v, copy) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(detached_cpu(v, copy) for v in tree)
    return tree


def seed_torch(seed: int, device: torch.device) -> None:
    """Seed torch's global RNG for one job. ``torch.manual_seed`` also queues a seed for every accelerator,
    capturing a Python stack trace each time CUDA is not initialised (~1 ms a job); a CPU job, which uses no
    accelerator RNG, seeds the CPU generator only."""
    if device.type == "cpu" and not torch.cuda.is_initialized():
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def make_optimizer(cfg: ExperimentConfig, params: list, lr: Optional[float] = None) -> torch.optim.Optimizer:
    """``train.optimizer`` over ``params`` at ``lr`` (``train.lr`` when None)."""
    t = cfg.train
    lr = t.lr if lr is None else lr
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)


def make_context(cfg: ExperimentConfig, data: FederatedData, client_id: int, round: int, *,
                 payload: Optional[dict] = None, state: Optional[dict] = None, with_data: bool = True,
                 device: torch.device | str = "cpu", memo: Optional[dict] = None) -> ClientContext:
    """The :class:`ClientContext` of one (client, round) job: what every client-side hook receives. Unit tests of
    hooks build theirs with this too (``round=-1`` for evaluation)."""
    device = torch.device(device)
    train = tuple(t.to(device) for t in data.tensors(client_id, "train")) if with_data else None
    return ClientContext(client_id=client_id, round=round, total_rounds=cfg.rounds, epoch=0, num_epochs=0,
                         payload=payload if payload is not None else {}, state=to_device(state, device) or {},
                         meta=data.meta, num_classes=data.num_classes, device=device, train_data=train,
                         memo=memo if memo is not None else {})


def _augment(cfg: ExperimentConfig, data: FederatedData, client_id: int) -> Any:
    """data.augment: the batch augmentation for this client's domain (None when off)."""
    if not cfg.data.augment:
        return None
    from raysim.data.augment import BatchAugment

    domain = data.domains[data.split(client_id).domain]
    return BatchAugment(domain.mean, domain.std)


@dataclasses.dataclass
class StartedJob:
    """A training job set up and ready for its first step (:meth:`ClientJobs.start`)."""

    job: TrainJob
    model: nn.Module  # the process's model object for this architecture, holding this client's start
    ctx: ClientContext
    phases: list[tuple]  # local_phases: (parameters, epochs[, learning rate])
    gen: torch.Generator  # the client's shuffling, seeded from (seed, client, round)
    augment: Any  # data.augment's batch augmentation (None: off)
    aug_gen: Optional[torch.Generator]
    clock: float  # time.perf_counter() when the job started


class ClientJobs:
    """Runs one process's client jobs: model objects are built once per architecture and reset from their initial
    weights (a job costs a copy of the weights, not a model construction); the round's shared payload is moved to
    the device once; everything else is a function of the job's inputs."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, device: torch.device | str = "cpu",
                 algorithm: Optional[Algorithm] = None):
        from raysim.registry import get_algorithm

        self.cfg = cfg
        self.data = data
        self.device = torch.device(device)
        self.algorithm = algorithm if algorithm is not None else get_algorithm(cfg.algorithm.name)(cfg)
        self._models: dict[tuple, tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]]] = {}
        self._shared_source: Any = None  # the shared payload last given, and its copy on the device
        self._shared: dict = {}
        self._memo: dict = {}  # ClientContext.memo: values derived from the data alone, built once per process
        self.busy: Optional[int] = None  # the client of a group being trained (train_group)

    # ------------------------------------------------------------------ building blocks
    def model(self, client_id: int) -> nn.Module:
        """Client ``client_id``'s model at its initial weights (built on first use, then reset in place)."""
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

    def payload(self, shared: dict, own: Optional[dict] = None) -> dict:
        """A private copy of the round's shared payload, merged with the client's own (whose keys win): a client
        that changes its payload in place changes nothing for any other job. The shared payload is moved to the
        device once for as long as the same object is given (one round)."""
        if shared is not self._shared_source:
            self._shared = to_device(shared, self.device)
            self._shared_source = shared
        out = copy_tree(self._shared)
        if own is not None:
            out.update(copy_tree(to_device(own, self.device)) if self.device.type != "cpu" else copy_tree(own))
        return out

    def context(self, client_id: int, round: int, payload: dict, state: Optional[dict],
                with_data: bool) -> ClientContext:
        return make_context(self.cfg, self.data, client_id, round, payload=payload, state=state,
                            with_data=with_data, device=self.device, memo=self._memo)

    # ------------------------------------------------------------------ jobs
    def start(self, job: TrainJob, shared: dict, own: Optional[dict], state: Optional[dict]) -> StartedJob:
        """A training job up to its first step: the model reset to its initial weights, torch seeded from (seed,
        client, round), the context built, the client's state initialised (first round) and set up, its phases
        chosen. The one-client loop (:meth:`train`) and the cohort trainer (``raysim.engine.cohort``) share it."""
        clock = time.perf_counter()
        alg, cid, rnd = self.algorithm, job.client_id, job.round
        seed = job_seed(self.cfg.seed, cid, rnd)
        model = self.model(cid)  # first: building a model reseeds torch's global RNG (deterministic weights)
        seed_torch(seed, self.device)  # so that a hook drawing from the global RNG gets the same numbers anywhere
        gen = torch.Generator().manual_seed(seed)
        ctx = self.context(cid, rnd, self.payload(shared, own), state, with_data=True)
        if state is None:
            ctx.state = alg.init_client_state(model, ctx) or {}
        alg.client_setup(model, ctx)
        phases = alg.local_phases(model, ctx)
        ctx.num_epochs = sum(phase[1] for phase in phases)
        augment = _augment(self.cfg, self.data, cid)
        aug_gen = torch.Generator().manual_seed(job_seed(self.cfg.seed, cid, rnd, AUGMENT_STREAM)) if augment else None
        return StartedJob(job, model, ctx, phases, gen, augment, aug_gen, clock)

    def finish(self, started: StartedJob, loss_sum: torch.Tensor, part_sums: dict[str, torch.Tensor], seen: int,
               finite: bool, seconds: Optional[float] = None) -> tuple[TrainResult, Optional[dict]]:
        """A trained client's result and new state: what ``client_upload`` and ``client_keep`` make of the model
        (detached CPU copies), its mean loss and loss parts over the samples it saw."""
        alg, model, ctx = self.algorithm, started.model, started.ctx
        for p in model.parameters():
            p.requires_grad_(True)
        ctx.sample_idx = None
        upload = detached_cpu(alg.client_upload(model, ctx))
        keep = detached_cpu(alg.client_keep(model, ctx))
        finite = finite and all_finite(upload) and all_finite(keep)
        result = TrainResult(client_id=started.job.client_id, round=started.job.round, upload=upload,
                             num_samples=len(ctx.train_data[1]), finite=finite,
                             loss=float(loss_sum) / max(seen, 1),
                             parts={k: float(v) / max(seen, 1) for k, v in part_sums.items()},
                             seconds=time.perf_counter() - started.clock if seconds is None else seconds,
                             has_state=bool(keep), upload_bytes=nbytes(upload))
        return result, (keep or None)

    def train(self, job: TrainJob, shared: dict, own: Optional[dict],
              state: Optional[dict]) -> tuple[TrainResult, Optional[dict]]:
        """Local training of one client for one round; returns (its result with the upload, its new state)."""
        started = self.start(job, shared, own, state)
        alg, model, ctx, gen = self.algorithm, started.model, started.ctx, started.gen
        augment, aug_gen = started.augment, started.aug_gen
        x, y, idx = ctx.train_data
        n, bs = len(y), self.cfg.train.batch_size
        model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        part_sums: dict[str, torch.Tensor] = {}
        seen = 0
        finite = True
        all_params = list(model.parameters())
        for params, epochs, *lr in started.phases:  # (parameters, epochs[, learning rate: train.lr when absent])
            active = {id(p) for p in params}
            for p in all_params:
                p.requires_grad_(id(p) in active)
            opt = make_optimizer(self.cfg, params, lr[0] if lr else None)
            for _ in range(epochs):
                for bi in epoch_batches(n, bs, gen, self.device):
                    ctx.sample_idx = idx[bi]
                    xb = x[bi] if augment is None else augment(x[bi], aug_gen)
                    loss, parts = alg.client_loss(model, xb, y[bi], ctx)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if alg.clip_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(params, alg.clip_grad_norm)
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
        return self.finish(started, loss_sum, part_sums, seen, finite)

    def train_group(self, jobs: list[TrainJob], shared: dict, owns: list[Optional[dict]],
                    states: list[Optional[dict]]) -> tuple[UploadSum, list[tuple[TrainResult, Optional[dict]]]]:
        """A fixed group of clients (``engine.sum_group``), trained one after another, their finite uploads
        summed here in id order (``raysim.engine.partial.sum_results``); returns (the group's sum, [(result without
        its upload, new state)] in job order)."""
        done = []
        for job, own, state in zip(jobs, owns, states):
            self.busy = job.client_id  # for an error's message: which client of the group failed
            done.append(self.train(job, shared, own, state))
        return sum_results([result for result, _ in done]), done

    def eval_model(self, client_id: int, round: int, shared: dict, own: Optional[dict],
                   state: Optional[dict]) -> tuple[nn.Module, ClientContext]:
        """The model client ``client_id`` predicts with after ``round``'s aggregation, in eval mode, and its
        context: built, seeded (evaluation that trains, such as fine-tuning, is seeded), set up."""
        model = self.model(client_id)
        ctx = self.context(client_id, -1, self.payload(shared, own), state, self.algorithm.eval_needs_train_data)
        seed_torch(job_seed(self.cfg.seed, client_id, round, EVAL_STREAM), self.device)
        if state is None:  # a client that has not trained yet holds what it would start its first round with
            ctx.state = self.algorithm.init_client_state(model, ctx) or {}
        self.algorithm.eval_setup(model, ctx)
        model.eval()
        return model, ctx

    @torch.no_grad()
    def predict(self, model: nn.Module, ctx: ClientContext, x: torch.Tensor) -> torch.Tensor:
        """Predicted classes of ``x``, in chunks of ``eval.chunk`` rows, on the CPU."""
        chunk = self.cfg.eval.chunk
        return torch.cat([self.algorithm.predict(model, x[b:b + chunk].to(self.device), ctx).argmax(dim=1).cpu()
                          for b in range(0, len(x), chunk)]) if len(x) else torch.zeros(0, dtype=torch.int64)

    def evaluate(self, job: EvalJob, shared: dict, owns: list[Optional[dict]],
                 states: list[Optional[dict]]) -> list[ClientAccuracy]:
        """Test accuracy of the model each client of ``job`` would use after this round's aggregation."""
        out = []
        for cid, own, state in zip(job.client_ids, owns, states):
            with torch.no_grad():
                model, ctx = self.eval_model(cid, job.round, shared, own, state)
            x, y, _ = self.data.tensors(cid, "test")
            correct = int((self.predict(model, ctx, x) == y).sum())
            out.append(ClientAccuracy(cid, correct, len(y)))
        return out

    def server_train(self, round: int, server_state: dict, updates: list, history: dict) -> dict:
        """The algorithm's server-side training for one round, seeded from (seed, round); returns the new server
        state on the CPU."""
        seed = job_seed(self.cfg.seed, 0, round, SERVER_STREAM)
        seed_torch(seed, self.device)
        ctx = ServerContext(round=round, total_rounds=self.cfg.rounds, seed=seed, device=self.device,
                            num_classes=self.data.num_classes, meta=self.data.meta, history=history)
        state = to_device(copy_tree(server_state), self.device)
        return detached_cpu(self.algorithm.server_train(state, updates, ctx))


def threads_for(cpus: float) -> int:
    """torch threads for a job that holds ``cpus`` CPUs (``engine.cpus_per_worker``)."""
    return max(1, int(math.floor(cpus)))

