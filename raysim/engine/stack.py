"""Stacked clients (``engine.vectorize``): K same-architecture clients trained in lockstep as one computation.

For the small models of cross-device FL a client's step is a handful of tiny kernels, and Python and dispatch cost
more than the arithmetic. A stack stacks its clients' parameters along a new first dimension and runs every step
for all of them at once: one ``torch.func.vmap`` of the algorithm's own ``client_loss`` (the hook sees its usual
``model``, reparametrised with ``torch.func.functional_call``), the per-client losses summed, one backward and one
step of the usual ``torch.optim`` optimiser on the stacked tensors. The clients are independent, so the gradient of
the summed loss is, slice by slice, each client's own gradient, and SGD (momentum, weight decay) and Adam are
elementwise: each slice takes its own client's step.

What stays per client, exactly as :meth:`raysim.engine.core.ClientJobs.train` does it one at a time:

- setup: every client is started by ``ClientJobs.start`` (seeded from (seed, client, round), its state, payload and
  phases), and its upload and kept state come from ``ClientJobs.finish`` on the model loaded with its slice;
- batches: each client draws its own permutation every epoch from its own generator and cuts it with
  :func:`raysim.algorithms.training.batch_bounds`, so it sees exactly the batches it would alone. Step s of an epoch is
  every client's s-th batch; clients whose s-th batch has another size (a short or merged last batch) are run as
  their own group within the same step (one client alone without vmap), so no sample is padded or made up; a
  client with fewer batches sits out the rest of the epoch, its parameters and optimiser state as they were;
- the loss and its parts are summed per client in float64, on the device, with no host sync inside an epoch; a
  client whose loss is no longer finite stops at the end of that epoch, as alone.

Numbers: inside the step, ``raysim.engine.exact_kernels.OneClientOrder`` computes linear layers, CPU convolutions
and plain cross-entropies as one client does, so an MLP's stack (and, on a CPU, a CNN's) gives every client its
own numbers bit for bit; what it does not cover (batch norm, other reductions) agrees within float32 rounding.

The steps go through the one local loop (``raysim.algorithms.training.run_phases``), with this module's
:class:`_StackRun` as the trainee. Stacks are fixed groups of the round's clients in client-id order, cut by the
round's plan (``raysim.engine.plan``), whatever the number of workers, so a run's metrics do not depend on
``engine.num_workers``. What may train in a stack, and ``auto``'s probe: ``raysim.engine.vectorize_probe``.

An algorithm opts in with ``vectorizable = True`` (see ``docs/hooks.md`` for what makes its hooks vectorisable).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn
from torch.func import functional_call, vmap

from raysim.algorithms.base import live_state
from raysim.algorithms.training import LocalOptimizer, Trainee, batch_bounds, make_optimizer, run_phases
from raysim.engine.exact_kernels import OneClientOrder
from raysim.engine.jobs import JobCore, StartedJob, TrainJob, TrainResult
from raysim.models import model_key
from raysim.trees import stack_trees, tree_map

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm

RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def model_refusal(model: nn.Module) -> Optional[str]:
    """Why ``model`` cannot train in a stack (None: it can): random layers would need one random stream per
    client inside one batched call."""
    random = sorted({type(m).__name__ for m in model.modules() if isinstance(m, RANDOM_MODULES) and m.p > 0})
    if random:
        return (f"the model has {', '.join(random)} layers, whose random masks cannot be drawn as each client draws "
                f"them alone inside one batched step")
    return None


class _Unstacked(Mapping):
    """``ctx.state`` inside a vectorised step when the stack's states differ in structure (some clients have kept
    state, some not yet): any read is an error that says so, never a silent default (``.get(key, {})`` included).
    A state that a vectorisable loss reads must have one structure for every client: give it from
    ``init_client_state``."""

    def _refuse(self, *_: Any) -> Any:
        raise KeyError("ctx.state: this stack's client states differ in structure, so a vectorised client_loss "
                       "cannot read them (give every client the same state from init_client_state)")

    __getitem__ = __iter__ = __len__ = __contains__ = get = keys = items = values = _refuse


class _HookCall(nn.Module):
    """Calls the algorithm's ``client_loss`` on ``model``: ``functional_call`` on this wrapper swaps the model's
    parameters and buffers for a client's slice, whichever of the model's methods the hook calls."""

    def __init__(self, model: nn.Module, loss: Callable):
        super().__init__()
        self.model = model
        self._loss = loss

    def forward(self, x: torch.Tensor, y: torch.Tensor, ctx: Any) -> Any:
        return self._loss(self.model, x, y, ctx)


@functools.lru_cache(maxsize=4096)
def _batch_sizes(n: int, batch_size: int) -> tuple[int, ...]:
    return tuple(e - b for b, e in batch_bounds(n, batch_size))


# ---------------------------------------------------------------------------------------------- training
def train_stack(core: JobCore, jobs: list[TrainJob], shared: dict, owns: list[Optional[dict]],
                 states: list[Optional[dict]]) -> list[tuple[TrainResult, Optional[dict]]]:
    """Train every job's client, stacking those that can train together; returns (result, new state) per job, in
    the order given. Clients of one architecture, with the same phases (and, with Adam, the same number of batches
    an epoch), train as one batched computation; a client alone in its group trains one at a time."""
    clock = time.perf_counter()
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].client_id)
    out: list[Optional[tuple[TrainResult, Optional[dict]]]] = [None] * len(jobs)
    if core.algorithm.refusal("stack", core.cfg) is not None or len(jobs) < 2:
        for i in order:
            out[i] = core.train(jobs[i], shared, owns[i], states[i])
        return out  # type: ignore[return-value]
    groups: dict[tuple, list[tuple[int, StartedJob, dict[str, torch.Tensor]]]] = {}
    for i in order:
        started = core.start(jobs[i], shared, owns[i], states[i])
        own_keys = tuple(sorted(owns[i] or ()))  # client_payload's entries, stacked per client
        key = (model_key(core.cfg, core.data, jobs[i].client_id), own_keys, *_phase_spec(started))
        if core.cfg.train.optimizer == "adam":  # Adam's step count is one per tensor: no client may sit out a step
            key += (len(_batch_sizes(len(started.ctx.train_data[1]), core.cfg.train.batch_size)),)
        snapshot = {k: v.detach().clone() for k, v in live_state(started.model).items()}
        groups.setdefault(key, []).append((i, started, snapshot))
    for key, members in groups.items():
        if len(members) == 1 or model_refusal(members[0][1].model) is not None:
            for i, _, _ in members:
                out[i] = core.train(jobs[i], shared, owns[i], states[i])  # starts it again: a pure function
        else:
            done = _StackRun(core, members, set(key[1])).run()
            for (i, _, _), value in zip(members, done):
                out[i] = value
    seconds = (time.perf_counter() - clock) / len(jobs)  # the stack's time, shared out
    for value in out:
        if value is not None:
            value[0].seconds = seconds
    return out  # type: ignore[return-value]


def _phase_spec(started: StartedJob) -> tuple:
    """The client's local phases by parameter name: (names, epochs, learning rate) each."""
    names = {id(t): n for n, t in live_state(started.model).items()}
    return tuple((tuple(names[id(p)] for p in params), epochs, lr[0] if lr else None)
                 for params, epochs, *lr in started.phases)


