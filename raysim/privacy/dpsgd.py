"""Sample-level DP-SGD on a client (Abadi et al. 2016): per-sample gradients of the algorithm's own
``client_loss`` by ``torch.func`` (``vmap(grad)``, one forward and backward for the whole batch), each clipped to
L2 norm C over the phase's parameters, summed, Gaussian noise N(0, σ² C²) added from the job's seeded generator,
divided by the batch size. The loop steps with that gradient through a surrogate loss whose gradient it is exactly
(``Σ (p · g).sum()``, see docs/hooks.md), so ``run_phases`` and the optimiser are unchanged.

``benchmarks/per_sample_grads.py`` compares these gradients with Opacus's (``GradSampleModule``) on speed and
equality (RESULTS.md). Each client's ε comes from Opacus's RDP accountant (:func:`client_epsilon`): every step
is accounted as a Poisson-subsampled Gaussian of rate B / n (the usual DP-SGD accounting of shuffled batches).
"""

from __future__ import annotations

from typing import Any, Callable

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


def clip_and_noise(grads: list[torch.Tensor], clip: float, noise: float, generator: torch.Generator) -> list:
    """Each sample's gradient clipped to L2 norm ``clip`` (over every parameter), summed, N(0, (noise·clip)²)
    added, divided by the batch size: DP-SGD's gradient."""
    batch = grads[0].shape[0]
    norms = torch.sqrt(sum(g.reshape(batch, -1).double().pow(2).sum(1) for g in grads))
    scale = (clip / (norms + 1e-12)).clamp(max=1.0).to(grads[0].dtype)
    out = []
    for g in grads:
        total = torch.einsum("b,b...->...", scale, g)
        total = total + torch.randn(total.shape, generator=generator, dtype=total.dtype).to(total.device) \
            * (noise * clip)
        out.append(total / batch)
    return out


def client_epsilon(noise: float, sample_rate: float, steps: int, delta: float) -> float:
    """A client's sample-level ε at ``delta`` after ``steps`` DP-SGD steps (Opacus's RDP accountant)."""
    if steps <= 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    acct = RDPAccountant()
    acct.history = [(float(noise), float(min(1.0, sample_rate)), int(steps))]
    return float(acct.get_epsilon(delta))
