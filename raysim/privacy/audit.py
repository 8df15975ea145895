"""The empirical check of DP-FedAvg's ε: one-shot privacy estimation with canary clients (Andrew, Kairouz, Oh, Oprea,
McMahan and Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024; the authors'
code: google-research/federated, ``one_shot_epe``).

``privacy.audit_canaries: k`` adds k canary clients to the population. Canary i's update is a fixed random direction
c_i, uniform on the unit sphere of the released model entries (drawn from (seed, i)), made large and clipped by the
same :func:`raysim.privacy.central.clip_delta` as every client's delta (so it arrives as S·c_i with its centred
count, as the authors scale theirs by 10⁴ before the clip). Each round each canary joins with the probability a
client has of being sampled (m / N with fixed-size sampling, q with Poisson sampling), drawn from (seed, round), and
its upload goes into the round's one sum before the noise, like a client's. k more directions are never inserted.

After every round the statistic of each canary is the cosine of its direction with the model delta released so
far: the sum of the rounds' noised mean deltas, which under FedAvg (whose server step sets the model to the
released mean) is the current model minus the initial one, the paper's final model delta. A Gaussian is fitted to
the cosines of the inserted canaries and one to those of the never-inserted ones, and ``audit/epsilon`` is the ε at
the accountant's δ that separates the two Gaussians (the ε of the pair of distributions, Steinke 2022: the
hockey-stick divergence of two normals, in closed form; :func:`epsilon_two_gaussians`). The authors compare the
inserted canaries with the null N(0, 1/d) of a direction independent of the model (their Theorem 3.2), which the
never-inserted canaries estimate here. It is an estimate, not a bound: it says what the released models show about
a client of the population, which the accountant's ε must not fall below.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch
from scipy import optimize, stats

from raysim.seeds import AUDIT_STREAM, job_seed

CANARY_SCALE = 10.0  # a canary's delta before the clip: this many clip norms long, so that it is always clipped


def canary_direction(seed: int, index: int, dim: int) -> torch.Tensor:
    """Canary ``index``'s direction: a float64 unit vector of ``dim`` entries, uniform on the sphere (a normalised
    standard normal draw from (seed, index)); indices from k on are the never-inserted ones. The cost of the audit is
    these draws: 2k of them when its estimate is due, and one for each canary that joins a round."""
    gen = torch.Generator().manual_seed(job_seed(seed, index, 0, AUDIT_STREAM))
    direction = torch.randn(dim, generator=gen).double()  # float32 draws: a quarter of float64's time
    return direction / torch.linalg.vector_norm(direction)


def canaries_joining(seed: int, rnd: int, count: int, rate: float) -> list[int]:
    """The canaries that join round ``rnd``: each independently with probability ``rate``, from (seed, round)."""
    rng = np.random.default_rng([seed, rnd, AUDIT_STREAM])
    return np.flatnonzero(rng.random(count) < rate).tolist()


def _log_delta(mu1: float, sd1: float, mu2: float, sd2: float, eps: float) -> float:
    """log of the hockey-stick divergence E_{e^ε}(P ‖ Q) = P(L > ε) - e^ε Q(L > ε), P = N(mu1, sd1²),
    Q = N(mu2, sd2²), L = log p/q: the region where L > ε is where a quadratic a y² + b y + c exceeds ε."""
    a = 0.5 * (sd2 ** -2 - sd1 ** -2)
    b = mu1 / sd1 ** 2 - mu2 / sd2 ** 2
    c = 0.5 * ((mu2 / sd2) ** 2 - (mu1 / sd1) ** 2) + math.log(sd2 / sd1)

    def mass(mu: float, sd: float) -> float:  # log P(a y² + b y + c > ε) for y ~ N(mu, sd²)
        if a == 0.0:
            if b == 0.0:
                return 0.0 if c > eps else -math.inf
            cut = (eps - c) / b
            return float(stats.norm.logsf(cut, mu, sd) if b > 0 else stats.norm.logcdf(cut, mu, sd))
        disc = b * b - 4 * a * (c - eps)
        if disc <= 0:  # never above ε (a < 0) or always (a > 0)
            return 0.0 if a > 0 else -math.inf
        half = -0.5 * (b + math.copysign(math.sqrt(disc), b))  # the roots without cancellation
        lo, hi = sorted((half / a, (c - eps) / half))
        if a > 0:  # above ε outside the roots
            return float(np.logaddexp(stats.norm.logcdf(lo, mu, sd), stats.norm.logsf(hi, mu, sd)))
        inside = stats.norm.cdf(hi, mu, sd) - stats.norm.cdf(lo, mu, sd)
        return math.log(inside) if inside > 0 else -math.inf

    p, q = mass(mu1, sd1), mass(mu2, sd2)
    if p == -math.inf or eps + q - p >= 0:
        return -math.inf
    return p + math.log1p(-math.exp(eps + q - p))


def epsilon_two_gaussians(mu1: float, sd1: float, mu2: float, sd2: float, delta: float) -> float:
    """The smallest ε ≥ 0 at which N(mu1, sd1²) and N(mu2, sd2²) are (ε, δ)-indistinguishable both ways: the ε of a
    mechanism whose outputs on two neighbouring inputs are these two distributions (for equal deviations, the
    Gaussian mechanism's ε at noise sd / |mu1 - mu2|, Balle and Wang 2018)."""
    log_delta = math.log(delta)

    def excess(eps: float) -> float:
        return max(_log_delta(mu1, sd1, mu2, sd2, eps), _log_delta(mu2, sd2, mu1, sd1, eps)) - log_delta

    if excess(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        lo, hi = hi, hi * 10
        if hi > 1e6:
            return math.inf
    return float(optimize.brentq(excess, lo, hi, xtol=1e-10))


class CanaryAudit:
    """The run's canaries (see the module docstring): inserted into each round's sum before the noise, then the
    ε estimate from the cosines with the released delta; the released delta is checkpointed."""

    def __init__(self, cfg: Any, rate: float, delta: float):
        self.cfg, self.rate, self.delta = cfg, float(rate), float(delta)
        self.count = int(cfg.privacy.audit_canaries)
        self.released: Optional[torch.Tensor] = None  # Σ of the rounds' released mean deltas, flat float64

    @staticmethod
    def _space(reference: dict) -> list[str]:
        """The entries a canary lives in: the released model's floating-point entries, in their order."""
        return [k for k, v in reference.items() if v.is_floating_point()]

    def insert(self, total: Any, reference: dict, clip: float, rnd: int) -> None:
        """Add round ``rnd``'s joining canaries to ``total`` (an UploadSum), each clipped like a client's delta."""
        from raysim.privacy.central import clip_delta

        keys = self._space(reference)
        sizes = [reference[k].numel() for k in keys]
        for i in canaries_joining(self.cfg.seed, rnd, self.count, self.rate):
            flat = canary_direction(self.cfg.seed, i, sum(sizes)) * (CANARY_SCALE * clip)
            delta = {k: part.view(reference[k].shape).to(reference[k].dtype)
                     for k, part in zip(keys, torch.split(flat, sizes))}
            total.add(-1 - i, clip_delta(delta, clip), 1.0)  # ids below 0: never a client's

    def add_release(self, mean_delta: dict, reference: dict) -> None:
        """Add a round's released mean delta (float64, the canaries' entries) to the released delta so far."""
        flat = torch.cat([mean_delta[k].detach().reshape(-1).double() for k in self._space(reference)])
        self.released = flat if self.released is None else self.released + flat

    def cosines(self) -> tuple[np.ndarray, np.ndarray]:
        """(the inserted canaries' cosines, the never-inserted ones') with the released delta."""
        assert self.released is not None
        norm = float(torch.linalg.vector_norm(self.released))
        dim = self.released.numel()
        values = [float(canary_direction(self.cfg.seed, i, dim) @ self.released) / norm if norm > 0 else 0.0
                  for i in range(2 * self.count)]
        return np.array(values[:self.count]), np.array(values[self.count:])

    def metrics(self) -> dict[str, Optional[float]]:
        """``audit/epsilon`` (the estimate at the accountant's δ), and the two fits' means and deviations."""
        if self.released is None:
            return {}
        seen, unseen = self.cosines()
        mu1, sd1 = float(seen.mean()), float(seen.std(ddof=1))
        mu0, sd0 = float(unseen.mean()), float(unseen.std(ddof=1))
        eps = epsilon_two_gaussians(mu0, sd0, mu1, sd1, self.delta) if sd0 > 0 and sd1 > 0 else math.inf
        return {"audit/epsilon": eps if math.isfinite(eps) else None,  # null: no finite ε separates them
                "audit/cosine_mean": mu1, "audit/cosine_std": sd1, "audit/null_mean": mu0, "audit/null_std": sd0}

    def state(self) -> Optional[torch.Tensor]:
        return self.released

    def load(self, released: Any) -> None:
        self.released = released.double() if isinstance(released, torch.Tensor) else None

