"""FedPAC (Xu, Tong & Huang, ICLR 2023): feature alignment to global class centroids + classifier collaboration.

"Personalized Federated Learning with Feature Alignment and Classifier Collaboration", ICLR 2023; the authors' code
is github.com/JianXu95/FedPAC (``methods/fedpac.py``: ``LocalUpdate_FedPAC``; ``running.py``:
``train_round_fedpac``; ``tools.py``: ``get_head_agg_weight``, ``protos_aggregation``; ``options.py``: defaults).

Client i, holding feature extractor f (the backbone) and classifier g_i (the head), each round:

1. receives the averaged backbone, the global class centroids c_k and its own combined head (per-client payload);
2. extracts its feature statistics on the model as received, before training (``statistics_extraction``):
   p_i(k) = n_ik / n_i, mu_ik = mean of f(x) over its class-k samples,
   h_i[k] = p_i(k) * mu_ik                                                            (a C x d matrix)
   v_i = ( sum_k p_i(k) E[ ||f(x)||^2 | y=k ] - sum_k p_i(k)^2 ||mu_ik||^2 ) / n_i    (a scalar)
3. trains the head for ``head_epochs`` epochs with the backbone frozen (CE), then the backbone for
   ``train.local_epochs`` epochs with the head frozen on
        CE(g_i(f(x)), y) + lam * MSE(f(x), c_y)
   where MSE is torch's mean over the batch and the d feature entries (``nn.MSELoss()``), and c_y falls back to
   the client's own pre-training class mean when no client reported class y last round (no term in round 1);
4. uploads backbone, head, post-training class means mu_ik and label counts n_ik (for the centroids), v_i, h_i.

Server, over the round's participants S (``train_round_fedpac``):
   backbone   = sum_j n_j f_j / sum_j n_j
   c_k        = sum_j n_jk mu_jk / sum_j n_jk          (classes nobody reported are absent)
   for every i in S, the combination weights solve the quadratic program on the simplex
        alpha_i = argmin_{alpha >= 0, sum alpha = 1}  alpha^T P_i alpha,
        P_i[j, l] = v_j [j = l] + <h_i - h_j, h_i - h_l>_F
   i.e. sum_j alpha_j^2 v_j + || sum_j alpha_j (h_i - h_j) ||_F^2 (variance of a mixture vs. bias to client i);
   weights below ``weight_eps`` are zeroed, and client i's new head is sum_j alpha_ij g_j / sum_j alpha_ij.
   The authors solve it with cvxpy; here scipy's SLSQP (``solve_simplex_qp``). As in the authors' code, a P_i
   with negative eigenvalues (rounding only: P_i is PSD by construction) keeps its eigenpairs >= 0.01, and a
   degenerate problem (nothing left, non-finite statistics, solver failure) leaves the client its own head.
Clients not sampled keep the head they had. Evaluation (``eval_setup``) uses what a client holds after the round:
the averaged backbone and its combined head (the authors' ``local_test`` at the start of the next round).

Defaults: lam = 1.0 (``options.py --lam``), one head epoch (``epoch_classifier = 1`` in ``methods/fedpac.py``),
weight_eps = 1e-3 (``get_head_agg_weight``), classifier collaboration on (``--agg_g 1``), the head phase at
learning rate 0.1 (``head_lr``; the body at ``train.lr``, the authors' 0.01). Left to ``train.*``: the authors'
SGD momentum 0.5 and weight decay 5e-4.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import (Algorithm, eval_features, ClientContext, ClientUpdate, TensorDict,
                                    split_state, weighted_average)
from raysim.algorithms.configs.fedpac import FedPACConfig
from raysim.models import BACKBONE_PREFIX, HEAD_PREFIX
from raysim.registry import register_algorithm

PRE_KEY = "_fedpac_pre"  # this job's pre-training statistics, kept in the job's private payload copy
EIG_FLOOR = 0.01  # tools.get_head_agg_weight: eigenvalues kept when P has negative ones


# ---------------------------------------------------------------------- the defining computations (pure)
def feature_statistics(feats: torch.Tensor, labels: torch.Tensor, num_classes: int) -> dict[str, torch.Tensor]:
    """A client's class statistics from its features [n, d] and labels [n] (``statistics_extraction``).

    Returns float64 ``counts`` [C] (n_k), ``means`` [C, d] (mu_k; zero rows for absent classes), ``h`` [C, d]
    (p_k mu_k) and the scalar ``v`` = (sum_k p_k E||f||^2_k - sum_k p_k^2 ||mu_k||^2) / n.
    """
    feats = feats.detach().to("cpu", torch.float64)  # on the CPU: CUDA's index_add_ sums in no fixed order
    labels = labels.detach().long().cpu()
    n, d = feats.shape
    counts = torch.zeros(num_classes, dtype=torch.float64, device=feats.device).index_add_(
        0, labels, torch.ones(n, dtype=torch.float64, device=feats.device))
    sums = torch.zeros(num_classes, d, dtype=torch.float64, device=feats.device).index_add_(0, labels, feats)
    sq = torch.zeros(num_classes, dtype=torch.float64, device=feats.device).index_add_(0, labels,
                                                                                        (feats * feats).sum(1))
    safe = counts.clamp(min=1)
    means = sums / safe[:, None]
    p = counts / max(n, 1)
    v = ((p * sq / safe).sum() - (p * p * (means * means).sum(1)).sum()) / max(n, 1)
    return {"counts": counts, "means": means, "h": p[:, None] * means, "v": v}


def class_centroids(means: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Global class centroids c_k = sum_j n_jk mu_jk / sum_j n_jk from means [m, C, d] and counts [m, C]
    (``protos_aggregation``); returns (centroids [C, d] float32, present [C] bool; absent rows are zero)."""
    means, counts = means.to(torch.float64), counts.to(torch.float64)
    total = counts.sum(0)
    cent = (counts[:, :, None] * means).sum(0) / total.clamp(min=1e-12)[:, None]
    present = total > 0
    return torch.where(present[:, None], cent, torch.zeros_like(cent)).float(), present


