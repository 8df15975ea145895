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

import time
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from raysim.algorithms.aggregation import UploadSum
from raysim.algorithms.base import Algorithm, ClientContext, ServerContext
from raysim.algorithms.training import LocalOptimizer, Trainee, epoch_batches, make_optimizer, run_phases
from raysim.engine import vectorize_probe
from raysim.engine.stack import train_stack
from raysim.engine.jobs import CallResult, ClientAccuracy, EvalJob, StartedJob, TrainCall, TrainJob, TrainResult
from raysim.models import build_model, model_key
from raysim.seeds import AUGMENT_STREAM, EVAL_STREAM, SERVER_STREAM, job_seed  # noqa: F401 - job_seed: public here too
from raysim.stages import STAGE_STATE_KEY, build_stages, split_state
from raysim.trees import all_finite, copy_tree, detached_cpu, nbytes, to_device

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig
    from raysim.data.base import FederatedData


def seed_torch(seed: int, device: torch.device) -> None:
    """Seed torch's global RNG for one job. ``torch.manual_seed`` also queues a seed for every accelerator,
    capturing a Python stack trace each time CUDA is not initialised (~1 ms a job); a CPU job, which uses no
    accelerator RNG, seeds the CPU generator only."""
    if device.type == "cpu" and not torch.cuda.is_initialized():
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


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
        # the base client_upload returns split_state's fresh clones, which nothing else holds (TrainResult.private)
        self._fresh_uploads = type(self.algorithm).client_upload is Algorithm.client_upload
        self._models: dict[tuple, tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]]] = {}
        self._shared_source: Any = None  # the shared payload last given, and its copy on the device
        self._shared: dict = {}
        self._memo: dict = {}  # ClientContext.memo: values derived from the data alone, built once per process
        self.busy: Optional[int] = None  # the client of a call being trained (run_call), for error messages
        self.stages = build_stages(cfg)  # their client parts take part in each job (raysim.stages)

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
        chosen. The one-client loop (:meth:`train`) and the stack trainer (``raysim.engine.stack``) share it."""
        clock = time.perf_counter()
        alg, cid, rnd = self.algorithm, job.client_id, job.round
        seed = job_seed(self.cfg.seed, cid, rnd, *job.stream)
        model = self.model(cid)  # first: building a model reseeds torch's global RNG (deterministic weights)
        seed_torch(seed, self.device)  # so that a hook drawing from the global RNG gets the same numbers anywhere
        gen = torch.Generator().manual_seed(seed)
        state, kept_by_stages = split_state(state)
        ctx = self.context(cid, rnd, self.payload(shared, own), state, with_data=True)
        parts = self.stages.client_parts(job)
        for name, part in parts:
            part.restore(kept_by_stages.get(name))
            part.setup(ctx)
        if state is None:
            ctx.state = alg.init_client_state(model, ctx) or {}
        alg.client_setup(model, ctx)
        phases = alg.local_phases(model, ctx)
        ctx.num_epochs = sum(phase[1] for phase in phases)
        augment = _augment(self.cfg, self.data, cid)
        aug_gen = (torch.Generator().manual_seed(job_seed(self.cfg.seed, cid, rnd, AUGMENT_STREAM, *job.stream))
                   if augment else None)
        return StartedJob(job, model, ctx, phases, gen, augment, aug_gen, clock, parts)

    def finish(self, started: StartedJob, loss_sum: torch.Tensor, part_sums: dict[str, torch.Tensor], seen: int,
               finite: bool, seconds: Optional[float] = None) -> tuple[TrainResult, Optional[dict]]:
        """A trained client's result and new state: what ``client_upload`` and ``client_keep`` make of the model
        (detached CPU copies), its mean loss and loss parts over the samples it saw."""
        alg, model, ctx = self.algorithm, started.model, started.ctx
        for p in model.parameters():
            p.requires_grad_(True)
        ctx.sample_idx = None
        made = detached_cpu(alg.client_upload(model, ctx))
        upload = made
        for _, part in started.parts:  # the stages' transforms, here where the client trained (DP clipping)
            upload = part.upload(upload, self._shared)
        keep = detached_cpu(alg.client_keep(model, ctx))
        stage_keep = {name: k for name, part in started.parts if (k := part.keep()) is not None}
        if stage_keep:  # each stage's own per-client state, beside the algorithm's in the client state store
            keep = {**(keep or {}), STAGE_STATE_KEY: detached_cpu(stage_keep)}
        finite = finite and all_finite(upload) and all_finite(keep)
        reports = {name: r for name, part in started.parts if (r := part.report(int(seen))) is not None}
        upload_bytes = nbytes(upload)
        for _, part in started.parts:  # what the upload takes on the wire (a compressed encoding)
            upload_bytes = part.upload_bytes(upload_bytes)
        result = TrainResult(client_id=started.job.client_id, round=started.job.round, upload=upload,
                             num_samples=len(ctx.train_data[1]), finite=finite,
                             loss=float(loss_sum) / max(seen, 1),
                             parts={k: float(v) / max(seen, 1) for k, v in part_sums.items()},
                             seconds=time.perf_counter() - started.clock if seconds is None else seconds,
                             has_state=bool(keep), upload_bytes=int(upload_bytes), stage=reports,
                             private=self._fresh_uploads and upload is made)
        return result, (keep or None)

    def train(self, job: TrainJob, shared: dict, own: Optional[dict],
              state: Optional[dict]) -> tuple[TrainResult, Optional[dict]]:
        """Local training of one client for one round; returns (its result with the upload, its new state)."""
        started = self.start(job, shared, own, state)
        trainee = _OneClient(self, started)
        started.model.train()
        run_phases(started.phases, trainee)
        return self.finish(started, trainee.loss_sum, trainee.part_sums, trainee.seen, trainee.finite)

    def run_call(self, call: TrainCall, shared: dict, owns: list[Optional[dict]],
                 states: list[Optional[dict]]) -> tuple[CallResult, list[Optional[dict]]]:
        """One training call (``raysim.engine.plan``): its clients one after another or, ``stacked``, as one
        stack; then each of its sum groups' finite uploads summed here, in id order. Returns (the
        call's result, each client's new state), in call order."""
        if call.stacked:
            done = []
            step = call.stack or len(call.jobs)  # a sum group larger than a stack: stack by stack, in order
            for at in range(0, len(call.jobs), step):
                self.busy = call.jobs[at].client_id  # for an error's message: the stack's first client
                done += train_stack(self, call.jobs[at:at + step], shared, owns[at:at + step],
                                     states[at:at + step])
        else:
            done = []
            for job, own, state in zip(call.jobs, owns, states):
                self.busy = job.client_id  # for an error's message: which client of the call failed
                done.append(self.train(job, shared, own, state))
        results = [result for result, _ in done]
        sums, at = [], 0
        for size in call.groups:
            sums.append(UploadSum().add_results(results[at:at + size], call.weighting))
            at += size
        return CallResult(results=results, sums=sums), [keep for _, keep in done]

    def probe_stack_size(self, jobs: list[TrainJob], shared: dict, owns: list[Optional[dict]],
                          states: list[Optional[dict]]) -> tuple[int, dict]:
        """``engine.vectorize=auto``: the stack size a probe on these clients chooses (nothing it trains is kept),
        and what it measured (``raysim.engine.vectorize_probe``)."""
        return vectorize_probe.choose_stack_size(self, jobs, shared, owns, states)

    def eval_model(self, client_id: int, round: int, shared: dict, own: Optional[dict],
                   state: Optional[dict]) -> tuple[nn.Module, ClientContext]:
        """The model client ``client_id`` predicts with after ``round``'s aggregation, in eval mode, and its
        context: built, seeded (evaluation that trains, such as fine-tuning, is seeded), set up."""
        model = self.model(client_id)
        state, _ = split_state(state)
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
            if job.rows is not None:
                x, y = x[job.rows[0]:job.rows[1]], y[job.rows[0]:job.rows[1]]
            correct = int((self.predict(model, ctx, x) == y).sum())
            out.append(ClientAccuracy(cid, correct, len(y)))
        return out

    def evaluate_stage(self, evaluation: Any, shared: dict, round: int) -> Optional[float]:
        """A stage's evaluation (``raysim.stages.StageEvaluation``) of the model a client without state predicts
        with after ``round`` (the global model), on inputs built once per process from the data."""
        x = self._memo.get(("stage-evaluation", evaluation.key))
        if x is None:
            x = self._memo[("stage-evaluation", evaluation.key)] = evaluation.inputs(self.data)
        if not len(x):
            return None
        with torch.no_grad():
            model, ctx = self.eval_model(0, round, shared, None, None)
        return evaluation.score(self.predict(model, ctx, x))

    def server_train(self, round: int, server_state: dict, updates: list, history: dict) -> dict:
        """The algorithm's server-side training for one round, seeded from (seed, round); returns the new server
        state on the CPU."""
        seed = job_seed(self.cfg.seed, 0, round, SERVER_STREAM)
        seed_torch(seed, self.device)
        ctx = ServerContext(round=round, total_rounds=self.cfg.rounds, seed=seed, device=self.device,
                            num_classes=self.data.num_classes, meta=self.data.meta, history=history)
        state = to_device(copy_tree(server_state), self.device)
        return detached_cpu(self.algorithm.server_train(state, updates, ctx))


class _OneClient(Trainee):
    """One client's local epochs (:func:`raysim.algorithms.training.run_phases`): its own mini-batches, the
    algorithm's ``client_loss``, clipping where the algorithm asks for it; loss and parts summed in float64 over
    the samples seen, and the training stopped after an epoch whose loss is no longer finite. A stage's client part
    may give the epoch's batches, a step's loss (DP-SGD) or end the job before a step (a step budget)."""

    def __init__(self, core: ClientJobs, started: StartedJob):
        self.cfg, self.alg, self.device = core.cfg, core.algorithm, core.device
        self.started, self.ctx = started, started.ctx
        self.model = started.model
        self.x, self.y, self.idx = started.ctx.train_data
        self.all_params = list(started.model.parameters())
        self.params: list = []
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=core.device)
        self.part_sums: dict[str, torch.Tensor] = {}
        self.seen = 0
        self.finite = True
        self.parts = [part for _, part in started.parts]

    def begin_phase(self, params: list, lr: Optional[float]) -> LocalOptimizer:
        active = {id(p) for p in params}
        for p in self.all_params:
            p.requires_grad_(id(p) in active)
        self.params = params
        return make_optimizer(self.cfg, params, lr)

    def steps(self) -> Any:
        for part in self.parts:
            batches = part.batches(len(self.y), self.cfg.train.batch_size, self.started.gen, self.device)
            if batches is not None:
                return batches
        return epoch_batches(len(self.y), self.cfg.train.batch_size, self.started.gen, self.device)

    def record(self, loss_sum: torch.Tensor, part_sums: dict[str, torch.Tensor], count: int) -> None:
        """A step's losses and loss parts, summed over its ``count`` samples (float64)."""
        self.loss_sum += loss_sum
        for k, v in part_sums.items():
            self.part_sums[k] = self.part_sums.get(k, 0.0) + v
        self.seen += count

    def loss(self, bi: torch.Tensor) -> torch.Tensor:
        s, ctx = self.started, self.ctx
        ctx.sample_idx = self.idx[bi]
        xb = self.x[bi] if s.augment is None else s.augment(self.x[bi], s.aug_gen)
        for part in self.parts:
            own = part.loss(self, xb, self.y[bi], ctx.sample_idx)
            if own is not None:
                return own
        loss, parts = self.alg.client_loss(s.model, xb, self.y[bi], ctx)
        self.record(loss.detach().double() * len(bi), {k: v.detach().double() * len(bi) for k, v in parts.items()},
                    len(bi))
        return loss

    def apply(self, optimizer: LocalOptimizer, step: Any) -> None:
        if self.alg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.alg.clip_grad_norm)
        optimizer.step()

    def fits(self, step: Any) -> bool:
        return all(part.fits(self.seen, len(step)) for part in self.parts)

    def end_epoch(self) -> bool:
        self.ctx.epoch += 1
        if not bool(torch.isfinite(self.loss_sum)):
            self.finite = False
        return self.finite
