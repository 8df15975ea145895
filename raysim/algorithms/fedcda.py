"""FedCDA (Wang, Xu, Li, Xu, Li & Zhang, ICLR 2024): every client's model in the global mean is chosen among its
recent local models, to keep the chosen ones low in loss and close to each other.

Paper: H. Wang, H. Xu, Y. Li, Y. Xu, R. Li, T. Zhang, "FedCDA: Federated Learning with Cross-rounds
Divergence-aware Aggregation", ICLR 2024 (openreview.net/forum?id=nbPGqeH3lt). Clients train exactly as in FedAvg.
Since a client's local models of different rounds sit in different local optima, the server keeps each client's K
most recent local models and, for each client, aggregates the one that makes the selected set fit best.

**What was verified, and what was not** (issue 38). Only the paper's abstract and opening could be read here (the
stored copies of its text stop there; nothing outside can be reached), and no code by the authors was found in the
public code index (no repository named for FedCDA; no file that cites the paper as its authors'). So the method
section (its Eq. 8 and Algorithm 1) is NOT checked against the paper: what follows is the method as two independent
reproductions in the public code index read it; they agree with each other and with this file on the objective, the
uniform mean and the unseen clients:

  * the ``fedcda`` strategy of a ``fairfl`` package (``fairfl.strategies``; docstring "Wang et al., ICLR 2024
    (Algorithm 1, batch-greedy objective Eq 8)"): J = mean F_n + (L/2)·(mean ‖w_n‖² − ‖mean w_n‖²), the uniform
    mean over the clients that have a selection, B = 3 shuffled batches searched exhaustively, K = 3, L = 1,
    warm-up 50 rounds of sample-weighted FedAvg;
  * the ``FedCDAStrategy`` of an ``fl_baselines`` package (a Flower ``FedAvg`` subclass): the same J
    (``average_loss + (loss_weight / 2) * (average_norm_sq - mean_norm_sq)``) and the same uniform mean over every
    seen client's selection (it cuts the round's clients in sorted order into batches of ceil(|P_t|/B), and
    averages the selections uniformly in warm-up too).

Two others differ: a Mammoth-style ``models/fedcda.py`` (Kiwi689/DenoiseFL) minimises Σ α_n F_n − (L/2)‖Σ α_n w_n‖²
(the Σ α_n ‖w_n‖² term dropped), counts every client, the unseen ones at the initial model, and searches one client
at a time within a batch; a research script (``main.py`` with ``cal_num``, as read for issue 26) searches with
the unsquared Σ_tensors ‖s̄ − s_n‖ and no loss term, takes B as a batch size, and, passing its best value by value
in a recursive search, keeps the last combination it enumerates. "FedCDA" in raysim therefore means FedCDA as the
first two reproductions implement it.

Objective (Eq. 8 as those reproductions read it). With every client n that has taken part so far holding one
selected model s_n (N of them), its local loss F_n(s_n) and s̄ = (1/N) Σ_n s_n:

    J(s) = (1/N) Σ_n F_n(s_n)  +  (L/2) · (1/N) Σ_n ‖s_n − s̄‖²                (‖·‖²: over all float entries)

(the identity (1/N) Σ ‖s_n − s̄‖² = (1/N) Σ ‖s_n‖² − ‖s̄‖² is the form both reproductions compute), and the global
model is s̄. F_n(s) is the mean training loss over the last local epoch that produced s (DenoiseFL's reading of
Algorithm 1, line 7, "accumulate local loss in the last local epoch"; the other two use the training loss a client
reports, ``train_loss``); L (``smoothness``) is the smoothness constant of the bound, 1 in every
reproduction.

The open choices, each settled by the reproductions that agree:
  * **Uniform, not data-size, weights**: s̄ and J weigh every client alike, as ``fairfl`` (``stack(...).mean(0)``)
    and ``fl_baselines`` (``uniform_weight = 1.0 / len(selected_models)``) do; DenoiseFL offers both (its
    ``averaing`` flag). Warm-up rounds are sample-weighted FedAvg over the round's clients (``fairfl``'s
    ``weighted_mean(..., num_samples)``).
  * **Unseen clients are left out** of N and of s̄ until their first round: ``fairfl`` and ``fl_baselines`` hold
    selections only for clients that have reported (as does the research script's ``cal_num``); DenoiseFL alone
    counts them at the initial model.

Selection in round t (after warm-up), for the round's clients P_t only; everyone else keeps its selection:
  1. each participant starts at its newest model (this round's; FedAvg's choice);
  2. P_t is shuffled (seeded from (seed, round)) and cut into B near-equal random batches (B = ``num_batches``, a
     number of batches, as ``fairfl``'s ``array_split(order, B)``);
  3. batch by batch, the K^|batch| combinations of the batch's cached models are searched exhaustively for the
     least J, every other client fixed at its current selection (earlier batches: their new one; later batches:
     their newest). Each step can only lower J. Ties keep the newer models.
The first ``warmup_rounds`` rounds (null: a quarter of ``rounds``; ``fairfl`` and DenoiseFL use 50) are
plain FedAvg over the round's participants (sample-weighted), and each participant's selection is its newest model.

Where this file differs from both: while an earlier batch is searched, the round's later batches sit here at their
newest model; ``fairfl`` and ``fl_baselines`` leave them out of J (DenoiseFL holds them at their previous
selection), which can change what the earlier batches pick.

Engine: the cache is the engine's per-client server history (``server_history`` = K + 1: the K candidates plus
the standing selection, which is at most one upload older than the oldest candidate), as object-store references
held by the driver and checkpointed (``--resume`` continues with the same caches). The selection and the mean run
in ``server_train`` on a worker (reserved CPU/GPU, re-run if the worker dies); the server state holds, instead of
N models, the running sums of the selections (Σ s_n in float64, Σ ‖s_n‖², Σ F_n), N, and which upload each client
selected. Defaults: K = ``memory_size`` = 3, B = 3, L = 1, warm-up = rounds / 4.
Logged per round: ``cda/objective_newest`` (J with every participant at its newest model), ``cda/objective`` (J of
the selection), ``cda/older`` (participants whose selection is not this round's model), ``cda/clients`` (N).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import (Algorithm, ClientContext, ClientUpdate, ServerContext, TensorDict,
                                    split_state, weighted_average)
from raysim.algorithms.configs.fedcda import FedCDAConfig
from raysim.config import ExperimentConfig
from raysim.errors import UserError
from raysim.registry import register_algorithm

MAX_COMBINATIONS = 4096  # K^|batch| models searched per batch
_LOSS = "last_epoch_loss"  # ctx.scratch: (loss sum, samples) of the job's last local epoch


# ---------------------------------------------------------------------------------------------- the math
def _float_keys(model: TensorDict) -> list[str]:
    return [k for k, v in model.items() if torch.is_tensor(v) and v.is_floating_point()]


def dot(a: TensorDict, b: TensorDict, device: Any = "cpu") -> float:
    """<a, b> over the floating-point entries, in float64."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for k in _float_keys(a):
        total += (a[k].to(device, torch.float64) * b[k].to(device, torch.float64)).sum()
    return float(total)