class _StackRun(Trainee):
    """One stacked computation: the clients of ``members`` (same architecture and phases) through all phases."""

    def __init__(self, core: JobCore, members: list[tuple[int, StartedJob, dict[str, torch.Tensor]]],
                 own_keys: set[str]):
        self.core = core
        self.cfg = core.cfg
        self.alg: Algorithm = core.algorithm
        self.started = [s for _, s, _ in members]
        self.k = len(members)
        model = self.started[0].model
        self.model = model
        self.param_names = [n for n, _ in model.named_parameters()]
        self.buffer_names = [n for n, _ in model.named_buffers()]
        snaps = [snap for _, _, snap in members]
        self.params = {n: torch.stack([s[n] for s in snaps]) for n in self.param_names}
        self.buffers = {n: torch.stack([s[n] for s in snaps]) for n in self.buffer_names}
        self.wrapper = _HookCall(model, self.alg.client_loss)
        self.keys = {n: "model." + n for n in self.param_names + self.buffer_names}
        # every client's training split, one after another; a client's batch is a row of global positions
        data = [s.ctx.train_data for s in self.started]
        self.sizes = [len(y) for _, y, _ in data]
        self.offsets = [0]
        for n in self.sizes[:-1]:
            self.offsets.append(self.offsets[-1] + n)
        self.x = torch.cat([x for x, _, _ in data])
        self.y = torch.cat([y for _, y, _ in data])
        self.idx = torch.cat([i for _, _, i in data])
        self.device = self.x.device
        # what client_loss reads besides the batch: the shared payload as it is, each client's own entries
        # (``client_payload``) and kept state stacked
        ctx0 = self.started[0].ctx
        self.shared_payload = {k: v for k, v in ctx0.payload.items() if k not in own_keys}
        self.own = stack_trees([{k: s.ctx.payload[k] for k in own_keys} for s in self.started]) if own_keys else {}
        if self.own is None:
            raise ValueError("a stack needs its clients' own payloads (client_payload) to have one "
                             "structure")
        stacked_state = stack_trees([s.ctx.state for s in self.started])
        self.state = stacked_state if stacked_state is not None else {}
        self.state_unstacked = stacked_state is None
        self.template = dataclasses.replace(ctx0, client_id=-1, train_data=None, scratch={}, sample_idx=None,
                                            payload={}, state={})

    # ------------------------------------------------------------------ the batched loss of one group of clients
    def _loss(self, params: dict, buffers: dict, x: torch.Tensor, y: torch.Tensor, sample_idx: torch.Tensor,
              own: dict, state: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        values = {self.keys[n]: v for n, v in params.items()}
        values.update({self.keys[n]: v for n, v in buffers.items()})
        ctx = dataclasses.replace(self.template, payload={**self.shared_payload, **own},
                                  state=_Unstacked() if self.state_unstacked else state, sample_idx=sample_idx)
        return functional_call(self.wrapper, values, (x, y, ctx))

    def _group_loss(self, members: Optional[torch.Tensor], rows: torch.Tensor) -> tuple:
        """(per-client losses [clients], per-client parts, the group's parameters) of one step for the clients
        ``members`` (None: all of them), whose batches are the global sample positions ``rows`` [clients, batch].

        The whole stack computes on the stacked parameters themselves. A part of it computes on detached copies of
        its rows (:meth:`_scatter_grads` puts their gradients back), so that no group's backward fills a gradient
        the size of the whole stack; one client alone computes without vmap, as it would alone."""
        if members is None:
            params, pick = self.params, (lambda t: t)
        else:
            params = {n: p.detach().index_select(0, members).requires_grad_(p.requires_grad)
                      for n, p in self.params.items()}
            pick = (lambda t: t.index_select(0, members))
        buffers = {n: pick(b) for n, b in self.buffers.items()}
        x = self.x[rows]
        if self.started[0].augment is not None:  # each client's own augmentation stream, one batch at a time
            who = range(self.k) if members is None else members.tolist()
            x = torch.stack([self.started[c].augment(xc, self.started[c].aug_gen) for c, xc in zip(who, x)])
        state = {} if self.state_unstacked else tree_map(pick, self.state)
        own = tree_map(pick, self.own)
        y, sample_idx = self.y[rows], self.idx[rows]
        if x.shape[0] == 1:  # one client: its own step, without vmap
            args = [tree_map(lambda t: t[0], v) for v in (params, buffers, x, y, sample_idx, own, state)]
            loss, parts = self._loss(*args)
            loss, parts = loss.unsqueeze(0), {name: v.unsqueeze(0) for name, v in parts.items()}
        else:
            with OneClientOrder(), warnings.catch_warnings():
                # an op without a batching rule (kl_div) runs client by client: slower, and one client's numbers
                warnings.filterwarnings("ignore", message="There is a performance drop", category=UserWarning)
                loss, parts = vmap(self._loss, in_dims=(0, 0, 0, 0, 0, 0 if own else None, 0 if state else None))(
                    params, buffers, x, y, sample_idx, own, state)
        if members is not None and buffers:  # running statistics were updated in the picked copies: write back
            with torch.no_grad():
                for n, b in buffers.items():
                    self.buffers[n].index_copy_(0, members, b)
        return loss, parts, params

    def _scatter_grads(self, picked: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> None:
        """Each group's parameter gradients into its rows of the stack's gradients (rows no group trained: 0)."""
        for n, stack in self.params.items():
            if not stack.requires_grad:
                continue
            for members, params in picked:
                g = params[n].grad
                if g is None:
                    continue
                if stack.grad is None:
                    stack.grad = torch.zeros_like(stack)
                stack.grad.index_copy_(0, members, g)

    # ------------------------------------------------------------------ all phases
    # ------------------------------------------------------------------ all phases, through the one local loop
    def run(self) -> list[tuple[TrainResult, Optional[dict]]]:
        k = self.k
        self.everyone = torch.arange(k, device=self.device)
        self.loss_sum = torch.zeros(k, dtype=torch.float64, device=self.device)
        self.part_sums: dict[str, torch.Tensor] = {}
        self.seen = [0] * k
        self.stopped = [False] * k  # a client whose loss turned non-finite: out for the rest of its job
        self.epochs_done = [0] * k
        self.batches = [_batch_sizes(n, self.cfg.train.batch_size) for n in self.sizes]
        self.model.train()
        run_phases(_phase_spec(self.started[0]), self)
        return self._finish(self.loss_sum, self.part_sums, self.seen, self.stopped, self.epochs_done)

    def begin_phase(self, names: tuple, lr: Optional[float]) -> LocalOptimizer:
        for n, p in self.params.items():
            p.requires_grad_(n in names)
        self.trained = [self.params[n] for n in names]
        return make_optimizer(self.cfg, self.trained, lr)

    def steps(self) -> range:
        """Step s of an epoch is every active client's s-th batch."""
        self.rows = self._epoch_positions(self.stopped)
        return range(max((len(b) for b, s in zip(self.batches, self.stopped) if not s), default=0))

    def loss(self, step: int) -> Optional[torch.Tensor]:
        """The summed loss of every client with a step-th batch: clients whose batches differ in size compute as
        groups of their own; the losses and parts are accounted per client."""
        k, bs = self.k, self.cfg.train.batch_size
        groups: dict[int, list[int]] = {}  # batch size -> clients with a batch of that size this step
        for c in range(k):
            if not self.stopped[c] and step < len(self.batches[c]):
                groups.setdefault(self.batches[c][step], []).append(c)
        total = None
        self.picked: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
        for size, members in groups.items():
            index = None if len(members) == k else torch.tensor(members, device=self.device)
            block = (self.rows if index is None else self.rows.index_select(0, index))[:, step * bs:step * bs + size]
            loss, parts, params = self._group_loss(index, block)
            if index is not None:
                self.picked.append((index, params))
            total = loss.sum() if total is None else total + loss.sum()
            where = self.everyone if index is None else index
            self.loss_sum.index_add_(0, where, loss.detach().double() * size)
            for name, v in parts.items():
                acc = self.part_sums.setdefault(name, torch.zeros(k, dtype=torch.float64, device=self.device))
                acc.index_add_(0, where, v.detach().double() * size)
            for c in members:
                self.seen[c] += size
        active = {c for members in groups.values() for c in members}
        self.sitting_out = [c for c in range(k) if c not in active]
        return total

    def apply(self, opt: LocalOptimizer, step: int) -> None:
        """One optimiser step on the stack, after the backward pass; clients sitting this step out get their
        parameters and optimiser state back as they were (unless the optimiser leaves a row with a zero gradient
        as it is: plain SGD)."""
        self._scatter_grads(self.picked)
        if self.alg.clip_grad_norm is not None:
            _clip_per_client(self.trained, self.alg.clip_grad_norm, self.k)
        t = self.cfg.train
        if not self.sitting_out or (t.optimizer == "sgd" and t.momentum == 0 and t.weight_decay == 0):
            opt.step()  # plain SGD: p - lr * 0 is p, bit for bit
            return
        index = torch.tensor(self.sitting_out, device=self.device)
        keep = [(s, s.index_select(0, index)) for s in self._stacked_state(opt, self.trained)]
        opt.step()
        with torch.no_grad():
            for s, saved in keep:
                s.index_copy_(0, index, saved)

    def end_epoch(self) -> bool:
        for c in range(self.k):
            self.epochs_done[c] += not self.stopped[c]
        self.template = dataclasses.replace(self.template, epoch=self.template.epoch + 1)
        finite = torch.isfinite(self.loss_sum).tolist()  # one host sync an epoch, as one client alone
        self.stopped = [s or not f for s, f in zip(self.stopped, finite)]
        return not all(self.stopped)

    def _epoch_positions(self, stopped: list[bool]) -> torch.Tensor:
        """[clients, largest split] global sample positions: each client's own permutation for this epoch, drawn
        from its own generator as ``epoch_batches`` draws it (clients that stopped draw nothing)."""
        rows = torch.zeros(self.k, max(self.sizes), dtype=torch.int64)
        for c, s in enumerate(self.started):
            if not stopped[c]:
                rows[c, :self.sizes[c]] = torch.randperm(self.sizes[c], generator=s.gen) + self.offsets[c]
        return rows.to(self.device)

    def _stacked_state(self, opt: LocalOptimizer, trained: list[torch.Tensor]) -> list[torch.Tensor]:
        """The trained stacks and every per-client tensor of the optimiser's state (momentum, Adam's moments)."""
        out = [p.data for p in trained]
        for p in trained:
            for v in opt.state.get(p, {}).values():
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == self.k:
                    out.append(v)
        return out

    def _finish(self, loss_sum: torch.Tensor, part_sums: dict[str, torch.Tensor], seen: list[int],
                stopped: list[bool], epochs_done: list[int]) -> list[tuple[TrainResult, Optional[dict]]]:
        for p in self.params.values():
            p.requires_grad_(False)
        losses = loss_sum.cpu()
        parts = {name: v.cpu() for name, v in part_sums.items()}
        out = []
        for c, started in enumerate(self.started):
            with torch.no_grad():  # the process's model object for this architecture, holding this client's slice
                for name, live in live_state(started.model).items():
                    live.copy_((self.params[name] if name in self.params else self.buffers[name])[c])
            started.ctx.epoch = epochs_done[c]
            out.append(self.core.finish(started, losses[c], {name: v[c] for name, v in parts.items()}, seen[c],
                                        not stopped[c]))
        return out


def _clip_per_client(trained: list[torch.Tensor], max_norm: float, k: int) -> None:
    """``clip_grad_norm_`` for each client's slice: its gradient norm over every trained tensor, clipped to
    ``max_norm``, with the numbers ``clip_grad_norm_`` gives one client alone: each tensor's norm, then the norm of
    the client's norms as one contiguous row (a reduction across rows, over the other dimension, sums in another
    order)."""
    grads = [p.grad for p in trained if p.grad is not None]
    if not grads:
        return
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), dim=1) for g in grads], dim=1)  # [k, tensors]
    total = torch.linalg.vector_norm(norms, dim=1)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(k, *([1] * (g.dim() - 1))))
