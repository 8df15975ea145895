"""FedNova (Wang et al., NeurIPS 2020): normalised averaging, so that clients taking more local steps do not pull
the global model towards their own objective.

Paper: J. Wang, Q. Liu, H. Liang, G. Joshi, H. V. Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020 (arXiv:2007.07481), Section 4 and Appendix. Authors' code:
github.com/JYWa/FedNova (``distoptim/FedNova.py``: the ``FedNova`` optimiser's ``step`` builds a_i step by step,
``average`` rescales and sums the clients' cumulative updates; ``train_LocalSGD.py``: the defaults).

Client i starts from the global model x, takes τ_i local steps (its batches times its epochs, or fewer when partial
work cuts it short: τ_i is counted step by step, never assumed) and ends at y_i. With p_i = n_i / Σ n (the round's
clients' training samples, the authors' ``ratio``) the server steps

    d_i = (x − y_i) / a_i               the client's update normalised by its a_i
    x ← x − τ_eff · Σ_i p_i d_i         τ_eff = Σ_i p_i a_i   (Σ_i p_i τ_i with a proximal term, as the code does)

where a_i is the authors' ``local_normalizing_vec``, built per step exactly as their optimiser builds it (ρ: the
client's SGD momentum ``train.momentum``, η: ``train.lr``, μ: ``algorithm.mu``):

    plain SGD:       a_i = τ_i                                         (the average of d_i is the mean step)
    momentum ρ:      a_i = Σ_{k=1..τ_i} (1 − ρ^k)/(1 − ρ) = [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)] / (1 − ρ)
    proximal μ:      a_i = Σ_{k=0..τ_i−1} (1 − ημ)^k = [1 − (1 − ημ)^τ_i] / (ημ)

so equal step counts give FedAvg's x̄ = Σ p_i y_i exactly in value (d_i·τ_eff = x − y_i when every a_i is the same).
Each client uploads d_i, a_i and τ_i (and its buffers, BatchNorm statistics, which are averaged as FedAvg does);
every one of them enters the server's step only through its p_i-weighted mean, so the uploads are summed where the
clients trained (``aggregation = "samples"``) and FedNova stays one sum, like FedAvg.

``algorithm.server_momentum`` is the authors' ``gmf`` (v ← gmf·v + τ_eff·Σ p_i d_i, x ← x − v; their default 0).
The proximal term (mu/2)·||w − x||² is FedProx's loss term (``raysim.algorithms.fedprox.proximal_term``): with
plain SGD it is the authors' step; with momentum the authors add μ(w − x) after the momentum buffer, raysim's loss
puts it inside (the a_i recursion is theirs either way). Only SGD (``train.optimizer: sgd``) is normalised: the
paper's a_i is SGD's. Defaults are the authors' (``train_LocalSGD.py``): mu 0, gmf 0, weights by samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, ClientContext, TensorDict, is_parameter, live_state
from raysim.algorithms.configs.fednova import FedNovaConfig
from raysim.algorithms.fedopt import momentum_step
from raysim.algorithms.fedprox import proximal_term
from raysim.config import ExperimentConfig
from raysim.registry import register_algorithm


def normalizing_vector(steps: int, momentum: float = 0.0, eta_mu: float = 0.0) -> float:
    """a_i after ``steps`` local steps, built per step as the authors' ``FedNova.step`` builds
    ``local_normalizing_vec``: with momentum ρ a counter c ← ρ·c + 1 is added each step; with η·μ ≠ 0 the sum decays
    by (1 − ημ) and gains 1; with neither it gains 1 (a_i = τ_i)."""
    total, counter = 0.0, 0.0
    for _ in range(steps):
        if momentum != 0:
            counter = counter * momentum + 1.0
            total += counter
        if eta_mu != 0:
            total = total * (1.0 - eta_mu) + 1.0
        if momentum == 0 and eta_mu == 0:
            total += 1.0
    return total


def nova_step(x: TensorDict, mean: dict, proximal: bool) -> tuple[TensorDict, TensorDict]:
    """(the new model before server momentum, the step v = τ_eff·Σ p_i d_i per parameter) from the current model
    ``x`` and the round's mean upload (``d``: Σ p_i d_i per parameter, ``buffers``: averaged buffers, ``a`` and
    ``tau``: Σ p_i a_i and Σ p_i τ_i)."""
    tau_eff = float(mean["tau"] if proximal else mean["a"])
    step = {k: tau_eff * d for k, d in mean["d"].items()}
    new = {k: (x[k] - step[k] if k in step else mean["buffers"][k]) for k in x}
    return new, step


@register_algorithm("fednova")
class FedNova(Algorithm):
    """Normalised averaging: each client's update divided by its a_i (τ_i local steps for plain SGD), the sum
    rescaled by τ_eff = Σ p_i a_i."""

    uploads = Uploads.mean()  # the normalised updates' weighted mean, which its own server step takes (not a model)

    Config = FedNovaConfig
    shared = "all"
    # engine.vectorize: off; τ_i is counted in client_loss, one call per step of one client

    def check(self, cfg: ExperimentConfig, data) -> None:
        super().check(cfg, data)
        from raysim.errors import UserError

        if cfg.train.optimizer != "sgd":
            raise UserError(f"config key 'train.optimizer': fednova normalises each update by SGD's a_i (the local "
                            f"steps, with momentum and mu as the paper derives them), got {cfg.train.optimizer}; "
                            f"use train.optimizer=sgd")

    # ------------------------------------------------------------------ server
    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        if self.config.server_momentum > 0:
            state["velocity"] = {k: torch.zeros_like(v) for k, v in state["model"].items() if is_parameter(k, v)}
        return state

    def server_aggregate_mean(self, mean: dict, server_state: dict, round: int) -> dict:
        """x ← x − τ_eff·Σ p_i d_i (with gmf > 0: v ← gmf·v + τ_eff·Σ p_i d_i, x ← x − v)."""
        x = server_state["model"]
        new, step = nova_step(x, mean, self.config.mu != 0)
        if self.config.server_momentum > 0:
            velocity = server_state["velocity"]
            new.update({k: momentum_step(x[k], x[k] - s, velocity[k], 1.0, self.config.server_momentum)
                        for k, s in step.items()})
        server_state["model"] = new
        return server_state

    # ------------------------------------------------------------------ client
    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ctx.scratch["steps"] = ctx.scratch.get("steps", 0) + 1  # τ_i: one call per local step
        ce = F.cross_entropy(model(x), y)
        if self.config.mu == 0:
            return ce, {}
        w_t = ctx.payload["model"]
        prox = proximal_term(((p, w_t[name]) for name, p in model.named_parameters()), self.config.mu)
        return ce + prox, {"ce": ce, "prox": prox}

    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        """d_i = (x − y_i)/a_i for every parameter, the buffers as they are, a_i and τ_i (float64 scalars)."""
        steps = int(ctx.scratch.get("steps", 0))
        t = self.cfg.train
        a = normalizing_vector(steps, t.momentum, t.lr * self.config.mu)
        x = ctx.payload["model"]
        d, buffers = {}, {}
        for key, value in live_state(model).items():
            y = value.detach()
            if is_parameter(key, y):
                d[key] = (x[key].to(y.device) - y) / a if a > 0 else torch.zeros_like(y)
            else:
                buffers[key] = y.clone()
        return {"d": d, "buffers": buffers, "a": torch.tensor(a, dtype=torch.float64),
                "tau": torch.tensor(float(steps), dtype=torch.float64)}