def qp_matrix(i: int, variances: np.ndarray, hs: np.ndarray) -> np.ndarray:
    """P_i = diag(v) + [<h_i - h_j, h_i - h_l>]_{j,l} for variances [m] and statistics hs [m, C, d]."""
    hs = np.asarray(hs, dtype=np.float64).reshape(len(hs), -1)
    diff = hs[i][None, :] - hs
    return np.diag(np.asarray(variances, dtype=np.float64)) + diff @ diff.T


def solve_simplex_qp(p: np.ndarray) -> Optional[np.ndarray]:
    """argmin alpha^T P alpha over the probability simplex (SLSQP from the uniform point); None if degenerate."""
    from scipy.optimize import minimize

    p = 0.5 * (np.asarray(p, dtype=np.float64) + np.asarray(p, dtype=np.float64).T)
    m = len(p)
    if not np.isfinite(p).all():
        return None
    evals, evecs = np.linalg.eigh(p)
    if evals.min() < 0:  # the authors' repair: keep the spectrum above 0.01
        keep = evals >= EIG_FLOOR
        if not keep.any():
            return None
        p = (evecs[:, keep] * evals[keep]) @ evecs[:, keep].T
    scale = float(np.abs(p).max())
    if scale <= 0:
        return None  # every mixture is optimal: nothing to choose, the client keeps its own head
    if m == 1:
        return np.ones(1)
    q = p / scale  # same minimiser, better conditioned
    res = minimize(lambda a: float(a @ q @ a), np.full(m, 1.0 / m), jac=lambda a: 2.0 * (q @ a), method="SLSQP",
                   bounds=[(0.0, 1.0)] * m,
                   constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones(m)}],
                   options={"ftol": 1e-14, "maxiter": 500})
    alpha = np.clip(res.x, 0.0, None)
    if not res.success or not np.isfinite(alpha).all() or alpha.sum() <= 0:
        return None
    return alpha / alpha.sum()


def head_combination_weights(variances, hs, eps: float = 1e-3) -> list[Optional[np.ndarray]]:
    """Per participant i, the QP's weights over all participants' heads with those below ``eps`` zeroed
    (``get_head_agg_weight``); None where the problem is degenerate (the client keeps its own head)."""
    out: list[Optional[np.ndarray]] = []
    for i in range(len(variances)):
        alpha = solve_simplex_qp(qp_matrix(i, variances, hs))
        if alpha is not None:
            alpha = np.where(alpha > eps, alpha, 0.0)
            alpha = alpha if alpha.sum() > 0 else None
        out.append(alpha)
    return out


def combine_heads(heads: list[TensorDict], alpha: np.ndarray) -> TensorDict:
    """sum_j alpha_j g_j / sum_j alpha_j (``agg_classifier_weighted_p``), float64 accumulation."""
    return weighted_average(heads, [float(a) for a in alpha])