@dataclass
class Selection:
    """Running sums over every client's selected model: what J and the uniform mean need, without N models."""

    total: TensorDict  # Σ_n s_n, float64
    sqnorm: float = 0.0  # Σ_n ‖s_n‖²
    loss: float = 0.0  # Σ_n F_n(s_n)
    count: int = 0  # N

    def add(self, model: TensorDict, loss: float, sign: int = 1) -> None:
        for k, v in model.items():
            self.total[k] = self.total[k] + sign * v.to(torch.float64) if k in self.total else v.to(torch.float64)
        self.sqnorm += sign * dot(model, model)
        self.loss += sign * loss
        self.count += sign

    def mean(self, like: TensorDict) -> TensorDict:
        """s̄ in the dtypes of ``like`` (integer entries rounded, as ``weighted_average``)."""
        out = {}
        for k, v in like.items():
            m = self.total[k] / self.count
            out[k] = m.to(v.dtype) if v.is_floating_point() else m.round().to(v.dtype)
        return out


def objective(count: int, loss_sum: float, sqnorm_sum: float, total_sqnorm: float, smoothness: float) -> float:
    """J = (1/N) Σ F_n + (L/2) · ((1/N) Σ ‖s_n‖² − ‖(1/N) Σ s_n‖²), the second term being (1/N) Σ ‖s_n − s̄‖²."""
    return loss_sum / count + smoothness / 2 * (sqnorm_sum / count - total_sqnorm / count ** 2)


