"""``engine.vectorize``: what may train in a stack, the stack size a run starts with, and ``auto``'s probe.

``auto`` measures one client at a time against a stack once, at the first round, within a memory budget,
and keeps stacks only where they are faster **and** give the one-at-a-time numbers bit for bit on the device at
hand (:func:`choose_stack_size`): ``auto`` must never change a number. A model whose stack can agree only within
float32 rounding (normalisation layers: :func:`rounding_only`) stays one at a time under ``auto``; an explicit
``engine.vectorize=N`` still stacks it. The choice is checkpointed and stands for the whole run.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import nn

from raysim.engine.stack import model_refusal, train_stack
from raysim.engine.jobs import JobCore, StartedJob, TrainJob
from raysim.trees import tensor_leaves

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm
    from raysim.config import ExperimentConfig
    from raysim.stages import StageSet

AUTO_MAX_K = 128  # engine.vectorize=auto: stacks of at most this many clients (a round's split evenly),
AUTO_MEMORY_BYTES = 1 << 30  # whose stacked training state fits this budget (per CPU worker; on a GPU, half of
# the worker's share of the device's memory: AUTO_GPU_MEMORY_SHARE x total x engine.gpus_per_worker),
AUTO_GPU_MEMORY_SHARE = 0.5
AUTO_SLOW_JOB_S = 0.25  # never for clients whose one-at-a-time update takes longer (the arithmetic dominates),
AUTO_MARGIN = 1.25  # and only when the probe measured stacks at least this much faster per client
AUTO_SERIAL_JOBS = 8  # clients the probe times one at a time
AUTO_PROBE_SHARE = 0.25  # the probe runs only where it trains at most this share of the run's client updates


def vectorize_setting(cfg: ExperimentConfig) -> int | str:
    """``engine.vectorize`` as ``"off"``, ``"auto"`` or a stack size N >= 2 (N = 1 is off)."""
    value = str(cfg.engine.vectorize)
    if value in ("off", "auto"):
        return value
    return int(value) if int(value) >= 2 else "off"


def probe_pays(cfg: ExperimentConfig) -> bool:
    """Whether ``auto``'s probe can repay itself: it trains about 3 + min(8, n) + 2·min(n, 128) client updates
    (:func:`choose_stack_size`) for a round of n clients, and is run only where that is at most
    :data:`AUTO_PROBE_SHARE` of the run's ``rounds`` × n updates (a 2-round test of 6 clients trains one at a time
    at once; 10 rounds of 100 clients probe)."""
    from raysim.engine.plan import cohort_size

    n = cohort_size(cfg.clients.num, cfg.clients.fraction)
    probe = 3 + min(AUTO_SERIAL_JOBS, n) + 2 * min(n, AUTO_MAX_K)
    return n >= 2 and probe <= AUTO_PROBE_SHARE * cfg.rounds * n


def run_stack_size(cfg: ExperimentConfig, algorithm: Algorithm, model: nn.Module,
                    stages: Optional[StageSet] = None) -> tuple[Optional[int], str]:
    """(the stack size a run starts with, why): 1 (one client at a time), N, or None (``auto``: a probe at the
    first round decides). A model that cannot be stacked is refused in one line when N is asked for, and left at 1
    by ``auto``; an algorithm without vectorisable hooks, or one architecture per client, runs one at a time (the
    config's notice says so for N: ``raysim.checks.vectorize_notices``); ``auto`` does not probe a run too short
    to repay the probe (:func:`probe_pays`)."""
    from raysim.errors import UserError
    from raysim.registry import get_model

    setting = vectorize_setting(cfg)
    if setting == "off":
        return 1, "engine.vectorize=off"
    refusal = stages.stack_refusal() if stages is not None else None  # a stage's (DP-SGD's per-sample clipping)
    if refusal is not None:
        return 1, refusal
    refusal = algorithm.refusal("stack", cfg)
    if refusal is not None:
        return 1, refusal
    if any(getattr(get_model(n), "per_client", False) for n in cfg.model.names()):
        return 1, "every client has its own architecture"
    reason = model_refusal(model) or (rounding_only(model) if setting == "auto" else None)
    if reason is not None:
        if setting == "auto":
            return 1, f"the model cannot be stacked bit for bit: {reason}"
        raise UserError(f"config key 'engine.vectorize': {reason}; set engine.vectorize=off")
    if setting == "auto" and not probe_pays(cfg):
        return 1, "the run is too short to repay the probe"
    return (None, "chosen by a probe in round 1") if setting == "auto" else (int(setting), "engine.vectorize")


def per_client_bytes(core: JobCore, started: StartedJob) -> int:
    """What one more client adds to a stack: its parameters and buffers with their gradients and optimiser
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


def memory_budget(core: JobCore) -> int:
    """Bytes a stack's training state may take in this worker (``engine.vectorize=auto``)."""
    if core.device.type != "cuda":
        return AUTO_MEMORY_BYTES
    total = torch.cuda.get_device_properties(core.device).total_memory
    share = min(1.0, core.cfg.engine.gpus_per_worker) or 1.0
    return int(AUTO_GPU_MEMORY_SHARE * total * share)


NORMALISATION = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)


