"""Attacks by a seeded set of malicious clients (``attack.*``).

The malicious set (:func:`malicious_clients`) is a function of (seed, clients.num, attack.fraction) alone, so it
is the same on any number of workers and after a resume. Attacks on the data (label flipping, the pixel-pattern
backdoor, the backdoor that ``scaling`` boosts, the distributed backdoor) change what a malicious client trains on,
where it trains (:func:`poison_train_data`, called by the attack stage's client part). Attacks on the upload change
the malicious clients' updates Δ = upload − global on the driver, before aggregation (:func:`poison_updates`): the
ones that need the honest clients' updates (ALIE, IPM, min-max, min-sum, Fang et al.'s, mimic) can only be applied
there. Each is also a function of the round's rows, an ``(n, d)`` tensor: ``honest`` is the honest clients' rows,
``rows`` every client's as trained.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Optional

import numpy as np
import torch

from raysim.robust.aggregators import exact_distances, krum_scores
from raysim.sections.robust import malicious_count

MALICIOUS_TAG = 982451653  # separates the malicious set's draw from every other draw of the seed
ATTACK_STREAM = 4  # job_seed's stream tag for an attack's own randomness (Gaussian updates, the poisoned samples)


def malicious_clients(seed: int, num: int, fraction: float) -> list[int]:
    """The malicious clients, sorted: round(fraction x num) of ``num`` clients drawn from the seed alone."""
    k = malicious_count(num, fraction)
    if k <= 0:
        return []
    rng = np.random.default_rng([seed, MALICIOUS_TAG])
    return sorted(int(c) for c in rng.choice(num, size=k, replace=False))


# ---------------------------------------------------------------------------------------------- data attacks
def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label flipping, every label y to C − 1 − y (Tolpegin, Truex, Gursoy, Liu, "Data Poisoning Attacks Against
    Federated Learning Systems", ESORICS 2020; the all-label form of Karimireddy et al. 2021's experiments)."""
    return (num_classes - 1) - y


def add_trigger(x: torch.Tensor, size: int, value: Optional[float] = None) -> torch.Tensor:
    """A copy of ``x`` (a batch) with the pixel pattern: a ``size`` x ``size`` square in the bottom-right corner of
    every channel (or the last ``size`` features of a flat input) set to ``value`` (default: the batch's largest
    value, the brightest pixel). The pattern of Gu et al.'s BadNets (2017), as Bagdasaryan et al. 2020 use it."""
    out = x.clone()
    value = float(x.max()) if value is None else value
    if out.dim() >= 3:
        out[..., -size:, -size:] = value
    else:
        out[..., -size:] = value
    return out


DBA_PARTS = 4  # Xie et al.'s global trigger: four local triggers, two bars across and two down