def select_batch(candidates: Sequence[Sequence[int]], gram: np.ndarray, fixed_dot: np.ndarray, losses: np.ndarray,
                 fixed: tuple[float, float, float, int], smoothness: float) -> tuple[list[int], float]:
    """The combination of one batch's candidates (one list of model indices per client, newest first) with the
    least J, the rest fixed; returns (chosen indices, J). ``gram`` [M, M] holds <m_i, m_j> between candidate models,
    ``fixed_dot`` [M] <m_i, S_f> with the fixed clients' sum S_f, ``losses`` [M] F of each model, ``fixed`` =
    (Σ F, Σ ‖s‖², ‖S_f‖², count) of the fixed clients. Ties: the first combination (newer models)."""
    f_loss, f_sq, f_total_sq, f_count = fixed
    n = f_count + len(candidates)
    best, best_j = None, math.inf
    for combo in itertools.product(*candidates):
        idx = list(combo)
        total_sq = f_total_sq + 2 * fixed_dot[idx].sum() + gram[np.ix_(idx, idx)].sum()
        j = objective(n, f_loss + losses[idx].sum(), f_sq + gram[idx, idx].sum(), total_sq, smoothness)
        if j < best_j - 1e-12 * max(1.0, abs(best_j)) or best is None:
            best, best_j = idx, j
    return best, float(best_j)


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("fedcda")
class FedCDA(Algorithm):
    """The global model is the uniform mean of every client's selected recent local model (low loss, low divergence)."""

    Config = FedCDAConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "all"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        # K candidates, plus the standing selection (at most one upload older than the oldest candidate)
        self.server_history = self.config.memory_size + 1

    @property
    def warmup(self) -> int:
        w = self.config.warmup_rounds
        return self.cfg.rounds // 4 if w is None else w

    def check(self, cfg: ExperimentConfig, data: Any) -> None:
        super().check(cfg, data)
        per_round = max(1, int(math.floor(cfg.clients.fraction * cfg.clients.num + 0.5)))
        largest = math.ceil(per_round / min(self.config.num_batches, per_round))
        if self.config.memory_size ** largest > MAX_COMBINATIONS:
            raise UserError(f"config key 'algorithm.num_batches': {per_round} clients a round in "
                            f"{self.config.num_batches} batches search {self.config.memory_size}^{largest} "
                            f"combinations per batch (at most {MAX_COMBINATIONS}); raise num_batches or lower "
                            f"algorithm.memory_size")

    # ------------------------------------------------------------------ client side
    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = F.cross_entropy(model(x), y)
        if ctx.epoch == ctx.num_epochs - 1:  # F_n: the mean loss over the last local epoch (Algorithm 1, line 7)
            total, seen = ctx.scratch.get(_LOSS, (0.0, 0))
            ctx.scratch[_LOSS] = (total + float(loss.detach()) * len(y), seen + len(y))
        return loss, {}

    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        total, seen = ctx.scratch.get(_LOSS, (0.0, 0))
        return {"model": split_state(model, self.is_shared),
                "loss": torch.tensor(total / seen if seen else float("nan"), dtype=torch.float64)}

    # ------------------------------------------------------------------ server side
    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        state.update({"selection": None, "selected": {}, "cda": {}})
        return state

    def server_keep(self, update: ClientUpdate, round: int) -> Any:
        return {"model": update.upload["model"], "loss": float(update.upload["loss"]), "round": round}

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        return server_state  # selection and averaging run in server_train, on a worker

    def server_train(self, server_state: dict, updates: list[ClientUpdate], ctx: ServerContext) -> dict:
        sel: Optional[Selection] = server_state["selection"]
        sel = Selection(total={}) if sel is None else \
            Selection(**{**sel, "total": {k: v.cpu() for k, v in sel["total"].items()}})  # sums stay on the CPU
        chosen: dict[int, int] = server_state["selected"]
        history = {u.client_id: ctx.history.get(u.client_id) or [self.server_keep(u, ctx.round)] for u in updates}
        # 1. every participant at its newest model (this round's), its standing selection taken out
        for u in updates:
            kept = history[u.client_id]
            if u.client_id in chosen:
                old = next((h for h in kept if h["round"] == chosen[u.client_id]), None)
                if old is None:
                    raise RuntimeError(f"fedcda: client {u.client_id}'s selected model (round "
                                       f"{chosen[u.client_id]}) left the server's cache")
                sel.add(old["model"], old["loss"], sign=-1)
            sel.add(kept[-1]["model"], kept[-1]["loss"])
            chosen[u.client_id] = kept[-1]["round"]
        j_newest = objective(sel.count, sel.loss, sel.sqnorm, dot(sel.total, sel.total), self.config.smoothness)
        like = updates[0].upload["model"]
        if ctx.round <= self.warmup:
            server_state["model"] = weighted_average([u.upload["model"] for u in updates],
                                                     [float(u.num_samples) for u in updates])
            j = j_newest
        else:
            j = self._select(sel, chosen, updates, history, ctx)
            server_state["model"] = sel.mean(like)
        server_state["selection"] = {"total": sel.total, "sqnorm": sel.sqnorm, "loss": sel.loss, "count": sel.count}
        server_state["selected"] = chosen
        server_state["cda"] = {"objective_newest": j_newest, "objective": j, "clients": float(sel.count),
                               "older": float(sum(chosen[u.client_id] != ctx.round for u in updates))}
        return server_state

    def _select(self, sel: Selection, chosen: dict[int, int], updates: list[ClientUpdate], history: dict,
                ctx: ServerContext) -> float:
        """Steps 2-3: random batches of the round's clients, each searched exhaustively over its K^|batch|
        combinations, the rest fixed; updates ``sel`` and ``chosen`` in place; returns the final J."""
        k = self.config.memory_size
        cands = {c: list(reversed(h[-k:])) for c, h in history.items()}  # newest first
        clients = [u.client_id for u in updates]
        order = np.random.default_rng([ctx.seed, ctx.round]).permutation(clients).tolist()
        j = objective(sel.count, sel.loss, sel.sqnorm, dot(sel.total, sel.total), self.config.smoothness)
        for batch in np.array_split(np.asarray(order, dtype=np.int64), min(self.config.num_batches, len(order))):
            batch = [int(c) for c in batch]
            models = [h for c in batch for h in cands[c]]
            offsets = np.cumsum([0] + [len(cands[c]) for c in batch])
            candidates = [list(range(offsets[i], offsets[i + 1])) for i in range(len(batch))]
            current = {c: next(h for h in cands[c] if h["round"] == chosen[c]) for c in batch}
            for c in batch:  # the batch's current selections out: what stays is the fixed part
                sel.add(current[c]["model"], current[c]["loss"], sign=-1)
            gram = np.array([[dot(a["model"], b["model"], ctx.device) for b in models] for a in models])
            fixed_dot = np.array([dot(m["model"], sel.total, ctx.device) if sel.count else 0.0 for m in models])
            losses = np.array([m["loss"] for m in models])
            fixed = (sel.loss, sel.sqnorm, dot(sel.total, sel.total, ctx.device) if sel.count else 0.0, sel.count)
            best, j = select_batch(candidates, gram, fixed_dot, losses, fixed, self.config.smoothness)
            for c, m in zip(batch, best):
                sel.add(models[m]["model"], models[m]["loss"])
                chosen[c] = models[m]["round"]
        return j

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        return {f"cda/{k}": float(v) for k, v in server_state.get("cda", {}).items()}
