"""Vectorised cohorts (``engine.vectorize``): K same-architecture clients trained in lockstep as one computation.

For the small models of cross-device FL a client's step is a handful of tiny kernels, and Python and dispatch cost
more than the arithmetic. A cohort stacks its clients' parameters along a new first dimension and runs every step
for all of them at once: one ``torch.func.vmap`` of the algorithm's own ``client_loss`` (the hook sees its usual
``model``, reparametrised with ``torch.func.functional_call``), the per-client losses summed, one backward and one
step of the usual ``torch.optim`` optimiser on the stacked tensors. The clients are independent, so the gradient of
the summed loss is, slice by slice, each client's own gradient, and SGD (momentum, weight decay) and Adam are
elementwise: each slice takes its own client's step.

What stays per client, exactly as :meth:`raysim.engine.core.ClientJobs.train` does it one at a time:

- setup: every client is started by ``ClientJobs.start`` (seeded from (seed, client, round), its state, payload and
  phases), and its upload and kept state come from ``ClientJobs.finish`` on the model loaded with its slice;
- batches: each client draws its own permutation every epoch from its own generator and cuts it with
  :func:`raysim.engine.epochs.batch_bounds`, so it sees exactly the batches it would alone. Step s of an epoch is
  every client's s-th batch; clients whose s-th batch has another size (a short or merged last batch) are run as
  their own group within the same step (one client alone without vmap), so no sample is padded or made up; a
  client with fewer batches sits out the rest of the epoch, its parameters and optimiser state as they were;
- the loss and its parts are summed per client in float64, on the device, with no host sync inside an epoch; a
  client whose loss is no longer finite stops at the end of that epoch, as alone.

Numbers: vmap's own rules sum in other orders than one client alone (a linear layer's weight gradient as (xᵀg)ᵀ
rather than gᵀx, a batch's mean cross-entropy, a grouped convolution over the clients). Inside the step,
:class:`_OneClientOrder` computes those as one client does, so an MLP's cohort (and, on a CPU, a CNN's) gives every
client its own numbers bit for bit; what it does not cover (batch norm, other reductions) agrees within float32
rounding.

Cohorts are fixed groups of the round's clients in client-id order (:func:`plan_cohorts`), whatever the number of
workers, so a run's metrics do not depend on ``engine.num_workers``.

An algorithm opts in with ``vectorizable = True`` (see ``docs/hooks.md`` for what makes its hooks vectorisable).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap
from torch.overrides import TorchFunctionMode

from raysim.algorithms.base import live_state
from raysim.engine.core import ClientJobs, StartedJob, make_optimizer
from raysim.engine.epochs import batch_bounds
from raysim.engine.jobs import TrainJob, TrainResult
from raysim.engine.partial import UploadSum, sum_results
from raysim.models import model_key

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm
    from raysim.config import ExperimentConfig

RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)

AUTO_MAX_K = 128  # engine.vectorize=auto: cohorts of at most this many clients (a round's split evenly),
AUTO_MEMORY_BYTES = 1 << 30  # whose stacked training state fits this budget (per CPU worker; on a GPU, half of
# the worker's share of the device's memory: AUTO_GPU_MEMORY_SHARE x total x engine.gpus_per_worker),
AUTO_GPU_MEMORY_SHARE = 0.5
AUTO_SLOW_JOB_S = 0.25  # never for clients whose one-at-a-time update takes longer (the arithmetic dominates),
AUTO_MARGIN = 1.25  # and only when the probe measured cohorts at least this much faster per client
AUTO_SERIAL_JOBS = 8  # clients the probe times one at a time


# ---------------------------------------------------------------------------------------------- what can vectorise
def vectorize_setting(cfg: ExperimentConfig) -> int | str:
    """``engine.vectorize`` as ``"off"``, ``"auto"`` or a cohort size N >= 2 (N = 1 is off)."""
    value = str(cfg.engine.vectorize)
    if value in ("off", "auto"):
        return value
    return int(value) if int(value) >= 2 else "off"


def model_refusal(model: nn.Module) -> Optional[str]:
    """Why ``model`` cannot train in a cohort (None: it can): random layers would need one random stream per
    client inside one batched call."""
    random = sorted({type(m).__name__ for m in model.modules() if isinstance(m, RANDOM_MODULES) and m.p > 0})
    if random:
        return (f"the model has {', '.join(random)} layers, whose random masks cannot be drawn as each client draws "
                f"them alone inside one batched step")
    return None


def run_cohort_size(cfg: ExperimentConfig, algorithm: Algorithm, model: nn.Module) -> Optional[int]:
    """The cohort size a run starts with: 1 (one client at a time), N, or None (``auto``: a probe at the first
    round decides). A model that cannot be stacked is refused in one line when N is asked for, and left at 1 by
    ``auto``; an algorithm without vectorisable hooks, or one architecture per client, runs one at a time (the
    config's notice says so: ``raysim.checks.vectorize_notices``)."""
    from raysim.errors import UserError
    from raysim.registry import get_model

    setting = vectorize_setting(cfg)
    if setting == "off" or not type(algorithm).vectorizes():
        return 1
    if any(getattr(get_model(n), "per_client", False) for n in cfg.model.names()):
        return 1
    reason = model_refusal(model)
    if reason is not None:
        if setting == "auto":
            return 1
        raise UserError(f"config key 'engine.vectorize': {reason}; set engine.vectorize=off")
    return None if setting == "auto" else int(setting)


def plan_cohorts(num_jobs: int, size: int) -> list[range]:
    """Positions of the round's jobs (in client-id order) cut into fixed cohorts of ``size``: the same cohorts
    whatever the number of workers, so the same numbers."""
    size = max(1, size)
    return [range(b, min(b + size, num_jobs)) for b in range(0, num_jobs, size)]


def cohorts_of_groups(sizes: list[int], cohort_size: Optional[int]) -> Optional[list[int]]:
    """With partial sums (``engine.partial_sums``): each sum group's cohort (None: no cohorts). A cohort is a run of
    whole consecutive groups of at most ``cohort_size`` clients (at least one group), so every group is still
    summed on its own, exactly as without cohorts; the same cohorts whatever the number of workers."""
    if not cohort_size or cohort_size <= 1:
        return None
    out: list[int] = []
    cohort, clients = 0, 0
    for size in sizes:
        if clients and clients + size > cohort_size:
            cohort, clients = cohort + 1, 0
        out.append(cohort)
        clients += size
    return out


def runs_of_cohorts(num_groups: int, cohorts: Optional[list[int]]) -> list[list[int]]:
    """Group indices in the order they train: one group at a time, or (``cohorts``) a cohort's groups together."""
    if cohorts is None:
        return [[i] for i in range(num_groups)]
    runs: list[list[int]] = []
    for i, c in enumerate(cohorts):
        if runs and cohorts[runs[-1][0]] == c:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


# ---------------------------------------------------------------------------------------------- small tree helpers
def _tree_map(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_tree_map(fn, v) for v in tree)
    return tree


def _signature(tree: Any) -> Any:
    """A tree's structure, shapes and dtypes (plain values as themselves); None for anything else."""
    if isinstance(tree, torch.Tensor):
        return ("tensor", tuple(tree.shape), tree.dtype)
    if isinstance(tree, dict):
        return {k: _signature(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_signature(v) for v in tree]
    return ("value", tree) if isinstance(tree, (int, float, str, bool, type(None))) else None


def _stackable(signature: Any) -> bool:
    if isinstance(signature, dict):
        return all(_stackable(v) for v in signature.values())
    if isinstance(signature, list):
        return all(_stackable(v) for v in signature)
    return signature is not None


def _stack_trees(trees: list[Any]) -> Any:
    """The clients' trees as one tree of stacked tensors (first dimension: the client); None where they differ in
    structure, shape or dtype, or hold anything but tensors and plain values."""
    first = _signature(trees[0])
    if not _stackable(first) or any(_signature(t) != first for t in trees[1:]):
        return None

    def stack(*leaves: Any) -> Any:
        if isinstance(leaves[0], torch.Tensor):
            return torch.stack(leaves)
        if isinstance(leaves[0], dict):
            return {k: stack(*(leaf[k] for leaf in leaves)) for k in leaves[0]}
        if isinstance(leaves[0], (list, tuple)):
            return type(leaves[0])(stack(*parts) for parts in zip(*leaves))
        return leaves[0]

    return stack(*trees)


class _Unstacked(Mapping):
    """``ctx.state`` inside a vectorised step when the cohort's states differ in structure (some clients have kept
    state, some not yet): any read is an error that says so, never a silent default (``.get(key, {})`` included).
    A state that a vectorisable loss reads must have one structure for every client: give it from
    ``init_client_state``."""

    def _refuse(self, *_: Any) -> Any:
        raise KeyError("ctx.state: this cohort's client states differ in structure, so a vectorised client_loss "
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


def _tiny_product(rows: int, features: int, outputs: int) -> bool:
    """Matrix products small enough that torch's batched kernel takes another path than one client's (a plain loop
    below ~400 multiply-adds, a matrix-vector product for one row): computed client by client instead."""
    return rows <= 1 or rows * features * outputs < 400


def _save_layer_inputs(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    """``setup_context`` of the stacked layers (linear and convolution): their backward needs the input, the weight
    and whether a bias came."""
    x, weight, bias = inputs[:3]
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


class _StackedLinear(torch.autograd.Function):
    """A linear layer of K stacked clients (x [K, N, in], weight [K, out, in], bias [K, out] or None) computed as
    each client's alone: the forward as ``baddbmm``, and the weight's gradient as gᵀx, the orientation of torch's
    layout-aware backward of one linear layer (vmap's own rule takes (xᵀg)ᵀ, another summation order)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if _tiny_product(x.shape[1], weight.shape[2], weight.shape[1]):
            return torch.stack([F.linear(x[c].clone(), weight[c].clone(), None if bias is None else bias[c])
                                for c in range(x.shape[0])])
        if bias is None:
            return torch.bmm(x, weight.transpose(1, 2))
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    setup_context = staticmethod(_save_layer_inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # as one client's: vmap may hand it over in another memory order
        k = x.shape[0]
        tiny = _tiny_product(x.shape[1], weight.shape[2], weight.shape[1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.stack([grad[c].clone().mm(weight[c].clone()) for c in range(k)]) if tiny \
                else torch.bmm(grad, weight)
        if ctx.needs_input_grad[1]:
            grad_w = torch.stack([grad[c].clone().t().mm(x[c].clone()) for c in range(k)]) if tiny \
                else torch.bmm(grad.transpose(1, 2), x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(1)
        return grad_x, grad_w, grad_b


class _SerialLinear(torch.autograd.Function):
    """``F.linear`` inside a vectorised step: under vmap, clients' own weights go through :class:`_StackedLinear`;
    a weight shared by every client (a payload's, such as UNIDEAL's teacher head) is one plain layer over all
    clients' rows. With it a stacked MLP's forward and gradients equal one-at-a-time ones bit for bit when its
    layers' input widths are multiples of 4 (measured: otherwise the BLAS kernels' results depend on where each client's
    rows start in memory, and agree within float32 rounding)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return F.linear(x, weight, bias)

    setup_context = staticmethod(_save_layer_inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # outside vmap: one linear layer, as torch computes it
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        grad_w = flat.t().mm(x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        grad_b = flat.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor,
             bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[int]]:
        x_dim, w_dim, b_dim = in_dims
        if w_dim is None and b_dim is None:
            return (F.linear(x, weight, bias), None) if x_dim is None else \
                (F.linear(x.movedim(x_dim, 0), weight, bias), 0)
        k = info.batch_size
        x = x.movedim(x_dim, 0) if x_dim is not None else x.expand(k, *x.shape)
        weight = weight.movedim(w_dim, 0) if w_dim is not None else weight.expand(k, *weight.shape)
        if bias is not None:
            bias = bias.movedim(b_dim, 0) if b_dim is not None else bias.expand(k, *bias.shape)
        rows = x.reshape(k, -1, x.shape[-1])
        out = _StackedLinear.apply(rows, weight, bias)
        return out.reshape(*x.shape[:-1], out.shape[-1]), 0


def _pair(value: Any) -> list[int]:
    return [int(v) for v in value] if isinstance(value, (tuple, list)) else [int(value)] * 2


class _StackedConv2d(torch.autograd.Function):
    """K clients' 2-d convolutions (x [K, N, C, H, W], weight [K, O, C/groups, kh, kw], bias [K, O] or None), each
    computed as alone: its own convolution forward and backward (torch's ``convolution_backward``, as autograd
    calls it for one client), one client after another. On a CPU a convolution's arithmetic dominates its dispatch,
    so a cohort gives nothing away by it, while vmap's own rule (one grouped convolution over the clients) is slower
    there and sums in another order; the rest of the step (dense layers, loss, optimiser) stays batched."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int],
                padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
        return torch.stack([F.conv2d(x[c].clone(), weight[c].clone(), None if bias is None else bias[c].clone(),
                                     stride, padding, dilation, groups) for c in range(x.shape[0])])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        _save_layer_inputs(ctx, inputs, output)
        ctx.conv = tuple(inputs[3:])  # stride, padding, dilation, groups

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        parts = [torch.ops.aten.convolution_backward(
            grad[c].contiguous(), x[c].clone(), weight[c].clone(), [weight.shape[1]] if ctx.has_bias else None,
            stride, padding, dilation, False, [0, 0], groups, mask) for c in range(x.shape[0])]
        grads = [torch.stack([part[i] for part in parts]) if mask[i] else None for i in range(3)]
        return (*grads, None, None, None, None)


class _SerialConv2d(torch.autograd.Function):
    """``F.conv2d`` inside a vectorised step on a CPU: clients' own weights through :class:`_StackedConv2d`, so a
    CNN's cohort computes each client's numbers bit for bit as alone (as far as the dense layers do)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int],
                padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        raise RuntimeError("_SerialConv2d runs under vmap only")

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
             stride: list[int], padding: list[int], dilation: list[int], groups: int) -> tuple[torch.Tensor, int]:
        x_dim, w_dim, b_dim = in_dims[:3]
        k = info.batch_size
        x = x.movedim(x_dim, 0) if x_dim is not None else x.expand(k, *x.shape)
        weight = weight.movedim(w_dim, 0) if w_dim is not None else weight.expand(k, *weight.shape)
        if bias is not None:
            bias = bias.movedim(b_dim, 0) if b_dim is not None else bias.expand(k, *bias.shape)
        return _StackedConv2d.apply(x, weight, bias, stride, padding, dilation, groups), 0


def _serial_conv2d(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """``F.conv2d`` of one client's batch through :class:`_SerialConv2d` (None: leave it as it is: string padding,
    an input without a batch dimension, or an accelerator, where vmap's grouped convolution is the fast way)."""
    a = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1,
         **dict(zip(("input", "weight", "bias", "stride", "padding", "dilation", "groups"), args)), **kwargs}
    x = a["input"]
    if isinstance(a["padding"], str) or x.dim() != 4 or x.device.type != "cpu":
        return None
    return _SerialConv2d.apply(x, a["weight"], a["bias"], _pair(a["stride"]), _pair(a["padding"]),
                               _pair(a["dilation"]), int(a["groups"]))


_NLL_LEVELS, _NLL_POWER = 8, 4  # the cascade of torch's CPU nll_loss kernel: 8 levels of 2**4 samples


def _nll_order_sum(values: torch.Tensor) -> torch.Tensor:
    """-Σ values over the last dimension, added in the order of torch's nll_loss kernel (a cascade of partial sums,
    each in float32), so that the mean cross-entropy of one client's batch has the kernel's value bit for bit."""
    zero = values.new_zeros(values.shape[:-1])
    parts = [zero] * _NLL_LEVELS
    mask = (1 << _NLL_POWER) - 1
    for b in range(values.shape[-1]):
        parts[0] = parts[0] - values[..., b]
        for j in range(_NLL_LEVELS - 1):
            if b & (mask << (j * _NLL_POWER)):
                break
            parts[j + 1] = parts[j + 1] + parts[j]
            parts[j] = zero
    total = zero
    for part in parts:
        total = total + part
    return total


_CE_PLAIN = {"weight": None, "size_average": None, "reduce": None, "ignore_index": -100, "label_smoothing": 0.0}
_CE_ARGS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")


def _serial_cross_entropy(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """``F.cross_entropy`` of one client's [B, C] logits and class targets with the value torch's CPU kernel gives
    (vmap's own rule sums the batch in another order); None for any other use (weights, smoothing, soft targets, an
    accelerator), which then runs as it is."""
    a = {**_CE_PLAIN, "reduction": "mean", **dict(zip(_CE_ARGS, args)), **kwargs}  # F.cross_entropy's signature
    logits, target = a["input"], a["target"]
    if logits.device.type != "cpu":  # the cascade is the CPU kernel's order; an accelerator's kernel has its own
        return None
    if any(a[k] != v for k, v in _CE_PLAIN.items()) or a["reduction"] not in ("mean", "sum") \
            or logits.dim() != 2 or target.dim() != 1 or target.is_floating_point():
        return None
    picked = F.log_softmax(logits, dim=1).gather(1, target.unsqueeze(1)).squeeze(1)
    fast = -picked.sum()  # the gradient (-1 each, as the kernel's), not the value
    with torch.no_grad():
        exact = _nll_order_sum(picked)
    total = exact + (fast - fast.detach())  # the kernel's value, the gradient of a sum
    return total / picked.shape[0] if a["reduction"] == "mean" else total


class _OneClientOrder(TorchFunctionMode):
    """Inside a vectorised step: linear layers through :class:`_SerialLinear`, 2-d convolutions on a CPU through
    :class:`_SerialConv2d` and plain cross-entropies through :func:`_serial_cross_entropy`, so that a client's
    numbers are those it gets alone."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            return _SerialLinear.apply(x, weight, rest[0] if rest else kwargs.get("bias"))
        if func is F.conv2d:
            out = _serial_conv2d(args, kwargs)
            if out is not None:
                return out
        if func is F.cross_entropy:
            out = _serial_cross_entropy(args, kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=4096)
def _batch_sizes(n: int, batch_size: int) -> tuple[int, ...]:
    return tuple(e - b for b, e in batch_bounds(n, batch_size))


# ---------------------------------------------------------------------------------------------- training
def train_cohort(core: ClientJobs, jobs: list[TrainJob], shared: dict, owns: list[Optional[dict]],
                 states: list[Optional[dict]]) -> list[tuple[TrainResult, Optional[dict]]]:
    """Train every job's client, stacking those that can train together; returns (result, new state) per job, in
    the order given. Clients of one architecture, with the same phases (and, with Adam, the same number of batches
    an epoch), train as one batched computation; a client alone in its group trains one at a time."""
    clock = time.perf_counter()
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].client_id)
    out: list[Optional[tuple[TrainResult, Optional[dict]]]] = [None] * len(jobs)
    if not type(core.algorithm).vectorizes() or len(jobs) < 2:
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
            done = _CohortRun(core, members, set(key[1])).run()
            for (i, _, _), value in zip(members, done):
                out[i] = value
    seconds = (time.perf_counter() - clock) / len(jobs)  # the cohort's time, shared out
    for value in out:
        if value is not None:
            value[0].seconds = seconds
    return out  # type: ignore[return-value]


def train_groups_stacked(core: ClientJobs, groups: list[list[TrainJob]], shared: dict,
                         owns: list[list[Optional[dict]]], states: list[list[Optional[dict]]]
                         ) -> list[tuple[UploadSum, list[tuple[TrainResult, Optional[dict]]]]]:
    """One cohort made of whole sum groups (``engine.partial_sums``): every client of every group trained as one
    batched computation (:func:`train_cohort`), then each group's finite uploads summed on their own, in id order,
    as ``ClientJobs.train_group`` sums them; returns (the group's sum, its [(result without upload, state)]) per
    group."""
    flat = [job for jobs in groups for job in jobs]
    core.busy = flat[0].client_id  # for an error's message: the cohort's first client
    done = train_cohort(core, flat, shared, [o for own in owns for o in own], [s for st in states for s in st])
    out, at = [], 0
    for jobs in groups:
        part = done[at:at + len(jobs)]
        at += len(jobs)
        out.append((sum_results([result for result, _ in part]), part))
    return out


def _phase_spec(started: StartedJob) -> tuple:
    """The client's local phases by parameter name: (names, epochs, learning rate) each."""
    names = {id(t): n for n, t in live_state(started.model).items()}
    return tuple((tuple(names[id(p)] for p in params), epochs, lr[0] if lr else None)
                 for params, epochs, *lr in started.phases)


class _CohortRun:
    """One stacked computation: the clients of ``members`` (same architecture and phases) through all phases."""

    def __init__(self, core: ClientJobs, members: list[tuple[int, StartedJob, dict[str, torch.Tensor]]],
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
        self.own = _stack_trees([{k: s.ctx.payload[k] for k in own_keys} for s in self.started]) if own_keys else {}
        if self.own is None:
            raise ValueError("a vectorised cohort needs its clients' own payloads (client_payload) to have one "
                             "structure")
        stacked_state = _stack_trees([s.ctx.state for s in self.started])
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

        The whole cohort computes on the stacked parameters themselves. A part of it computes on detached copies of
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
        state = {} if self.state_unstacked else _tree_map(pick, self.state)
        own = _tree_map(pick, self.own)
        y, sample_idx = self.y[rows], self.idx[rows]
        if x.shape[0] == 1:  # one client: its own step, without vmap
            args = [_tree_map(lambda t: t[0], v) for v in (params, buffers, x, y, sample_idx, own, state)]
            loss, parts = self._loss(*args)
            loss, parts = loss.unsqueeze(0), {name: v.unsqueeze(0) for name, v in parts.items()}
        else:
            with _OneClientOrder(), warnings.catch_warnings():
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
    def run(self) -> list[tuple[TrainResult, Optional[dict]]]:
        k, bs = self.k, self.cfg.train.batch_size
        everyone = torch.arange(k, device=self.device)
        loss_sum = torch.zeros(k, dtype=torch.float64, device=self.device)
        part_sums: dict[str, torch.Tensor] = {}
        seen = [0] * k
        stopped = [False] * k  # a client whose loss turned non-finite: out for the rest of its job
        epochs_done = [0] * k
        self.model.train()
        batches = [_batch_sizes(n, bs) for n in self.sizes]
        for names, epochs, lr in _phase_spec(self.started[0]):
            for n, p in self.params.items():
                p.requires_grad_(n in names)
            trained = [self.params[n] for n in names]
            opt = make_optimizer(self.cfg, trained, lr)
            for _ in range(epochs):
                rows = self._epoch_positions(stopped)
                steps = max((len(b) for b, s in zip(batches, stopped) if not s), default=0)
                for step in range(steps):
                    groups: dict[int, list[int]] = {}  # batch size -> clients with a batch of that size this step
                    for c in range(k):
                        if not stopped[c] and step < len(batches[c]):
                            groups.setdefault(batches[c][step], []).append(c)
                    total = None
                    picked: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
                    for size, members in groups.items():
                        index = None if len(members) == k else torch.tensor(members, device=self.device)
                        block = (rows if index is None else rows.index_select(0, index))[:, step * bs:step * bs + size]
                        loss, parts, params = self._group_loss(index, block)
                        if index is not None:
                            picked.append((index, params))
                        total = loss.sum() if total is None else total + loss.sum()
                        where = everyone if index is None else index
                        loss_sum.index_add_(0, where, loss.detach().double() * size)
                        for name, v in parts.items():
                            acc = part_sums.setdefault(name, torch.zeros(k, dtype=torch.float64, device=self.device))
                            acc.index_add_(0, where, v.detach().double() * size)
                        for c in members:
                            seen[c] += size
                    active = {c for members in groups.values() for c in members}
                    self._step(opt, trained, total, picked, [c for c in range(k) if c not in active])
                for c in range(k):
                    epochs_done[c] += not stopped[c]
                self.template = dataclasses.replace(self.template, epoch=self.template.epoch + 1)
                finite = torch.isfinite(loss_sum).tolist()  # one host sync an epoch, as one client alone
                stopped = [s or not f for s, f in zip(stopped, finite)]
        return self._finish(loss_sum, part_sums, seen, stopped, epochs_done)

    def _epoch_positions(self, stopped: list[bool]) -> torch.Tensor:
        """[clients, largest split] global sample positions: each client's own permutation for this epoch, drawn
        from its own generator as ``epoch_batches`` draws it (clients that stopped draw nothing)."""
        rows = torch.zeros(self.k, max(self.sizes), dtype=torch.int64)
        for c, s in enumerate(self.started):
            if not stopped[c]:
                rows[c, :self.sizes[c]] = torch.randperm(self.sizes[c], generator=s.gen) + self.offsets[c]
        return rows.to(self.device)

    def _step(self, opt: torch.optim.Optimizer, trained: list[torch.Tensor], total: Optional[torch.Tensor],
              picked: list[tuple[torch.Tensor, dict[str, torch.Tensor]]], sitting_out: list[int]) -> None:
        """One optimiser step on the stack; clients sitting this step out get their parameters and optimiser state
        back as they were (unless the optimiser leaves a row with a zero gradient as it is: plain SGD)."""
        opt.zero_grad(set_to_none=True)
        if total is None:
            return
        total.backward()
        self._scatter_grads(picked)
        if self.alg.clip_grad_norm is not None:
            _clip_per_client(trained, self.alg.clip_grad_norm, self.k)
        t = self.cfg.train
        if not sitting_out or (t.optimizer == "sgd" and t.momentum == 0 and t.weight_decay == 0):
            opt.step()  # plain SGD: p - lr * 0 is p, bit for bit
            return
        index = torch.tensor(sitting_out, device=self.device)
        keep = [(s, s.index_select(0, index)) for s in self._stacked_state(opt, trained)]
        opt.step()
        with torch.no_grad():
            for s, saved in keep:
                s.index_copy_(0, index, saved)

    def _stacked_state(self, opt: torch.optim.Optimizer, trained: list[torch.Tensor]) -> list[torch.Tensor]:
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


# ---------------------------------------------------------------------------------------------- engine.vectorize=auto
def per_client_bytes(core: ClientJobs, started: StartedJob) -> int:
    """What one more client adds to a cohort: its parameters and buffers with their gradients and optimiser
    state, its training split, and what the autograd graph of one of its batches saves (measured on a batch)."""
    model, ctx = started.model, started.ctx
    slots = 4 if core.cfg.train.optimizer == "adam" else 3  # value, gradient, momentum (Adam: two moments)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * slots
    x, y, idx = ctx.train_data
    data = x.numel() * x.element_size() + y.numel() * y.element_size() + idx.numel() * idx.element_size()
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.data_ptr()] = max(saved.get(t.data_ptr(), 0), t.numel() * t.element_size())
        return t

    bs = min(core.cfg.train.batch_size, len(y))
    if bs:
        model.train()
        ctx.sample_idx = idx[:bs]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            core.algorithm.client_loss(model, x[:bs], y[:bs], ctx)
        ctx.sample_idx = None
    return weights + data + sum(saved.values())


def memory_budget(core: ClientJobs) -> int:
    """Bytes a cohort's stacked training state may take in this worker (``engine.vectorize=auto``)."""
    if core.device.type != "cuda":
        return AUTO_MEMORY_BYTES
    total = torch.cuda.get_device_properties(core.device).total_memory
    share = min(1.0, core.cfg.engine.gpus_per_worker) or 1.0
    return int(AUTO_GPU_MEMORY_SHARE * total * share)


def _probe_clock(device: torch.device) -> Callable[[], float]:
    """The probe's clock: on a CPU this process's CPU time, which other processes on the machine do not inflate;
    on a GPU wall time after the device has finished its queued work."""
    if device.type != "cuda":
        return time.process_time

    def wall() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return wall


def choose_cohort_size(core: ClientJobs, jobs: list[TrainJob], shared: dict, owns: list[Optional[dict]],
                       states: list[Optional[dict]]) -> tuple[int, dict[str, float]]:
    """``engine.vectorize=auto``: the cohort size for the run (1: off), from a probe on the round's first clients.

    The size: at most :data:`AUTO_MAX_K` clients and as many as fit :func:`memory_budget` of stacked training
    state, then the round's clients split into that many equal cohorts (100 clients in cohorts of 128: one of 100;
    of 64: two of 50). It depends on the config alone, not on the number of workers; only the yes or no is timed.
    The probe times :data:`AUTO_SERIAL_JOBS` clients one at a time (the median) and, unless they are slow enough that
    the arithmetic dominates (:data:`AUTO_SLOW_JOB_S`), a cohort of that size (the faster of two tries), by
    :func:`_probe_clock`; cohorts are chosen when they are at least :data:`AUTO_MARGIN` times faster per client.
    Nothing the probe trains is kept. Returns (size, what it measured).
    """
    if not type(core.algorithm).vectorizes() or len(jobs) < 2:
        return 1, {}
    started = core.start(jobs[0], shared, owns[0], states[0])
    if model_refusal(started.model) is not None:
        return 1, {}
    each = per_client_bytes(core, started)
    largest = max(1, min(AUTO_MAX_K, memory_budget(core) // max(each, 1)))
    k = math.ceil(len(jobs) / math.ceil(len(jobs) / largest))
    info: dict[str, float] = {"bytes_per_client": float(each), "k": float(k)}
    if k < 2:
        return 1, info
    clock = _probe_clock(core.device)
    core.train(jobs[0], shared, owns[0], states[0])  # warm-up: first-use costs are not the client's
    alone = []
    for i in range(min(AUTO_SERIAL_JOBS, len(jobs))):
        start = clock()
        core.train(jobs[i], shared, owns[i], states[i])
        alone.append(clock() - start)
    info["serial_s"] = one = statistics.median(alone)
    if one > AUTO_SLOW_JOB_S:
        return 1, info
    train_cohort(core, jobs[:2], shared, owns[:2], states[:2])  # warm-up of the batched path
    tries = []
    for _ in range(2):
        start = clock()
        train_cohort(core, jobs[:k], shared, owns[:k], states[:k])
        tries.append((clock() - start) / k)
    info["cohort_s"] = stacked = min(tries)
    return (k if stacked * AUTO_MARGIN <= one else 1), info