# ---------------------------------------------------------------------- the algorithm
@register_algorithm("fedpac")
class FedPAC(Algorithm):
    """Extractor averaged and aligned to class centroids; each head a QP-weighted mix of the clients' heads."""

    Config = FedPACConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "backbone"

    # ------------------------------------------------------------------ driver side
    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        state["heads"] = {}  # client id -> its combined head (sent with its next download)
        return state

    def server_payload(self, server_state: dict, round: int) -> dict:
        payload = {"model": server_state["model"]}
        if "centroids" in server_state:
            payload["centroids"] = server_state["centroids"]
            payload["present"] = server_state["present"]
        return payload

    def client_payload(self, server_state: dict, client_id: int, round: int) -> Optional[dict]:
        head = server_state["heads"].get(int(client_id))
        return {"head": head} if head is not None else None

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        if not updates:
            return server_state
        server_state["model"] = weighted_average([u.upload["model"] for u in updates],
                                                 [float(u.num_samples) for u in updates])
        server_state["centroids"], server_state["present"] = class_centroids(
            torch.stack([u.upload["means"] for u in updates]), torch.stack([u.upload["counts"] for u in updates]))
        if self.config.combine_heads:
            heads = [u.upload["head"] for u in updates]
            alphas = head_combination_weights(np.array([float(u.upload["v"]) for u in updates]),
                                              torch.stack([u.upload["h"] for u in updates]).double().numpy(),
                                              self.config.weight_eps)
            own = []
            for i, (u, alpha) in enumerate(zip(updates, alphas)):
                if alpha is None:
                    server_state["heads"].pop(u.client_id, None)  # keeps its own (trained) head
                    own.append(1.0)
                else:
                    server_state["heads"][u.client_id] = combine_heads(heads, alpha)
                    own.append(float(alpha[i] / alpha.sum()))
            server_state["self_weight"] = float(np.mean(own))
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        """``fedpac/self_weight``: the mean weight a participant's combined head gives its own head."""
        return {"fedpac/self_weight": server_state["self_weight"]} if "self_weight" in server_state else {}

    # ------------------------------------------------------------------ client side
    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        if ctx.state:
            model.load_state_dict(ctx.state, strict=False)
        model.load_state_dict(ctx.payload["model"], strict=False)
        if ctx.payload.get("head") is not None:
            model.load_state_dict(ctx.payload["head"], strict=False)
        if ctx.round >= 1 and ctx.train_data is not None:
            x, y, _ = ctx.train_data  # statistics of the model as received, before training
            pre = feature_statistics(eval_features(model, x), y, ctx.num_classes)
            pre["own"] = pre["means"].to(ctx.device, torch.float32)  # alignment fallback, on the batches' device
            ctx.payload[PRE_KEY] = pre

    def local_phases(self, model: nn.Module, ctx: ClientContext) -> list[tuple]:
        """The classifier first at its own learning rate (extractor frozen), then the extractor at train.lr."""
        phases = [(list(model.head.parameters()), self.config.head_epochs, self.config.head_lr),
                  (list(model.backbone.parameters()), self.cfg.train.local_epochs, None)]
        return [phase for phase in phases if phase[1] > 0]

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feats = model.features(x)
        ce = F.cross_entropy(model.head(feats), y)
        if "centroids" not in ctx.payload or self.config.lam == 0:
            return ce, {"ce": ce}  # round 1: no centroids yet
        # in the head phase the backbone is frozen, so the term is a constant there (logged, no gradient): the
        # authors' CE-only head phase, with loss_align the round's mean alignment
        cent = ctx.payload["centroids"].to(feats)
        present = ctx.payload["present"].to(feats.device)
        own = ctx.payload[PRE_KEY]["own"]  # classes nobody reported: the client's own pre-training mean
        target = torch.where(present[y][:, None], cent[y], own[y]).detach()
        align = F.mse_loss(feats, target)
        return ce + self.config.lam * align, {"ce": ce, "align": align}

    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        x, y, _ = ctx.train_data
        post = feature_statistics(eval_features(model, x), y, ctx.num_classes)
        pre = ctx.payload[PRE_KEY]
        return {"model": split_state(model, lambda k: k.startswith(BACKBONE_PREFIX)),
                "head": split_state(model, lambda k: k.startswith(HEAD_PREFIX)),
                "means": post["means"].float().cpu(), "counts": post["counts"].float().cpu(),
                "v": pre["v"].float().cpu().reshape(1), "h": pre["h"].float().cpu()}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        return split_state(model, lambda k: k.startswith(HEAD_PREFIX))
