"""The empirical check of ε (Andrew et al., ICLR 2024): the ε of two Gaussians by hand, canaries that go through the
clip and the one sum before the noise, and whole runs where a negligible noise shows a large estimate and a real
noise one below the accountant's ε, with fixed-size and Poisson sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import read_rows, tiny_overrides
from scipy import integrate, optimize, stats

from raysim.algorithms.aggregation import UploadSum
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.privacy.audit import CanaryAudit, canary_direction, epsilon_two_gaussians

pytest.importorskip("dp_accounting")


def _gaussian_mechanism_epsilon(mu: float, delta: float) -> float:
    """Balle and Wang (2018), Theorem 8: the Gaussian mechanism whose outputs are N(0, 1) and N(mu, 1) is (ε, δ)-DP
    iff Φ(-ε/mu + mu/2) - e^ε Φ(-ε/mu - mu/2) <= δ; the smallest such ε by root finding."""
    def excess(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta
    return optimize.brentq(excess, 0.0, 100.0, xtol=1e-12)


def test_equal_deviations_give_the_gaussian_mechanism_s_epsilon():
    # means 0 and 1, deviation 1: the Gaussian mechanism at noise 1; δ = 1e-2 gives ε = 2.3178 (the authors' own
    # regression value for mu = std = d^-1/2, and the formula above)
    assert epsilon_two_gaussians(0.0, 1.0, 1.0, 1.0, 1e-2) == pytest.approx(_gaussian_mechanism_epsilon(1.0, 1e-2),
                                                                           abs=1e-7)
    assert epsilon_two_gaussians(0.0, 1.0, 1.0, 1.0, 1e-2) == pytest.approx(2.317789, abs=1e-5)
    # scale-free: cosines of a 2,000-dimensional model have deviation 2000^-1/2
    s = 2000 ** -0.5
    assert epsilon_two_gaussians(0.0, s, s, s, 1e-2) == pytest.approx(2.317789, abs=1e-5)
    assert epsilon_two_gaussians(0.0, 1.0, 0.0, 1.0, 1e-5) == 0.0  # the same distribution


def test_unequal_deviations_by_numerical_integration():
    # δ(ε) = max over both orders of ∫ max(0, p - e^ε q): the ε found makes it δ
    mu1, sd1, mu2, sd2, delta = 0.0, 1.0, 1.5, 1.7, 1e-3
    eps = epsilon_two_gaussians(mu1, sd1, mu2, sd2, delta)

    def hockey(p, q, e):
        f = lambda y: max(0.0, p.pdf(y) - math.exp(e) * q.pdf(y))  # noqa: E731
        return integrate.quad(f, -40, 40, points=[0.0, 1.5], limit=500, epsabs=1e-13)[0]

    a, b = stats.norm(mu1, sd1), stats.norm(mu2, sd2)
    assert max(hockey(a, b, eps), hockey(b, a, eps)) == pytest.approx(delta, rel=1e-4)
    assert max(hockey(a, b, eps * 0.99), hockey(b, a, eps * 0.99)) > delta


def test_canaries_go_through_the_clip_and_the_sum():
    cfg = load_config(overrides=["clients.num=10", "clients.fraction=0.5", "privacy.enabled=true",
                                 "privacy.noise_multiplier=1", "privacy.audit_canaries=3"], warn=False)
    audit = CanaryAudit(cfg, rate=1.0, delta=1e-3)  # every canary joins every round
    reference = {"w": torch.zeros(4, 5), "b": torch.ones(3)}
    total = UploadSum()
    audit.insert(total, reference, clip=0.5, rnd=1)
    assert total.clients == [-1, -2, -3] and total.weight == 3.0
    total._buffer()
    flat = total.total
    # each canary: its unit direction, made 10 clip norms long, clipped back to S = 0.5, counted clipped (-1/2)
    expected = sum(canary_direction(cfg.seed, i, 23) for i in range(3)) * 0.5
    assert torch.allclose(flat[:23], expected, atol=1e-6) and float(flat[23]) == -1.5


def _cfg(tmp_path, name, **extra):
    settings = dict(rounds=3, clients__num=12, clients__fraction=0.5, privacy__enabled="true", privacy__clip=0.5,
                    privacy__audit_canaries=500, log__tensorboard="false", log__progress="false",
                    log__dir=str(tmp_path / name))
    settings.update(extra)
    return load_config(overrides=tiny_overrides(tmp_path, **settings), warn=False)


def _run(tmp_path, name, **extra):
    run_experiment(_cfg(tmp_path, name, **extra))
    return read_rows(tmp_path / name)


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_a_negligible_noise_shows_a_large_estimate_and_a_real_one_stays_below_the_accountant(tmp_path, sampling):
    # half the clients and each canary with probability 1/2 a round, 500 canaries: z = 0.01 leaves each inserted
    # canary's direction in the model, its cosine two null deviations (1/√2778) from the never-inserted ones'. At
    # z = 0.7 the estimate stays below the accountant's ε: the final model shows a canary's summed uploads, a
    # Gaussian of mean shift q√T/z = 1.24, while the accountant bounds every round's release (Poisson: ε 8.1). The
    # estimate is not a bound: near z = 2 with Poisson sampling the two are close, and its own noise (about ±0.5
    # with 500 canaries) can cross it
    loud = _run(tmp_path, f"loud-{sampling}", privacy__noise_multiplier=0.01, privacy__sampling=sampling)
    quiet = _run(tmp_path, f"quiet-{sampling}", privacy__noise_multiplier=0.7, privacy__sampling=sampling)
    assert loud[-1]["audit/epsilon"] > 10 and loud[-1]["audit/cosine_mean"] > 2 * loud[-1]["audit/null_std"]
    assert quiet[-1]["audit/epsilon"] < quiet[-1]["epsilon"]
    assert all("audit/epsilon" in r for r in loud)  # eval.every 1: every round


def test_the_audit_resumes_and_repeats(tmp_path):
    from conftest import crash_after, strip_timing

    whole = _run(tmp_path, "whole", privacy__noise_multiplier=1.0, privacy__audit_canaries=20)
    cfg = _cfg(tmp_path, "part", privacy__noise_multiplier=1.0, privacy__audit_canaries=20)
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)  # round 3's estimate needs rounds 1-2's released delta, from the checkpoint
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(whole)
    assert np.isfinite(whole[-1]["audit/epsilon"])