def dba_bars(size: int, gap: int) -> list[tuple[int, int]]:
    """The distributed backdoor's local triggers as (row, first column) of a ``size``-pixel horizontal bar each, from
    the image's top-left corner: part k at row (k // 2)(1 + gap), column (k mod 2)(size + gap) (Xie, Huang, Chen,
    Li, "DBA: Distributed Backdoor Attacks against Federated Learning", ICLR 2020; the authors' MNIST setting is
    size 4, gap 2). Their union is the global trigger."""
    return [((k // 2) * (1 + gap), (k % 2) * (size + gap)) for k in range(DBA_PARTS)]


def add_bars(x: torch.Tensor, bars: list[tuple[int, int]], size: int, value: Optional[float] = None) -> torch.Tensor:
    """A copy of the image batch ``x`` with each bar of ``bars`` set to ``value`` in every channel (default: the
    batch's largest value)."""
    out = x.clone()
    value = float(x.max()) if value is None else value
    for row, col in bars:
        out[..., row, col:col + size] = value
    return out


def poisoned_rows(n: int, share: float, gen: torch.Generator) -> torch.Tensor:
    """Which of a client's n training rows carry the trigger: round(share x n) of them (at least one), drawn from
    ``gen``, sorted."""
    k = max(1, min(n, int(np.floor(share * n + 0.5))))
    return torch.sort(torch.randperm(n, generator=gen)[:k]).values


def poison_train_data(name: str, x: torch.Tensor, y: torch.Tensor, num_classes: int, *, target: int, share: float,
                      trigger: int, gen: torch.Generator, bars: Optional[list[tuple[int, int]]] = None,
                      bar_size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A malicious client's training data under attack ``name``: labels flipped (``label_flip``), or a ``share`` of
    the rows given the trigger and the label ``target`` (``backdoor``, and ``scaling``, whose update is then
    boosted on the driver; ``dba``: the client's own local trigger, ``bars``)."""
    if name == "label_flip":
        return x, flip_labels(y, num_classes)
    rows = poisoned_rows(len(y), share, gen).to(x.device)
    x, y = x.clone(), y.clone()
    if name == "dba":
        assert bars is not None, "dba needs the client's local trigger"
        x[rows] = add_bars(x[rows], bars, bar_size, float(x.max()))
    else:
        x[rows] = add_trigger(x[rows], trigger, float(x.max()))
    y[rows] = target
    return x, y


# ---------------------------------------------------------------------------------------------- upload attacks
def sign_flip(delta: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Sign flipping: the client sends −scale·Δ (Li, Xu, Chen, Giannakis, Ling, "RSA: Byzantine-Robust Stochastic
    Aggregation Methods for Distributed Learning", AAAI 2019; scale 1 is Karimireddy et al. 2021's bit flip)."""
    return -scale * delta


def gaussian(d: int, sigma: float, gen: torch.Generator) -> torch.Tensor:
    """A Gaussian update, Δ ~ N(0, σ² I) (Blanchard et al. 2017's Gaussian Byzantine workers, σ = 200)."""
    return torch.randn(d, generator=gen, dtype=torch.float64) * sigma


def scaling(delta: torch.Tensor, boost: float) -> torch.Tensor:
    """Model replacement (Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To Backdoor Federated Learning", AISTATS
    2020): the backdoored update boosted by γ (:func:`scaling_boosts`)."""
    return boost * delta


def scaling_boosts(weights: torch.Tensor, bad: list[int], server_lr: float = 1.0) -> list[float]:
    """Each attacker's γ_i = W / (f w_i η) (W: the round's total weight, w_i: the attacker's, f attackers in the
    round, η the server's step), so that the round's weighted mean Σ w_i Δ_i / W, stepped by η, moves the model by
    the attackers' mean update: Bagdasaryan et al.'s γ = n / η for one attacker among n equal weights, shared by f
    colluders instead of applied f times over."""
    total, f = float(weights.sum()), len(bad)
    return [total / (f * float(weights[i]) * server_lr) for i in bad]


def alie_z(n: int, f: int, rule: str = "baruch") -> float:
    """ALIE's z (Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For Distributed Learning",
    NeurIPS 2019): s = ⌊n/2 + 1⌋ − f workers are needed for a majority; ``baruch``: the paper's
    z_max = Φ⁻¹((n − s) / n); ``karimireddy``: Φ⁻¹((n − f − s) / (n − f)), as Karimireddy et al.'s code
    (``epfml/byzantine-robust-optimizer``, ``ALittleIsEnoughAttack``) and FLPoison compute it. At n = 20, f = 4:
    0.385 and 0.157."""
    s = n // 2 + 1 - f
    p = (n - s) / n if rule == "baruch" else (n - f - s) / (n - f) if n > f else 0.0
    if not 0 < p < 1:
        return 0.0
    return NormalDist().inv_cdf(p)


def alie(honest: torch.Tensor, z: float) -> torch.Tensor:
    """ALIE: μ − z·σ, from the coordinate-wise mean and (population) std of the honest updates (rows)."""
    mu = honest.mean(dim=0)
    sigma = honest.std(dim=0, correction=0) if honest.shape[0] > 1 else torch.zeros_like(mu)
    return mu - z * sigma


def ipm(honest: torch.Tensor, epsilon: float = 0.1) -> torch.Tensor:
    """Inner-product manipulation (Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner
    Product Manipulation", UAI 2020): −ε times the honest updates' mean (ε = 0.1, the paper's value against Krum)."""
    return -epsilon * honest.mean(dim=0)


def _perturbation(honest: torch.Tensor, mu: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "sign":
        return torch.sign(mu)
    if kind == "std":
        return honest.std(dim=0) if honest.shape[0] > 1 else torch.zeros_like(mu)  # torch.std's sample std, as theirs
    norm = torch.linalg.vector_norm(mu)
    return mu / norm if float(norm) > 0 else torch.zeros_like(mu)


def min_max(honest: torch.Tensor, perturbation: str = "unit_vec", gamma_init: float = 10.0, tol: float = 1e-5,
            objective: str = "max") -> torch.Tensor:
    """Min-max (Shejwalkar, Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning Attacks and
    Defenses for Federated Learning", NDSS 2021; the authors' ``our_attack_dist``): the update μ − γ∇p, μ the
    honest mean and ∇p the ``perturbation`` (μ/‖μ‖, sign(μ) or the honest std), with the largest γ found by their
    halving search from ``gamma_init`` (to ``tol``) such that its largest squared distance to an honest update is
    at most the largest between two honest updates. ``objective="sum"``: min-sum, whose sum of squared distances
    to the honest updates is at most the largest such sum of an honest update. Knows no rule."""
    mu = honest.mean(dim=0)
    step_dir = _perturbation(honest, mu, perturbation)
    squared = exact_distances(honest).pow(2)
    bound = float(squared.max()) if objective == "max" else float(squared.sum(dim=1).max())

    def fits(candidate: torch.Tensor) -> bool:
        d2 = torch.linalg.vector_norm(honest - candidate, dim=1).pow(2)
        return float(d2.max() if objective == "max" else d2.sum()) <= bound

    gamma, step, found = gamma_init, gamma_init / 2, 0.0
    while abs(found - gamma) > tol:
        if fits(mu - gamma * step_dir):
            found = gamma
            gamma += step
        else:
            gamma -= step
        step /= 2
    return mu - found * step_dir


def min_sum(honest: torch.Tensor, perturbation: str = "unit_vec", gamma_init: float = 10.0,
            tol: float = 1e-5) -> torch.Tensor:
    """Min-sum (Shejwalkar, Houmansadr 2021): :func:`min_max` with the sum of squared distances."""
    return min_max(honest, perturbation, gamma_init, tol, objective="sum")


def fang_trim(rows: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fang, Cao, Jia, Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning" (USENIX
    Security 2020), the full-knowledge attack on the trimmed mean and the median, as the ``trim_attack`` of the
    FLTrust authors' code computes it from every client's update as trained (``rows``): s = sign(Σ_i Δ_i) per
    coordinate; where s > 0 the value goes below the smallest update w_min (w_min / r if w_min > 0, else w_min·r),
    where s < 0 above the largest w_max (w_max·r if w_max > 0, else w_max / r), r ~ U[1, 2) from ``gen`` (b = 2)."""
    s = torch.sign(rows.sum(dim=0))
    directed = torch.where(s > 0, rows.min(dim=0).values, torch.where(s < 0, rows.max(dim=0).values, 0.0))
    r = 1.0 + torch.rand(rows.shape[1], generator=gen, dtype=torch.float64)
    same, opposite = (s * directed > 0).to(rows.dtype), (s * directed < 0).to(rows.dtype)
    return directed * (same / r + opposite * r)


def fang_krum(rows: torch.Tensor, bad: list[int], tol: float = 1e-5) -> torch.Tensor:
    """Fang et al. 2020's full-knowledge attack on Krum: every malicious update is −λs (s = sign(Σ_i Δ_i), the
    global model w_Re is Δ = 0), λ from the paper's bound, 1/((n − 2c − 1)√d) min_i Σ_{l ∈ Γ_i} ‖Δ_l − Δ_i‖ +
    1/√d max_i ‖Δ_i‖ over the honest updates (Γ_i: the n − c − 2 honest updates nearest Δ_i, c attackers), halved
    until Krum (f = c) picks a malicious one or λ falls below ``tol``. The c − 1 others send the same update (the
    paper samples them within ε of it; FLPoison copies it, as here). With n ≤ 2c + 2 Krum cannot be checked and
    λ's bound is used as it is."""
    n, c, d = rows.shape[0], len(bad), rows.shape[1]
    honest = rows[[i for i in range(n) if i not in set(bad)]]
    h = honest.shape[0]
    s = torch.sign(rows.sum(dim=0))
    spread = float(torch.linalg.vector_norm(honest, dim=1).max()) / d ** 0.5
    if n - 2 * c - 1 > 0 and h - 2 >= 1:
        nearest = torch.sort(exact_distances(honest), dim=1).values[:, 1:h - 1]  # itself first, then n - c - 2
        lam = float(nearest.sum(dim=1).min()) / ((n - 2 * c - 1) * d ** 0.5) + spread
    else:
        lam = spread
    while n > 2 * c + 2:
        candidates = torch.cat([(-lam * s).expand(c, d), honest])
        if int(torch.argmin(krum_scores(candidates, c))) < c or lam < tol:
            break
        lam /= 2
    return -lam * s


def mimic_direction(honest: torch.Tensor, mu: Optional[torch.Tensor], z: torch.Tensor,
                    t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One warm-up step of mimic's direction (Karimireddy, He, Jaggi, ICLR 2022; ``MimicVariantAttacker`` in
    ``epfml/byzantine-robust-noniid-optimizer``): round t = 0 sets μ to the honest mean and z to one power step
    Σ_i ⟨h_i − μ, z⟩(h_i − μ) from the random z given, normalised; later rounds average μ and z over the rounds
    (weights t/(1 + t) and 1/(1 + t)). Returns (μ, z): z is the direction of the honest updates' largest variance."""
    mean = honest.mean(dim=0)
    mu = mean if t == 0 or mu is None else t / (1 + t) * mu + mean / (1 + t)
    centred = honest - mu
    step = ((centred @ z)[:, None] * centred).sum(dim=0)
    norm = torch.linalg.vector_norm(step)
    step = step / norm if float(norm) > 0 else z
    z = step if t == 0 else t / (1 + t) * z + step / (1 + t)
    norm = torch.linalg.vector_norm(z)
    return mu, (z / norm if float(norm) > 0 else z)


def mimic_target(honest: torch.Tensor, z: torch.Tensor) -> int:
    """The honest update the attackers copy: the one with the largest ⟨h_i, z⟩ (the first among equals)."""
    return int(torch.argmax(honest @ z))


def poison_updates(name: str, deltas: torch.Tensor, malicious: list[bool], *, scale: float = 1.0,
                   sigma: float = 200.0, z: Optional[float] = None, z_rule: str = "baruch", epsilon: float = 0.1,
                   boost: Optional[float] = None, server_lr: float = 1.0, weights: Optional[torch.Tensor] = None,
                   perturbation: str = "unit_vec", gamma_init: float = 10.0, mimic: Optional[int] = None,
                   gens: Optional[list[Optional[torch.Generator]]] = None) -> torch.Tensor:
    """The round's updates (rows, client-id order, float64) with the malicious rows replaced as attack ``name``
    makes them; ``malicious`` marks those rows. ``gens``: each row's generator (``gaussian``, ``fang_trim``);
    ``weights``: the round's (``scaling``; None: equal); ``mimic``: the honest row to copy (position among the
    honest rows). With no honest row, the attacks that need one leave the rows as they are."""
    bad = [i for i, m in enumerate(malicious) if m]
    if not bad or name not in ("sign_flip", "gaussian", "scaling", "alie", "ipm", "minmax", "minsum", "fang_krum",
                               "fang_trim", "mimic"):
        return deltas
    out = deltas.clone()
    n, f = deltas.shape[0], len(bad)
    honest_rows = [i for i, m in enumerate(malicious) if not m]
    honest = deltas[honest_rows] if honest_rows else torch.zeros_like(deltas[:1])
    if name == "alie":
        out[bad] = alie(honest, alie_z(n, f, z_rule) if z is None else z)
    elif name == "ipm":
        out[bad] = ipm(honest, epsilon)
    elif name in ("minmax", "minsum") and honest_rows:
        out[bad] = min_max(honest, perturbation, gamma_init, objective="max" if name == "minmax" else "sum")
    elif name == "fang_krum" and honest_rows:
        out[bad] = fang_krum(deltas, bad)
    elif name == "mimic" and honest_rows:
        out[bad] = honest[0 if mimic is None else mimic]
    elif name == "scaling":
        w = torch.ones(n, dtype=torch.float64) if weights is None else weights
        boosts = scaling_boosts(w, bad, server_lr) if boost is None else [boost] * f
        for i, gamma in zip(bad, boosts):
            out[i] = scaling(deltas[i], gamma)
    for i in bad:
        gen = gens[i] if gens is not None else None
        gen = gen if gen is not None else torch.Generator().manual_seed(i)
        if name == "sign_flip":
            out[i] = sign_flip(deltas[i], scale)
        elif name == "gaussian":
            out[i] = gaussian(deltas.shape[1], sigma, gen)
        elif name == "fang_trim":
            out[i] = fang_trim(deltas, gen)
    return out
