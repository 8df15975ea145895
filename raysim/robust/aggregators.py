"""Byzantine-robust aggregation rules, each a function of the round's updates as the rows of one ``(n, d)`` tensor
(float64, client-id order) that returns the aggregate ``(d,)``, and the pre-aggregation steps that map rows to rows
(nearest-neighbour mixing, bucketing). The rows are updates Δ_i = upload_i − global (``raysim.robust.rows``); the
rules that are translation-equivariant (median, trimmed mean, Krum, Bulyan) give the same model on raw weights too.
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
    Needs n ≥ 4f + 3 (the paper's bound; then β ≥ 3)."""
    n = x.shape[0]
    if not n >= 4 * f + 3:
        raise ValueError(f"bulyan needs n >= 4f + 3, got n={n}, f={f}")
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


def exact_distances(x: torch.Tensor) -> torch.Tensor:
    """The (n, n) Euclidean distances between the rows, each from its own difference (``torch.cdist``'s matrix-
    product shortcut would leave a row a little away from itself)."""
    return torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")


def geometric_median(x: torch.Tensor, weights: Optional[torch.Tensor] = None, *, nu: float = 1e-5, maxiter: int = 4,
                     ftol: float = 1e-6, start: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The geometric median by the smoothed Weiszfeld algorithm (Pillutla, Kakade, Harchaoui, "Robust Aggregation
    for Federated Learning", IEEE TSP 2022: RFA; the authors' code ``krishnap25/RFA``,
    ``ServerModel.geometric_median_update``). With α_i = w_i / Σ w (uniform when ``weights`` is None), from
    z = Σ α_i x_i (or ``start``), at most ``maxiter`` times β_i = α_i / max(ν, ‖z − x_i‖), z = Σ β_i x_i / Σ β_i,
    stopping early once the objective Σ α_i ‖z − x_i‖ changes by less than ``ftol`` × itself. The authors' defaults:
    ν = 1e-5, 4 iterations, ftol 1e-6, the clients' sample counts as weights."""
    n = x.shape[0]
    alpha = (torch.full((n,), 1.0 / n, dtype=x.dtype) if weights is None
             else weights.to(x.dtype) / weights.to(x.dtype).sum())
    z = (x * alpha[:, None]).sum(dim=0) if start is None else start.to(x.dtype).clone()
    objective = float((alpha * torch.linalg.vector_norm(x - z, dim=1)).sum())
    for _ in range(maxiter):
        beta = alpha / torch.linalg.vector_norm(x - z, dim=1).clamp_min(nu)
        z = (x * beta[:, None]).sum(dim=0) / beta.sum()
        previous, objective = objective, float((alpha * torch.linalg.vector_norm(x - z, dim=1)).sum())
        if abs(previous - objective) < ftol * objective:
            break
    return z


def nearest_neighbor_mixing(x: torch.Tensor, f: int) -> torch.Tensor:
    """Nearest-neighbour mixing, a pre-aggregation step (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan,
    "Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity", AISTATS 2023): every row replaced by
    the mean of its n − f nearest rows, itself included (ties: the lower index). Needs f < n."""
    n = x.shape[0]
    if not 0 <= f < n:
        raise ValueError(f"nearest-neighbour mixing needs 0 <= f < n, got n={n}, f={f}")
    nearest = torch.argsort(exact_distances(x), dim=1, stable=True)[:, :n - f]
    return x[nearest].mean(dim=1)


def bucketing(x: torch.Tensor, s: int, order: torch.Tensor) -> torch.Tensor:
    """Bucketing, a pre-aggregation step (Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous
    Datasets via Bucketing", ICLR 2022): the rows in the random ``order`` cut into buckets of s consecutive rows
    (the last one smaller when s does not divide n), each bucket replaced by its mean: ⌈n/s⌉ rows."""
    shuffled = x[order]
    return torch.stack([shuffled[b:b + s].mean(dim=0) for b in range(0, x.shape[0], s)])


def fltrust(x: torch.Tensor, server: torch.Tensor) -> torch.Tensor:
    """FLTrust (Cao, Fang, Liu, Gong, "FLTrust: Byzantine-robust Federated Learning via Trust Bootstrapping", NDSS
    2021; the authors' MXNet ``fltrust``): the server's own update g0, trained on its root dataset, scores each
    row by TS_i = ReLU(cos(x_i, g0)); each row is scaled to g0's norm, and the aggregate is
    Σ TS_i (‖g0‖ / ‖x_i‖) x_i / Σ TS_i (zero when no row is trusted; a zero row or a zero g0 scores 0). The
    authors' code adds 1e-9 to every denominator; here the formula is exact."""
    g0 = torch.linalg.vector_norm(server)
    norms = torch.linalg.vector_norm(x, dim=1)
    scored = (norms > 0) & (g0 > 0)
    cos = torch.where(scored, (x @ server.to(x.dtype)) / (norms * g0).clamp_min(torch.finfo(x.dtype).tiny), 0.0)
    trust = cos.clamp_min(0.0)
    if float(trust.sum()) == 0.0:
        return torch.zeros(x.shape[1], dtype=x.dtype)
    scale = torch.where(scored, g0 / norms.clamp_min(torch.finfo(x.dtype).tiny), 0.0)
    return (x * (trust * scale)[:, None]).sum(dim=0) / trust.sum()


def foolsgold_weights(history: torch.Tensor, kappa: float = 1.0) -> torch.Tensor:
    """FoolsGold's weight of each client (Fung, Yoon, Beschastnikh, "The Limitations of Federated Learning in Sybil
    Settings", RAID 2020, Algorithm 1; the authors' ``foolsgold`` in ``DistributedML/FoolsGold``) from the rows of
    their summed past updates: cs = the cosine similarities minus the identity; v_i = max_j cs_ij; pardoning
    cs_ij ← cs_ij v_i / v_j where v_i < v_j; α_i = 1 − max_j cs_ij clipped to [0, 1], divided by its largest value
    (1 becomes 0.99); α_i = κ(ln(α_i / (1 − α_i)) + 0.5) clipped to [0, 1]. All zero where every client has a
    perfect twin."""
    n = history.shape[0]
    norms = torch.linalg.vector_norm(history, dim=1).clamp_min(torch.finfo(history.dtype).tiny)
    unit = history / norms[:, None]
    cs = unit @ unit.T - torch.eye(n, dtype=history.dtype)
    v = cs.max(dim=1).values  # the diagonal's 0 counts: v_i >= 0
    pardon = (v[:, None] < v[None, :]) & ~torch.eye(n, dtype=torch.bool)
    cs = torch.where(pardon, cs * v[:, None] / v[None, :].clamp_min(torch.finfo(history.dtype).tiny), cs)
    alpha = (1.0 - cs.max(dim=1).values).clamp(0.0, 1.0)
    if float(alpha.max()) == 0.0:
        return alpha
    alpha = alpha / alpha.max()
    alpha = torch.where(alpha == 1.0, torch.full_like(alpha, 0.99), alpha)
    alpha = kappa * (torch.log(alpha / (1.0 - alpha)) + 0.5)  # ln 0 = -inf: clipped to 0 below
    return torch.nan_to_num(alpha, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)


def foolsgold(x: torch.Tensor, history: torch.Tensor, kappa: float = 1.0) -> torch.Tensor:
    """FoolsGold's aggregate of the round's rows: Σ α_i x_i / n with α from the clients' histories (the authors'
    ``aggregate_gradients`` divides by the number of clients, not by Σ α)."""
    alpha = foolsgold_weights(history, kappa)
    return (x * alpha[:, None]).sum(dim=0) / x.shape[0]


def aggregate(name: str, x: torch.Tensor, weights: torch.Tensor, *, f: int = 0, m: Optional[int] = None,
              bound: float = 5.0, tau: float = 10.0, iterations: int = 3,
              center: Optional[torch.Tensor] = None, nu: float = 1e-5, maxiter: int = 4,
              server: Optional[torch.Tensor] = None, history: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The rule ``name`` (``aggregator.name``) on the rows of ``x``; ``mean`` is the weighted mean. ``server``:
    FLTrust's own update; ``history``: FoolsGold's rows of the clients' summed updates."""
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
    if name == "geomed":
        return geometric_median(x, weights, nu=nu, maxiter=maxiter)
    if name == "fltrust":
        assert server is not None, "fltrust needs the server's update"
        return fltrust(x, server)
    if name == "foolsgold":
        assert history is not None, "foolsgold needs the clients' histories"
        return foolsgold(x, history)
    raise ValueError(f"unknown aggregator {name!r}")
