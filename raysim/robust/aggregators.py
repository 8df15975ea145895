"""Byzantine-robust aggregation rules, each a function of the round's updates as the rows of one ``(n, d)`` tensor
(float64, client-id order) that returns the aggregate ``(d,)``. The rows are updates Δ_i = upload_i − global
(``raysim.robust.rows``); the rules that are translation-equivariant (median, trimmed mean, Krum, Bulyan) give the
same model on raw weights too.
"""

from __future__ import annotations

from typing import Optional

import torch

from raysim.algorithms.aggregation import UploadSum


def weighted_mean(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ w_i x_i / Σ w_i over the rows, by the engine's one sum (``UploadSum``: each row times its weight in
    float64, added in row order), so the mean of a round's rows is taken as FedAvg's mean of its uploads is."""
    total = UploadSum()
    for i in range(x.shape[0]):
        total.add(i, {"row": x[i]}, float(weights[i]))
    return total.mean(in_float64=True)["row"].to(x.dtype)


def median(x: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards
    Optimal Statistical Rates", ICML 2018): with an even n the mean of the two middle values (``torch.median``
    alone takes the lower one)."""
    n = x.shape[0]
    if n % 2:
        return torch.median(x, dim=0).values
    ordered = torch.sort(x, dim=0).values
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(x: torch.Tensor, f: int) -> torch.Tensor:
    """Coordinate-wise trimmed mean (Yin et al. 2018): in each coordinate the f largest and the f smallest values
    are removed and the remaining n − 2f averaged (β = f / n; needs 2f < n)."""
    n = x.shape[0]
    if not 2 * f < n:
        raise ValueError(f"trimmed_mean needs 2f < n, got n={n}, f={f}")
    ordered = torch.sort(x, dim=0).values
    return ordered[f:n - f].mean(dim=0)


def krum_scores(x: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score of each row (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries:
    Byzantine Tolerant Gradient Descent", NeurIPS 2017): the sum of its squared distances to its n − f − 2 nearest
    other rows."""
    n = x.shape[0]
    if not n > 2 * f + 2:
        raise ValueError(f"krum needs n > 2f + 2, got n={n}, f={f}")
    d2 = torch.cdist(x, x).pow(2)
    d2.fill_diagonal_(float("inf"))  # a row is not its own neighbour
    nearest = torch.topk(d2, n - f - 2, dim=1, largest=False).values
    return nearest.sum(dim=1)


def multikrum_select(x: torch.Tensor, f: int, m: int) -> torch.Tensor:
    """The indices of the m rows with the lowest Krum scores, best first (ties: the lower index)."""
    scores = krum_scores(x, f)
    order = torch.argsort(scores, stable=True)
    return order[:m]


def krum(x: torch.Tensor, f: int) -> torch.Tensor:
    """Krum: the one row with the lowest score."""
    return x[multikrum_select(x, f, 1)[0]].clone()


def multikrum(x: torch.Tensor, f: int, m: Optional[int] = None) -> torch.Tensor:
    """Multi-Krum (Blanchard et al. 2017): the mean of the m best-scored rows (m = n − f by default)."""
    m = x.shape[0] - f if m is None else m
    return x[multikrum_select(x, f, m)].mean(dim=0)


def bulyan(x: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan (El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed Learning in Byzantium",
    ICML 2018) over Krum: θ = n − 2f rows chosen by Krum one after another (each chosen row leaves the set before
    the next is scored), then in each coordinate the mean of the β = θ − 2f chosen values closest to their median.
    Needs n > 4f + 3."""
    n = x.shape[0]
    if not n > 4 * f + 3:
        raise ValueError(f"bulyan needs n > 4f + 3, got n={n}, f={f}")
    left = list(range(n))
    chosen = []
    for _ in range(n - 2 * f):
        if len(left) > 2 * f + 2:
            best = int(multikrum_select(x[left], f, 1)[0])
        else:  # too few rows left to score: Krum's choice among them is the closest to the others (f = 0 keeps all)
            best = int(torch.argsort(torch.cdist(x[left], x[left]).pow(2).sum(dim=1), stable=True)[0])
        chosen.append(left.pop(best))
    sel = x[chosen]  # θ rows
    beta = sel.shape[0] - 2 * f
    med = median(sel)
    distance = (sel - med).abs()
    # stable: among equal distances the earlier chosen row first
    closest = torch.argsort(distance, dim=0, stable=True)[:beta]
    return torch.gather(sel, 0, closest).mean(dim=0)


def norm_bound(x: torch.Tensor, weights: torch.Tensor, bound: float) -> torch.Tensor:
    """Norm bounding (Sun, Kairouz, Suresh, McMahan, "Can You Really Backdoor Federated Learning?", 2019): each
    update scaled to an L2 norm of at most M, Δ_i · min(1, M / ‖Δ_i‖), then the weighted mean Σ w_i Δ_i / Σ w_i."""
    norms = torch.linalg.vector_norm(x, dim=1)
    scale = torch.clamp(bound / norms.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)
    return weighted_mean(x * scale[:, None], weights)


def centered_clip(x: torch.Tensor, tau: float, iterations: int, center: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Centered clipping (Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust Optimization", ICML
    2021): from the centre v (the previous round's aggregate; zero at first), L times
    v ← v + (1/n) Σ_i (x_i − v) · min(1, τ / ‖x_i − v‖). L = 3 as the authors' code runs it
    (``Clipping(tau, n_iter=3)``); τ = 10 by default (their code reads it from a flag: scale it to the updates'
    norms)."""
    v = torch.zeros(x.shape[1], dtype=x.dtype) if center is None else center.to(x.dtype).clone()
    for _ in range(iterations):
        diff = x - v
        norms = torch.linalg.vector_norm(diff, dim=1)
        scale = torch.clamp(tau / norms.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)
        v = v + (diff * scale[:, None]).mean(dim=0)
    return v


def aggregate(name: str, x: torch.Tensor, weights: torch.Tensor, *, f: int = 0, m: Optional[int] = None,
              bound: float = 5.0, tau: float = 10.0, iterations: int = 3,
              center: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The rule ``name`` (``aggregator.name``) on the rows of ``x``; ``mean`` is the weighted mean."""
    if name == "mean":
        return weighted_mean(x, weights)
    if name == "median":
        return median(x)
    if name == "trimmed_mean":
        return trimmed_mean(x, f)
    if name == "krum":
        return krum(x, f)
    if name == "multikrum":
        return multikrum(x, f, m)
    if name == "bulyan":
        return bulyan(x, f)
    if name == "norm_bound":
        return norm_bound(x, weights, bound)
    if name == "centered_clip":
        return centered_clip(x, tau, iterations, center)
    raise ValueError(f"unknown aggregator {name!r}")
