"""Attacks by a seeded set of malicious clients (``attack.*``).

The malicious set (:func:`malicious_clients`) is a function of (seed, clients.num, attack.fraction) alone, so it
is the same on any number of workers and after a resume. Attacks on the data (label flipping, the pixel-pattern
backdoor, and the backdoor that ``scaling`` boosts) change what a malicious client trains on, where it trains
(:func:`poison_train_data`, called by the client-job core). Attacks on the upload change the malicious clients'
updates Δ = upload − global on the driver, before aggregation (:func:`poison_updates`): the ones that need the
honest clients' statistics (ALIE, IPM) can only be applied there.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Optional

import numpy as np
import torch

from raysim.robust.config import malicious_count

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


def poisoned_rows(n: int, share: float, gen: torch.Generator) -> torch.Tensor:
    """Which of a client's n training rows carry the trigger: round(share x n) of them (at least one), drawn from
    ``gen``, sorted."""
    k = max(1, min(n, int(np.floor(share * n + 0.5))))
    return torch.sort(torch.randperm(n, generator=gen)[:k]).values


def poison_train_data(name: str, x: torch.Tensor, y: torch.Tensor, num_classes: int, *, target: int, share: float,
                      trigger: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A malicious client's training data under attack ``name``: labels flipped (``label_flip``), or a ``share`` of
    the rows given the trigger and the label ``target`` (``backdoor``, and ``scaling``, whose update is then
    boosted on the driver)."""
    if name == "label_flip":
        return x, flip_labels(y, num_classes)
    rows = poisoned_rows(len(y), share, gen).to(x.device)
    x, y = x.clone(), y.clone()
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
    2020): the backdoored update boosted by γ = n / η, so that the mean of n updates, stepped by η, becomes it."""
    return boost * delta


def alie_z(n: int, f: int) -> float:
    """Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For Distributed Learning" (NeurIPS
    2019): s = ⌊n/2 + 1⌋ − f workers are needed for a majority, and z_max = Φ⁻¹((n − s) / n)."""
    s = n // 2 + 1 - f
    p = (n - s) / n
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


def poison_updates(name: str, deltas: torch.Tensor, malicious: list[bool], *, scale: float = 1.0,
                   sigma: float = 200.0, z: Optional[float] = None, epsilon: float = 0.1,
                   boost: Optional[float] = None, server_lr: float = 1.0,
                   gens: Optional[list[Optional[torch.Generator]]] = None) -> torch.Tensor:
    """The round's updates (rows, client-id order, float64) with the malicious rows replaced as attack ``name``
    makes them; ``malicious`` marks those rows. ``gens``: each row's generator (``gaussian``)."""
    bad = [i for i, m in enumerate(malicious) if m]
    if not bad or name not in ("sign_flip", "gaussian", "scaling", "alie", "ipm"):
        return deltas
    out = deltas.clone()
    n, f = deltas.shape[0], len(bad)
    honest_rows = [i for i, m in enumerate(malicious) if not m]
    honest = deltas[honest_rows] if honest_rows else torch.zeros_like(deltas[:1])
    if name == "alie":
        out[bad] = alie(honest, alie_z(n, f) if z is None else z)
    elif name == "ipm":
        out[bad] = ipm(honest, epsilon)
    for i in bad:
        if name == "sign_flip":
            out[i] = sign_flip(deltas[i], scale)
        elif name == "gaussian":
            gen = gens[i] if gens is not None else None
            out[i] = gaussian(deltas.shape[1], sigma, gen if gen is not None else torch.Generator().manual_seed(i))
        elif name == "scaling":
            out[i] = scaling(deltas[i], n / server_lr if boost is None else boost)
    return out
