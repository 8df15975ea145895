"""DP-FedAvg's accountant against dp-accounting called directly, one published figure (Abadi et al. 2016), the
calibration of a target ε, and the one-line refusals of an unreachable target and of a bad δ."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import refused_config, tiny_overrides

from raysim.config import load_config
from raysim.privacy import accounting

dpa = pytest.importorskip("dp_accounting")
from dp_accounting.pld import PLDAccountant  # noqa: E402
from dp_accounting.rdp import RdpAccountant  # noqa: E402


def _cfg(tmp_path, **extra):
    base = dict(clients__num=500, clients__fraction=0.04, rounds=20, privacy__enabled="true",
                privacy__noise_multiplier=1.5)
    base.update(extra)
    return load_config(overrides=tiny_overrides(tmp_path, **base), warn=False)


@pytest.mark.parametrize("sampling,kind", [("fixed", "rdp"), ("poisson", "rdp"), ("poisson", "pld")])
def test_epsilon_equals_dp_accounting_called_directly(tmp_path, sampling, kind):
    cfg = _cfg(tmp_path, privacy__sampling=sampling, privacy__accountant=kind)
    z, rounds, delta = 1.5, 20, 0.01 / 500  # privacy.delta null: 0.01 / N
    assert accounting.delta_of(cfg) == delta
    if sampling == "fixed":  # 20 of 500 without replacement; replace-one moves the clipped sum by 2S: z / 2
        event = dpa.SampledWithoutReplacementDpEvent(500, 20, dpa.GaussianDpEvent(z / 2))
        acct = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    else:
        event = dpa.PoissonSampledDpEvent(0.04, dpa.GaussianDpEvent(z))
        acct = RdpAccountant() if kind == "rdp" else PLDAccountant()
    direct = acct.compose(dpa.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)
    assert accounting.epsilon(cfg, z, rounds) == pytest.approx(direct, rel=1e-12)
    per_round = accounting.RoundAccountant(cfg, z)  # what the driver logs every round
    assert [per_round.after(r) for r in (rounds // 2, rounds)][-1] == pytest.approx(direct, rel=1e-9)


def test_abadi_et_al_2016_moments_accountant_figure():
    """Abadi et al. 2016, Section 3.1: q = 0.01, σ = 4, δ = 1e-5, T = 10,000 steps give ε ≈ 1.26 with the moments
    accountant (integer moments up to 32, ε = min_λ (α(λ) + log(1/δ)) / λ). dp-accounting's RDP of the same
    Poisson-subsampled Gaussian, converted that way, gives 1.26; its own, tighter conversion (what raysim logs)
    gives less."""
    cfg = load_config(overrides=["clients.num=10000", "clients.fraction=0.01", "rounds=10000",
                                 "privacy.enabled=true", "privacy.noise_multiplier=4", "privacy.sampling=poisson",
                                 "privacy.delta=1e-5"], warn=False)
    orders = list(range(2, 33))
    acct = RdpAccountant(orders=orders).compose(dpa.SelfComposedDpEvent(accounting.round_event(cfg, 4.0), 10000))
    classical = min(np.asarray(acct._rdp) + math.log(1e5) / (np.asarray(orders) - 1))
    assert round(classical, 2) == 1.26
    assert accounting.epsilon(cfg, 4.0, 10000) < 1.26


def test_target_epsilon_calibrates_the_noise(tmp_path):
    cfg = _cfg(tmp_path, privacy__sampling="poisson", privacy__noise_multiplier="null", privacy__target_epsilon=2.0)
    z = accounting.calibrate(cfg)
    eps = accounting.epsilon(cfg, z, cfg.rounds)
    assert eps <= 2.0 and eps == pytest.approx(2.0, rel=1e-3)
    assert accounting.epsilon(cfg, z * 0.99, cfg.rounds) > 2.0  # the smallest noise that meets it


def test_an_unreachable_target_is_one_line(tmp_path):
    # every client every round (q = 1) for 20 rounds: ε = 1e-8 needs noise far beyond any z the search tries
    refused_config("privacy.target_epsilon", *tiny_overrides(tmp_path, rounds=20, privacy__enabled="true",
                                                             privacy__sampling="poisson", privacy__delta=1e-6,
                                                             privacy__target_epsilon=1e-8))


def test_bad_delta_and_pld_with_fixed_sampling_are_one_line(tmp_path):
    refused_config("privacy.delta", *tiny_overrides(tmp_path, privacy__enabled="true",
                                                    privacy__noise_multiplier=1, privacy__delta=0))
    refused_config("privacy.accountant", *tiny_overrides(tmp_path, privacy__enabled="true",
                                                         privacy__noise_multiplier=1, privacy__accountant="pld"))


@pytest.mark.parametrize("target,best", [(1.0, 17.0), (8.0, 4.0)])
def test_calibration_over_the_cheap_orders_finds_the_smallest_z(tmp_path, target, best):
    """The shipped setting (500 clients, 100 a round without replacement, 30 rounds, δ = 0.01/500): the search
    runs over the RDP orders up to 12 and checks the best order over all of them at the z it found. At ε = 8 that
    order is 4, among the cheap ones; at ε = 1 the first z found has 19, so the search runs again over the orders
    up to 38, whose z has 17."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    cfg = _cfg(tmp_path, clients__fraction=0.2, rounds=30, privacy__noise_multiplier="null",
               privacy__target_epsilon=target)
    z, (orders, rdp) = accounting.calibrated(cfg)
    spent, order = compute_epsilon(orders, 30 * rdp, 0.01 / 500)
    assert order == best and spent == pytest.approx(accounting.epsilon(cfg, z, 30), rel=1e-12)
    assert spent <= target and accounting.epsilon(cfg, z - 2e-4, 30) > target  # the smallest z, within tolerance
