"""FedCDA (Wang, Xu, Li, Xu, Li & Zhang, ICLR 2024): FedAvg over cross-round local models chosen to diverge least.

Paper: H. Wang, H. Xu, Y. Li, Y. Xu, R. Li, T. Zhang, "FedCDA: Federated Learning with Cross-rounds
Divergence-aware Aggregation", ICLR 2024 (openreview.net/forum?id=nbPGqeH3lt). Clients train exactly as in FedAvg.
The server keeps each client's K most recent local models; since a client's local models of different rounds sit
in different local optima, it aggregates, per client, the cached model that keeps the selected models closest to
each other. Authors' code: none could be found here (no public repository by the authors is in the stored index
or the GitHub snapshots this session could reach); the selection below follows the paper's description, and the
defaults K, B and the warm-up length are NOT verified against the paper's tables or code (see below).

Objective in round t, over the round's clients S_t with caches M_i = {w_i^{t_1}, …, w_i^{t_K}} (newest first):

    choose s_i ∈ M_i  minimising  D(s) = Σ_{i<j ∈ S_t} ‖s_i − s_j‖²        (squared L2 over all float entries)
    w^{t+1} = Σ_{i∈S_t} n_i s_i / Σ n_i                                      (FedAvg's weights)

Exhaustive search costs K^|S_t|, so, as in the paper, the selection is approximate and runs in batches of B
clients (client-id order): starting from every client's newest model (= FedAvg's choice), each batch in turn gets
the exact minimiser of D over its K^B combinations with every other client fixed at its current choice (earlier
batches: their selection; later batches: their newest model). Each step can only lower D, so D(selected) ≤
D(newest). Ties keep the newer model. The first ``warmup_rounds`` rounds are plain FedAvg (the paper warms up
with FedAvg because early local models have not settled in local optima yet); models are cached from round 1 on.

Engine: the cache is the engine's per-client server history (``Algorithm.server_history`` = K,
``server_keep`` = the upload): K object-store references per client held by the driver, the models themselves in
the object store (spilled to disk past ``engine.state_memory_gb``) and in the checkpoint (``history/``), so
``--resume`` continues with the same caches. The selection and the averaging are server compute: they run in
``server_train`` on a worker (reserved CPU/GPU, re-run if the worker dies), which receives the round's clients'
caches as ``ctx.history``; ``server_aggregate`` does nothing on the driver.

Defaults (unverified, chosen here; override per experiment): K = ``memory_size`` = 3, B = ``client_batch`` = 5
(the FAPD settings sample 5 clients per round, so there the search is exact), ``warmup_rounds`` = 10.
Logged per round: ``cda/divergence_newest`` (D of the newest models), ``cda/divergence`` (D of the aggregated
ones; equal in warm-up), ``cda/older`` (clients whose aggregated model is not this round's).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientUpdate, ServerContext, weighted_average
from raysim.config import AlgorithmConfig, ExperimentConfig, is_whole, require
from raysim.registry import register_algorithm


@dataclass
class FedCDAConfig(AlgorithmConfig):
    name: str = "fedcda"
    memory_size: int = 3  # K: local models kept per client, this round's included (unverified)
    client_batch: int = 5  # B: clients searched jointly (K^B combinations) per step of the selection (unverified)
    warmup_rounds: int = 10  # rounds of plain FedAvg before the selection starts (unverified)

    def validate(self) -> None:
        for key, low in (("memory_size", 1), ("client_batch", 1), ("warmup_rounds", 0)):
            value = getattr(self, key)
            require(is_whole(value, low), f"algorithm.{key}", f"must be an integer >= {low}, got {value}")
        require(self.client_batch <= 12, "algorithm.client_batch",
                f"at most 12 (K^B combinations per step), got {self.client_batch}")


def squared_distances(models: Sequence[dict], device: Any = "cpu") -> np.ndarray:
    """[M, M] matrix of ‖a − b‖² between state dicts, summed over their floating-point entries (float64)."""
    m = len(models)
    dist = np.zeros((m, m), dtype=np.float64)
    keys = [k for k, v in models[0].items() if torch.is_tensor(v) and v.is_floating_point()]
    for i in range(m):
        for j in range(i + 1, m):
            total = torch.zeros((), dtype=torch.float64, device=device)
            for k in keys:
                total += (models[i][k].to(device, torch.float64) - models[j][k].to(device, torch.float64)).pow(2).sum()
            dist[i, j] = dist[j, i] = float(total)
    return dist


def total_divergence(dist: np.ndarray, choice: Sequence[int]) -> float:
    """D(s) = Σ_{i<j} dist[s_i, s_j]."""
    return float(sum(dist[a, b] for a, b in itertools.combinations(choice, 2)))


def select_models(dist: np.ndarray, candidates: Sequence[Sequence[int]], batch: int) -> list[int]:
    """FedCDA's batched selection: for each client (in order) the index of its chosen model.

    ``candidates[i]`` lists client i's models as indices into ``dist``, newest first. Start from the newest of every
    client; for each batch of ``batch`` consecutive clients, take the combination of their candidates with the least
    D(s), the other clients fixed at their current choice (ties: the first combination, i.e. newer models)."""
    choice = [c[0] for c in candidates]
    n = len(candidates)
    for start in range(0, n, batch):
        members = list(range(start, min(start + batch, n)))
        others = [choice[j] for j in range(n) if j < start or j >= start + batch]
        combos = np.array(list(itertools.product(*[candidates[i] for i in members])), dtype=np.int64)  # [C, b]
        outside = dist[:, others].sum(axis=1) if others else np.zeros(len(dist))  # divergence to fixed clients
        cost = outside[combos].sum(axis=1)
        for a, b in itertools.combinations(range(len(members)), 2):
            cost = cost + dist[combos[:, a], combos[:, b]]
        best = combos[int(np.argmin(cost))]
        for i, m in zip(members, best):
            choice[i] = int(m)
    return choice


@register_algorithm("fedcda")
class FedCDA(Algorithm):
    """Averages, per client, the cached recent local model that minimises total divergence."""

    Config = FedCDAConfig
    shared = "all"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self.server_history = self.config.memory_size  # the engine keeps each client's K newest uploads

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        return server_state  # selection and averaging run in server_train, on a worker

    def server_train(self, server_state: dict, updates: list[ClientUpdate], ctx: ServerContext) -> dict:
        weights = [u.num_samples for u in updates]
        # each client's cache, newest first; its newest is this round's upload
        caches = [list(reversed(ctx.history.get(u.client_id) or [u.upload])) for u in updates]
        models = [m for cache in caches for m in cache]
        offsets = np.cumsum([0] + [len(c) for c in caches])
        candidates = [list(range(offsets[i], offsets[i + 1])) for i in range(len(caches))]
        newest = [c[0] for c in candidates]
        dist = squared_distances(models, ctx.device)
        choice = newest if ctx.round <= self.config.warmup_rounds else \
            select_models(dist, candidates, self.config.client_batch)
        server_state["model"] = weighted_average([models[i] for i in choice], weights)
        server_state["cda"] = {"divergence_newest": total_divergence(dist, newest),
                               "divergence": total_divergence(dist, choice),
                               "older": float(sum(c != n for c, n in zip(choice, newest)))}
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        return {f"cda/{k}": float(v) for k, v in server_state.get("cda", {}).items()}
