"""Local training, once: the batch policy, the optimiser and the one loop every trainer in raysim runs.

Part of the algorithms' public surface (with ``raysim.algorithms.base``, ``aggregation`` and ``central``): the
engine trains clients with it, and an algorithm that trains something of its own (FedBABU's fine-tuning, FAPD's
offline teacher, FedPCL's stand-in backbones, SCAFFOLD's step count) uses the same pieces, so they share one batch
policy and one loop.

- :func:`batch_bounds`, :func:`epoch_batches`: one permutation per epoch, cut into batches; a trailing one-sample
  batch joins the one before (BatchNorm cannot train on one sample).
- :func:`make_optimizer`: ``train.optimizer`` at ``train.lr`` (or a phase's own rate), stepped by
  :class:`LocalOptimizer` (torch.optim's kernels without its ``Optimizer`` class).
- :func:`run_phases`: phases of epochs of steps. What a step is belongs to its :class:`Trainee`: one client's
  mini-batch (``raysim.engine.core``), a stack's step (``raysim.engine.stack``), or plain cross-entropy
  on a model (:class:`PlainTrainee`: the fine-tuning and the central classifiers).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """Batch [start, end) pairs; a trailing one-sample batch joins the one before (BatchNorm can't train on one)."""
    bounds = [(b, min(b + batch_size, n)) for b in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def epoch_batches(n: int, batch_size: int, generator: Optional[torch.Generator],
                  device: torch.device | str) -> Iterator[torch.Tensor]:
    """One epoch's mini-batches of sample positions: a permutation drawn from ``generator`` (None: torch's global
    generator), on ``device``, cut by :func:`batch_bounds`."""
    order = torch.randperm(n, generator=generator).to(device)
    for b, e in batch_bounds(n, batch_size):
        yield order[b:e]


class LocalOptimizer:
    """torch.optim's SGD or Adam step over one list of parameters, run by torch.optim's own functional kernels
    (``torch.optim.sgd.sgd``, ``torch.optim.adam.adam``: the code ``SGD.step`` and ``Adam.step`` call, with the
    same defaults, so the same bits) without ``torch.optim.Optimizer``'s machinery.

    Why: ``Optimizer.__init__`` and ``step`` import ``torch._dynamo`` (1.2-2.3 s of CPU per process here). Every
    process that trains a client would pay it: each Ray worker before it takes its first call, each Tune trial,
    and the first round of a run in process. ``state`` maps a parameter to its state as ``torch.optim`` keeps it
    (``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``), which stacked training reads."""

    def __init__(self, params: Iterable[torch.Tensor], *, kind: str, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if kind not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer {kind!r}")
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError(f"invalid optimizer settings lr={lr}, momentum={momentum}, weight_decay={weight_decay}")
        self.kind, self.lr, self.momentum, self.weight_decay = kind, lr, momentum, weight_decay
        self.betas, self.eps = betas, eps
        self.params: list[torch.Tensor] = list(params)
        self.state: dict[torch.Tensor, dict[str, Any]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One step over the parameters that have a gradient (as ``torch.optim`` skips those without)."""
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in params]
        if self.kind == "sgd":
            self._sgd(params, grads)
        else:
            self._adam(params, grads)

    def _sgd(self, params: list[torch.Tensor], grads: list) -> None:
        from torch.optim.sgd import sgd

        buffers = [self.state.get(p, {}).get("momentum_buffer") for p in params] if self.momentum else []
        sgd(params, grads, buffers, has_sparse_grad=any(g.is_sparse for g in grads), weight_decay=self.weight_decay,
            momentum=self.momentum, lr=self.lr, dampening=0.0, nesterov=False, maximize=False)
        if self.momentum:
            for p, buffer in zip(params, buffers):
                self.state.setdefault(p, {})["momentum_buffer"] = buffer

    def _adam(self, params: list[torch.Tensor], grads: list) -> None:
        from torch.optim.adam import adam
        from torch.optim.optimizer import _get_scalar_dtype

        for p in params:
            if not self.state.get(p):  # Adam's lazy state, as Adam._init_group makes it (step on the CPU)
                self.state[p] = {"step": torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu"),
                                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                 "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        state = [self.state[p] for p in params]
        adam(params, grads, [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state], [],
             [s["step"] for s in state], amsgrad=False, has_complex=any(torch.is_complex(p) for p in params),
             beta1=self.betas[0], beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay, eps=self.eps,
             maximize=False, capturable=False, differentiable=False, decoupled_weight_decay=False)


def make_optimizer(cfg: ExperimentConfig, params: list, lr: Optional[float] = None) -> LocalOptimizer:
    """``train.optimizer`` over ``params`` at ``lr`` (``train.lr`` when None): torch.optim's step, with its
    defaults (Adam's betas 0.9/0.999 and eps 1e-8; SGD without dampening or Nesterov)."""
    t = cfg.train
    lr = t.lr if lr is None else lr
    if t.optimizer == "adam":
        return LocalOptimizer(params, kind="adam", lr=lr, weight_decay=t.weight_decay)
    return LocalOptimizer(params, kind="sgd", lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)


def threads_for(cpus: float) -> int:
    """torch threads for a job that holds ``cpus`` CPUs (``engine.cpus_per_worker``)."""
    return max(1, int(math.floor(cpus)))


@contextlib.contextmanager
def torch_threads(cpus: float) -> Iterator[None]:
    """Run torch on as many threads as a worker gets (``engine.cpus_per_worker``), then restore the count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_for(cpus))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Trainee:
    """What :func:`run_phases` trains: it says what a phase optimises, what an epoch's steps are, each step's loss,
    how the optimiser's step is taken, and whether training goes on after an epoch."""

    def begin_phase(self, params: list, lr: Optional[float]) -> LocalOptimizer:
        raise NotImplementedError

    def steps(self) -> Iterable[Any]:
        """This epoch's steps (drawn when the epoch starts)."""
        raise NotImplementedError

    def loss(self, step: Any) -> Optional[torch.Tensor]:
        """The loss to differentiate at ``step`` (None: nothing trains at this step)."""
        raise NotImplementedError

    def apply(self, optimizer: LocalOptimizer, step: Any) -> None:
        """After the backward pass: the optimiser's step (clipping first, where the trainee clips)."""
        optimizer.step()

    def fits(self, step: Any) -> bool:
        """Whether ``step`` still fits the job's budget; False ends the training before it (``system.late=partial``:
        the local steps that fit before the deadline)."""
        return True

    def end_epoch(self) -> bool:
        """Bookkeeping after an epoch; False ends the training (a loss that is no longer finite)."""
        return True


def run_phases(phases: Iterable[tuple], trainee: Trainee) -> None:
    """The local-training loop: for each phase (parameters, epochs[, learning rate]) a fresh optimiser, then its
    epochs, each a sequence of steps of zeroed gradients, a loss, its backward pass and an optimiser step; it ends
    early at the first step that no longer :meth:`Trainee.fits`."""
    for params, epochs, *lr in phases:
        optimizer = trainee.begin_phase(params, lr[0] if lr else None)
        for _ in range(epochs):
            for step in trainee.steps():
                if not trainee.fits(step):
                    return
                loss = trainee.loss(step)
                optimizer.zero_grad(set_to_none=True)
                if loss is None:
                    continue
                loss.backward()
                trainee.apply(optimizer, step)
            if not trainee.end_epoch():
                return


class PlainTrainee(Trainee):
    """Cross-entropy on (x, y) in mini-batches by :func:`epoch_batches`, SGD at ``lr`` with ``momentum``: central
    training and fine-tuning."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, momentum: float,
                 generator: Optional[torch.Generator],
                 loss: Optional[Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = None):
        self.model, self.x, self.y = model, x, y
        self.batch_size, self.momentum, self.generator, self._loss = batch_size, momentum, generator, loss

    def begin_phase(self, params: list, lr: Optional[float]) -> LocalOptimizer:
        assert lr is not None, "a plain trainee's phase names its learning rate"
        return LocalOptimizer(params, kind="sgd", lr=lr, momentum=self.momentum)

    def steps(self) -> Iterable[torch.Tensor]:
        return epoch_batches(len(self.y), self.batch_size, self.generator, self.x.device)

    def loss(self, step: torch.Tensor) -> torch.Tensor:
        if self._loss is not None:
            return self._loss(self.model, self.x[step], self.y[step])
        return F.cross_entropy(self.model(self.x[step]), self.y[step])


def fit_classifier(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float, batch_size: int,
                   generator: Optional[torch.Generator], momentum: float = 0.9) -> None:
    """Every parameter of ``model`` trained on (x, y) with cross-entropy and SGD, in place, in the workers' batches
    (the offline teacher, FedPCL's stand-in backbones, FedBABU's fine-tuning; ``generator`` None: torch's global
    generator, which the caller seeds)."""
    params = list(model.parameters())
    model.train()
    with torch.enable_grad():
        run_phases([(params, epochs, lr)],
                   PlainTrainee(model, x, y, batch_size=batch_size, momentum=momentum, generator=generator))
