"""DP-FedAvg by hand: the clipping of a known delta, the fixed-denominator mean, one adaptive-clip step, and the
delta's share of the noise under adaptive clipping."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_overrides

from raysim.algorithms.aggregation import UploadSum
from raysim.config import load_config
from raysim.privacy.central import CentralDP, clip_upload, delta_noise, delta_norm


def test_a_known_delta_is_clipped_to_the_norm():
    reference = {"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([2.0]), "n": torch.tensor(5)}
    upload = {"w": torch.tensor([4.0, 1.0]), "b": torch.tensor([6.0]), "n": torch.tensor(7)}  # Δ = (3, 0 | 4), 5
    out = clip_upload(upload, reference, 1.0)
    assert torch.allclose(out["delta"]["w"], torch.tensor([0.6, 0.0])) and torch.allclose(out["delta"]["b"],
                                                                                         torch.tensor([0.8]))
    assert int(out["delta"]["n"]) == 2  # an integer buffer's delta is not scaled (nor counted in the norm)
    assert float(out["unclipped"]) == -0.5  # the centred count: b_i - 1/2
    assert delta_norm(out["delta"]) == pytest.approx(1.0)
    kept = clip_upload(upload, reference, 5.0)  # at the bound: left as it is, and counted unclipped
    assert torch.equal(kept["delta"]["w"], torch.tensor([3.0, 0.0])) and float(kept["unclipped"]) == 0.5


def _dp(tmp_path, **extra) -> CentralDP:
    # 10 clients, fraction 0.4: 4 a round, the fixed denominator; noise as small as a float allows
    base = dict(clients__num=10, clients__fraction=0.4, privacy__enabled="true", privacy__noise_multiplier=1e-300)
    base.update(extra)
    cfg = load_config(overrides=tiny_overrides(tmp_path, **base), warn=False)
    return CentralDP(cfg, cfg.privacy.noise_multiplier)


def _sum(clipped: list[dict]) -> UploadSum:
    total = UploadSum()
    for i, c in enumerate(clipped):
        total.add(i, c, 1.0)
    return total


def test_the_mean_has_a_fixed_denominator(tmp_path):
    dp = _dp(tmp_path, privacy__clip=10.0)
    reference = {"w": torch.tensor([1.0, 2.0])}
    # two of the round's four clients report (the others dropped out): Δ = (1, 0) and (3, 4)
    ups = [clip_upload({"w": torch.tensor([2.0, 2.0])}, reference, dp.clip),
           clip_upload({"w": torch.tensor([4.0, 6.0])}, reference, dp.clip)]
    model, metrics = dp.release(_sum(ups), reference, rnd=1)
    # (1 + 3, 0 + 4) / 4 expected clients, not / 2 reporting ones; both reporting clients were unclipped: the
    # exact share, a non-private diagnostic (the noised estimate is released only with adaptive clipping)
    assert torch.allclose(model["w"], torch.tensor([1.0 + 1.0, 2.0 + 1.0]))
    assert metrics == {"privacy/clip": 10.0, "nonprivate/unclipped": 1.0}


def test_noise_is_seeded_from_seed_and_round(tmp_path):
    reference = {"w": torch.zeros(3)}
    dp = _dp(tmp_path, privacy__noise_multiplier=1.0)
    up = [clip_upload({"w": torch.ones(3)}, reference, dp.clip)]
    a, _ = dp.release(_sum(up), reference, rnd=3)
    b, _ = dp.release(_sum(up), reference, rnd=3)
    c, _ = dp.release(_sum(up), reference, rnd=4)
    assert torch.equal(a["w"], b["w"]) and not torch.equal(a["w"], c["w"])


def test_one_adaptive_clip_step_by_hand(tmp_path):
    dp = _dp(tmp_path, privacy__adaptive_clip="true", privacy__clip=1.0, privacy__noise_multiplier=1e-9,
             privacy__count_noise=1e-8)
    reference = {"w": torch.zeros(2)}
    # three of four clients inside the bound: b = 3/4, γ = 0.5, η = 0.2: S <- 1 * exp(-0.2 * (0.75 - 0.5))
    ups = [clip_upload({"w": torch.tensor(v)}, reference, 1.0) for v in ([0.1, 0.0], [0.0, 0.5], [0.6, 0.0],
                                                                         [3.0, 4.0])]
    _, metrics = dp.release(_sum(ups), reference, rnd=1)
    assert metrics["privacy/unclipped"] == pytest.approx(0.75) and metrics["nonprivate/unclipped"] == 0.75
    assert dp.clip == pytest.approx(math.exp(-0.2 * 0.25))


def test_adaptive_clipping_takes_the_count_s_share_of_the_noise(tmp_path):
    cfg = load_config(overrides=tiny_overrides(tmp_path, clients__num=100, clients__fraction=0.4,
                                               privacy__enabled="true", privacy__noise_multiplier=1.0,
                                               privacy__adaptive_clip="true"), warn=False)
    # σ_b = 40 / 20 = 2 (TFF's default): σ_Δ = (1 - 1/16)^-1/2 (Andrew et al.)
    assert delta_noise(cfg, 1.0) == pytest.approx((1 - 1 / 16) ** -0.5)


def test_clients_per_round_is_the_driver_s_cohort_size(tmp_path):
    from raysim.engine.plan import cohort_size
    from raysim.sections.privacy import clients_per_round

    for num, fraction in [(500, 0.2), (10, 0.25), (7, 0.5), (3, 0.01), (100, 1.0), (12, 0.125)]:
        cfg = load_config(overrides=[f"clients.num={num}", f"clients.fraction={fraction}"], warn=False)
        assert clients_per_round(cfg) == cohort_size(num, fraction)


def test_the_noise_seed_is_job_seed_s():
    from raysim.engine.core import job_seed
    from raysim.privacy.central import PRIVACY_STREAM, noise_seed

    assert all(noise_seed(s, r) == job_seed(s, 0, r, PRIVACY_STREAM) for s in (0, 7) for r in (1, 2, 30))
