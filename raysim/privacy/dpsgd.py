"""Sample-level DP-SGD on a client (Abadi et al. 2016): per-sample gradients of the algorithm's own
``client_loss`` by ``torch.func`` (``vmap(grad)``, one forward and backward for the whole batch), each clipped to
L2 norm C over the phase's parameters, summed, Gaussian noise N(0, σ² C²) added from the job's seeded generator,
divided by the batch size. The loop steps with that gradient through a surrogate loss whose gradient it is exactly
(``Σ (p · g).sum()``, see docs/hooks.md), so ``run_phases`` and the optimiser are unchanged.

``benchmarks/per_sample_grads.py`` compares these gradients with Opacus's (``GradSampleModule``) on speed and
equality (RESULTS.md). The batches and their accounting (``privacy.dpsgd_sampling``):

- ``poisson`` (the default): Opacus's ``DPDataLoader`` (``UniformWithReplacementSampler``): an epoch is
  ceil(n / B) steps, each batch takes every sample independently with probability q = 1 / ceil(n / B), so its size
  varies (Binomial(n, q), possibly 0: a step of pure noise), and the noised sum is divided by the expected batch
  size int(n q), as Opacus's optimiser does (``make_private``'s ``expected_batch_size``). Each client's ε is
  Opacus's RDP accountant of its steps at (σ, q), add/remove-one sample (:func:`client_epsilon`).
- ``shuffle``: a permutation per epoch cut into batches of B (the one loop's batches), divided by the batch's
  size. Shuffling gives no amplification that an accountant may count here, so each epoch is accounted as one
  Gaussian mechanism: replacing one sample changes the one batch that holds it by at most 2C against noise σC,
  a noise multiplier σ / 2; E epochs compose to one of σ / (2 √E), whose exact ε is the analytic Gaussian
  mechanism's (Balle and Wang 2018; dp-accounting's ``get_epsilon_gaussian``), replace-one sample
  (:func:`shuffled_epsilon`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

DPSGD_STREAM = 38  # the noise's seed: job_seed(seed, client, round, DPSGD_STREAM)


class _LossOf(nn.Module):
    """The algorithm's loss as a module of the client's model, so ``functional_call`` swaps its parameters for the
    whole call (``client_loss`` may call any of the model's methods)."""

    def __init__(self, model: nn.Module, loss: Callable[..., Any]):
        super().__init__()
        self.inner, self.loss = model, loss

    def forward(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, ctx: Any) -> Any:
        ctx.sample_idx = idx[None]
        loss, parts = self.loss(self.inner, x[None], y[None], ctx)
        return loss, parts


def per_sample_grads(model: nn.Module, params: list[torch.Tensor], loss_fn: Callable[..., Any], x: torch.Tensor,
                     y: torch.Tensor, idx: torch.Tensor, ctx: Any) -> tuple[list[torch.Tensor], torch.Tensor, dict]:
    """(each parameter's per-sample gradients [B, *shape], the per-sample losses [B], the per-sample loss parts) of
    ``loss_fn(model, x_i, y_i, ctx)`` with respect to ``params`` (the phase's), by ``vmap(grad)``."""
    wrapper = _LossOf(model, loss_fn)
    names = {id(p): f"inner.{n}" for n, p in model.named_parameters()}
    trained = {names[id(p)]: p.detach() for p in params}
    frozen = {f"inner.{n}": t.detach() for n, t in model.named_parameters() if f"inner.{n}" not in trained}
    frozen.update({f"inner.{n}": b for n, b in model.named_buffers()})

    def one(theta: dict, xi: torch.Tensor, yi: torch.Tensor, ii: torch.Tensor) -> Any:
        return functional_call(wrapper, {**frozen, **theta}, (xi, yi, ii, ctx))

    grads, (losses, parts) = vmap(grad_and_value(one, has_aux=True), in_dims=(None, 0, 0, 0),
                                  randomness="different")(trained, x, y, idx)
    return [grads[names[id(p)]] for p in params], losses, parts


def clip_and_noise(grads: list[torch.Tensor], clip: float, noise: float, generator: torch.Generator,
                   denominator: Optional[float] = None) -> list:
    """Each sample's gradient clipped to L2 norm ``clip`` (over every parameter), summed, N(0, (noise·clip)²)
    added, divided by ``denominator`` (None: the batch size): DP-SGD's gradient. A batch of no samples gives the
    noise alone (Poisson sampling may draw none)."""
    batch = grads[0].shape[0]
    norms = torch.sqrt(sum((g.reshape(batch, -1) if batch else g.new_zeros(0, 1)).double().pow(2).sum(1)
                           for g in grads))
    scale = (clip / (norms + 1e-12)).clamp(max=1.0).to(grads[0].dtype)
    out = []
    for g in grads:
        total = torch.einsum("b,b...->...", scale, g)
        total = total + torch.randn(total.shape, generator=generator, dtype=total.dtype).to(total.device) \
            * (noise * clip)
        out.append(total / (batch if denominator is None else denominator))
    return out


def poisson_rate(n: int, batch_size: int) -> tuple[int, float, int]:
    """(steps an epoch, each sample's probability q, the expected batch size) of Opacus's ``DPDataLoader`` over
    ``n`` samples in batches of ``batch_size``: ceil(n / B) steps, q = 1 / ceil(n / B), int(n q)."""
    steps = max(1, math.ceil(n / batch_size))
    q = 1.0 / steps
    return steps, q, max(1, int(n * q))


def poisson_batches(n: int, batch_size: int, generator: torch.Generator, device: Any) -> Iterator[torch.Tensor]:
    """One epoch of Poisson batches: :func:`poisson_rate`'s steps, each the samples whose uniform draw is below q."""
    steps, q, _ = poisson_rate(n, batch_size)
    for _ in range(steps):
        yield torch.nonzero(torch.rand(n, generator=generator) < q).reshape(-1).to(device)


def client_epsilon(noise: float, sample_rate: float, steps: int, delta: float) -> float:
    """A client's sample-level ε at ``delta`` after ``steps`` Poisson-sampled DP-SGD steps of rate ``sample_rate``
    (Opacus's RDP accountant, add/remove-one sample)."""
    if steps <= 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    acct = RDPAccountant()
    acct.history = [(float(noise), float(min(1.0, sample_rate)), int(steps))]
    return float(acct.get_epsilon(delta))


def shuffled_epsilon(noise: float, epochs: int, delta: float) -> float:
    """A client's sample-level ε at ``delta`` after ``epochs`` epochs of shuffled fixed batches, without
    amplification: E Gaussian mechanisms of noise multiplier σ / 2 (replace-one), one of σ / (2 √E)."""
    if epochs <= 0:
        return 0.0
    import dp_accounting as dpa

    return float(dpa.get_epsilon_gaussian(noise / (2.0 * math.sqrt(epochs)), delta))
