"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates correct every local step for the client's drift.

Paper: S. P. Karimireddy, S. Kale, M. Mohri, S. J. Reddi, S. U. Stich, A. T. Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", ICML 2020 (arXiv:1910.06378), Algorithm 1. The authors published no
code; the implementation followed is NIID-Bench's (github.com/Xtra-Computing/NIID-Bench ``experiments.py``
``train_net_scaffold`` and the ``alg == 'scaffold'`` loop: K counted as the local steps actually taken, the model
averaged by training samples, c ← c + Σ Δc_i / N), checked against FL-bench's (github.com/KarhouTam/FL-bench
``src/client/scaffold.py``: the correction added to the gradient before ``optimizer.step()``).

The server holds the model x and its control variate c; client i holds its own c_i (client state, kept by the
driver outside the workers: a killed worker loses nothing; zeros for every parameter before its first round, from
``init_client_state``). In round t client i
downloads (x, c) and takes K local steps from y_i = x with the corrected gradient

    y_i ← y_i − η_l · (g_i(y_i) − c_i + c)

**The correction as a loss term.** ``client_loss`` adds ⟨c − c_i, y − sg(y)⟩ (sg: stop-gradient, ``detach``) to the
cross-entropy. Its value is exactly 0, so the logged loss is the cross-entropy, and its gradient in y is exactly
c − c_i, so the gradient the optimiser steps with is g_i(y) + c − c_i: the corrected gradient, applied before the
step, with no hook between ``backward()`` and ``step()`` (FL-bench adds the same vector to ``param.grad``). With
plain SGD (``train.momentum: 0``, ``train.weight_decay: 0``) this is the paper's step exactly; with momentum or
weight decay the optimiser treats the corrected gradient as it would any gradient (as FL-bench's does). Only
parameters are corrected, never batch-norm running statistics.

After training, option II of Algorithm 1 (the default, ``algorithm.control: 2``):

    c_i⁺ = c_i − c + (x − y_i) / (K · η_l)        K: local steps taken, η_l: ``train.lr``

(K is the client's batches per epoch times the epochs it ran, ``ctx.epoch`` at upload: ``local_steps``)

or option I (``control: 1``): c_i⁺ = ∇f_i(x), the gradient of the mean cross-entropy over the client's whole
training split at the downloaded x (one extra pass, in train mode, before local training; the model is then
reloaded from the download, so running statistics are untouched). The client uploads y_i and Δc_i = c_i⁺ − c_i and
keeps c_i⁺. The server (``server_aggregate``):

    x ← x + η_g · (x̄ − x),   x̄ = Σ n_i y_i / Σ n_i          (NIID-Bench's weighting; the paper's mean is uniform:
                                                             ``algorithm.weighting=uniform``)
    c ← c + (1/N) Σ_{i∈S} Δc_i                               N = ``clients.num``, S the round's clients

(x's step is FedOpt's server SGD, ``momentum_step`` with no momentum: η_g = 1, the default, gives x̄ bit for bit.)
Batch-norm running statistics and integer buffers are averaged.

**Bytes.** Both directions carry a model and a control variate: ``bytes_down`` counts x and c (c is empty in round 1,
before any client reported), ``bytes_up`` counts y_i and Δc_i, about twice FedAvg's.

**Stacked clients** (``engine.vectorize``): the client hooks vectorise. ``client_loss`` reads only the batch, the
payload's c and the client's c_i (``ctx.state``, stacked per client in a stack; every client's has one structure,
since new clients start from zeros), and K is counted outside it, so a stack gives every client the numbers it gets
alone, bit for bit on an MLP (``tests/engine/test_stack.py``).

Defaults: ``control: 2`` (the paper: option II is cheaper and is what its experiments use), ``server_lr`` η_g = 1
(the paper's experiments and NIID-Bench; FL-bench's ``--global_lr 1.0``).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads, client_weight
from raysim.algorithms.base import ClientContext, ClientUpdate, RoundUpdates, TensorDict, split_state, weighted_average
from raysim.algorithms.configs.scaffold import SCAFFOLDConfig
from raysim.algorithms.fedopt import FedOpt, Moments, momentum_step
from raysim.algorithms.training import batch_bounds
from raysim.registry import register_algorithm


# ---------------------------------------------------------------------------------------------- the math
def correction_term(pairs, control: TensorDict, own: TensorDict) -> torch.Tensor:
    """Σ ⟨c − c_i, w − sg(w)⟩ over (name, live parameter) pairs: 0 in value, c − c_i in gradient. A name missing
    from a control variate counts as 0 (a client's first round, the server's before any report)."""
    total = None
    for name, w in pairs:
        diff = _get(control, name, w) - _get(own, name, w)
        term = ((w - w.detach()) * diff.detach()).sum()
        total = term if total is None else total + term
    if total is None:
        raise ValueError("correction_term: no parameters")
    return total


def option_two(c_own: torch.Tensor, c: torch.Tensor, x: torch.Tensor, y: torch.Tensor, steps: int,
               lr: float) -> torch.Tensor:
    """c_i⁺ = c_i − c + (x − y_i) / (K·η_l): the paper's option II for one tensor."""
    return c_own - c + (x - y) / (steps * lr)


def local_steps(ctx: ClientContext, batch_size: int) -> int:
    """K, the local steps the client took: its batches per epoch times the epochs it ran (``ctx.epoch`` after
    training, set by the one-client loop and by a stack alike; an epoch whose loss turned non-finite
    counts, as its steps were taken). Counted outside ``client_loss``, which a stack runs under ``vmap``."""
    assert ctx.train_data is not None  # a training job's context always has its split
    return len(batch_bounds(len(ctx.train_data[1]), batch_size)) * ctx.epoch


def _get(tree: TensorDict, name: str, like: torch.Tensor) -> torch.Tensor:
    value = tree.get(name)
    return torch.zeros_like(like) if value is None else value.to(like.device, like.dtype)


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("scaffold")
class SCAFFOLD(FedOpt):
    """Control variates (server c, client c_i) correct each local gradient by c − c_i; option II update."""

    Config = SCAFFOLDConfig
    # two statistics, each summed where the clients trained with its own weights: the models by training samples
    # (NIID-Bench's, the code followed, and FedAvg's, so the beyond/ tables compare like with like; the paper's
    # uniform mean is algorithm.weighting=uniform), the control variates' changes uniformly
    uploads = Uploads.stats(model="algorithm", delta_control="uniform")
    vectorizable = True  # engine.vectorize: its own client_setup and client_loss, declared here (not FedOpt's)

    # ------------------------------------------------------------------ server
    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        state["control"] = {}  # c: zero until the first clients report (then it has every parameter's key)
        return state

    def server_payload(self, server_state: dict, round: int) -> dict:
        if round < 0:  # evaluation predicts with x alone
            return {"model": server_state["model"]}
        return {"model": server_state["model"], "control": server_state["control"]}

    def server_step(self, x: torch.Tensor, average: torch.Tensor, moments: Moments) -> torch.Tensor:
        return momentum_step(x, average, None, self.config.server_lr, 0.0)

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        """x̄ and the mean control change, each its own statistic of the round's one sum (``updates.mean()``);
        c ← c + (|S|/N)·mean Δc, then FedOpt's step of x towards x̄."""
        if not updates:
            return server_state
        if isinstance(updates, RoundUpdates):
            mean = updates.mean()
        else:  # called directly with a list (a unit test)
            mean = weighted_average([u.upload for u in updates],
                                    [client_weight(u.num_samples, self.sum_weighting) for u in updates])
        scale = len(updates) / self.cfg.clients.num  # (1/N) Σ = (|S|/N) · mean
        control = server_state["control"]
        server_state["control"] = {k: _get(control, k, d) + scale * d for k, d in mean["delta_control"].items()}
        return self.server_aggregate_mean(mean["model"], server_state, round)  # FedOpt's step

    # ------------------------------------------------------------------ client
    def init_client_state(self, model: nn.Module, ctx: ClientContext) -> dict:
        """c_i = 0 for every parameter before the client's first round: the same numbers as no c_i at all, and every
        client's state has one structure, so a stack of new and returning clients can stack them."""
        return {"control": {name: torch.zeros_like(p) for name, p in model.named_parameters()}}

    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        model.load_state_dict(ctx.payload["model"])
        if self.config.control == 1 and ctx.round > 0:
            ctx.scratch["grad_at_x"] = self._full_gradient(model, ctx)
            model.load_state_dict(ctx.payload["model"])  # running statistics as downloaded

    def _full_gradient(self, model: nn.Module, ctx: ClientContext) -> TensorDict:
        """∇f_i(x): the gradient of the mean cross-entropy over the client's training split (option I)."""
        assert ctx.train_data is not None  # a training job's context always has its split
        x, y, _ = ctx.train_data
        n, bs = len(y), self.cfg.train.batch_size
        model.train()
        model.zero_grad(set_to_none=True)
        for start in range(0, n, bs):
            (F.cross_entropy(model(x[start:start + bs]), y[start:start + bs], reduction="sum") / n).backward()
        grads = {name: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                 for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return grads

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ce = F.cross_entropy(model(x), y)
        own = ctx.state.get("control", {})
        correction = correction_term(model.named_parameters(), ctx.payload.get("control", {}), own)
        return ce + correction, {}

    def _new_control(self, model: nn.Module, ctx: ClientContext) -> TensorDict:
        """c_i⁺ for every parameter (option I or II); c_i itself when no step was taken."""
        own, c, x = ctx.state.get("control", {}), ctx.payload.get("control", {}), ctx.payload["model"]
        steps, lr = local_steps(ctx, self.cfg.train.batch_size), self.cfg.train.lr
        out = {}
        for name, p in model.named_parameters():
            y = p.detach()
            if self.config.control == 1:
                out[name] = ctx.scratch["grad_at_x"][name]
            elif steps == 0:
                out[name] = _get(own, name, y)
            else:
                out[name] = option_two(_get(own, name, y), _get(c, name, y), x[name].to(y.device), y, steps, lr)
        return out

    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        new = self._new_control(model, ctx)
        ctx.scratch["control"] = new  # client_keep's, the same job
        own = ctx.state.get("control", {})
        return {"model": split_state(model, lambda k: True),
                "delta_control": {k: v - _get(own, k, v) for k, v in new.items()}}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        return {"control": ctx.scratch["control"]}

    def eval_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        model.load_state_dict(ctx.payload["model"])