def rounding_only(model: nn.Module) -> Optional[str]:
    """Why a stack of ``model`` can agree with one client at a time only within float32 rounding (None: it may be
    bit for bit): its normalisation layers reduce over a client's batch in another order when stacked."""
    norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, NORMALISATION)})
    return f"its {', '.join(norms)} layers agree with one client at a time only within float32 rounding" \
        if norms else None


def _same_bits(a: tuple, b: tuple) -> bool:
    """Whether two (TrainResult, kept state) pairs of one client hold the same loss, upload and state, bit for bit."""
    (ra, ka), (rb, kb) = a, b
    if ra.loss != rb.loss or ra.finite != rb.finite:
        return False
    for x, y in ((ra.upload, rb.upload), (ka or {}, kb or {})):
        fx, fy = list(tensor_leaves(x)), list(tensor_leaves(y))
        if [p for p, _ in fx] != [p for p, _ in fy]:
            return False
        if not all(u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v) for (_, u), (_, v) in zip(fx, fy)):
            return False
    return True


def _probe_clock(device: torch.device) -> Callable[[], float]:
    """The probe's clock: on a CPU this process's CPU time, which other processes on the machine do not inflate;
    on a GPU wall time after the device has finished its queued work."""
    if device.type != "cuda":
        return time.process_time

    def wall() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return wall


def choose_stack_size(core: JobCore, jobs: list[TrainJob], shared: dict, owns: list[Optional[dict]],
                       states: list[Optional[dict]]) -> tuple[int, dict[str, float]]:
    """``engine.vectorize=auto``: the stack size for the run (1: off), from a probe on the round's first clients.

    The size: at most :data:`AUTO_MAX_K` clients and as many as fit :func:`memory_budget` of stacked training
    state, then the round's clients split into that many equal stacks (100 clients in stacks of 128: one of 100;
    of 64: two of 50). It depends on the config alone, not on the number of workers; only the yes or no is timed.
    The probe times :data:`AUTO_SERIAL_JOBS` clients one at a time (the median) and, unless they are slow enough that
    the arithmetic dominates (:data:`AUTO_SLOW_JOB_S`), a stack of that size (the faster of two tries), by
    :func:`_probe_clock`; stacks are chosen when they are at least :data:`AUTO_MARGIN` times faster per client and
    the stack gave every client the probe trained alone its numbers bit for bit (``exact``). A model whose stack
    agrees only within rounding (:func:`rounding_only`) is never stacked by ``auto``. Nothing the probe trains is
    kept. Returns (size, what it measured).
    """
    if core.algorithm.refusal("stack", core.cfg) is not None or len(jobs) < 2:
        return 1, {}
    started = core.start(jobs[0], shared, owns[0], states[0])
    if model_refusal(started.model) is not None or rounding_only(started.model) is not None:
        return 1, {}
    each = per_client_bytes(core, started)
    largest = max(1, min(AUTO_MAX_K, memory_budget(core) // max(each, 1)))
    k = math.ceil(len(jobs) / math.ceil(len(jobs) / largest))
    info: dict[str, float] = {"bytes_per_client": float(each), "k": float(k)}
    if k < 2:
        return 1, info
    clock = _probe_clock(core.device)
    core.train(jobs[0], shared, owns[0], states[0])  # warm-up: first-use costs are not the client's
    alone, alone_out = [], []
    for i in range(min(AUTO_SERIAL_JOBS, len(jobs))):
        start = clock()
        alone_out.append(core.train(jobs[i], shared, owns[i], states[i]))
        alone.append(clock() - start)
    info["serial_s"] = one = statistics.median(alone)
    if one > AUTO_SLOW_JOB_S:
        return 1, info
    train_stack(core, jobs[:2], shared, owns[:2], states[:2])  # warm-up of the batched path
    tries = []
    for _ in range(2):
        start = clock()
        together = train_stack(core, jobs[:k], shared, owns[:k], states[:k])
        tries.append((clock() - start) / k)
    info["stack_s"] = stacked = min(tries)
    info["exact"] = float(all(_same_bits(a, b) for a, b in zip(alone_out, together)))
    return (k if info["exact"] and stacked * AUTO_MARGIN <= one else 1), info
