"""DP-SGD on clients: torch.func's per-sample gradients against one sample at a time and against Opacus, the
clipped and noised step by hand, each client's ε from Opacus's accountant, and runs that repeat and resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import crash_after, read_rows, strip_timing, tiny_overrides
from torch import nn

from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.privacy.dpsgd import clip_and_noise, client_epsilon, per_sample_grads


class _Ctx:
    sample_idx = None


def _ce(model, x, y, ctx):
    return F.cross_entropy(model(x), y), {}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))


def test_per_sample_gradients_are_each_sample_s_own():
    model, x, y = _model(), torch.randn(5, 8), torch.tensor([0, 1, 2, 1, 0])
    params = list(model.parameters())
    grads, losses, _ = per_sample_grads(model, params, _ce, x, y, torch.arange(5), _Ctx())
    for i in range(5):
        own = torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params)
        assert all(torch.allclose(g[i], o, atol=1e-6) for g, o in zip(grads, own))
        own_loss = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).detach()
        assert float(losses[i]) == pytest.approx(float(own_loss), rel=1e-6)


def test_per_sample_gradients_equal_opacus_s():
    opacus = pytest.importorskip("opacus")
    import copy

    model, x, y = _model(), torch.randn(7, 8), torch.randint(0, 3, (7,))
    grads, _, _ = per_sample_grads(model, list(model.parameters()), _ce, x, y, torch.arange(7), _Ctx())
    gsm = opacus.GradSampleModule(copy.deepcopy(model), loss_reduction="sum")
    with pytest.warns(UserWarning):  # Opacus's full backward hooks on inputs that need no gradient
        F.cross_entropy(gsm(x), y, reduction="sum").backward()
    assert all(torch.allclose(g, p.grad_sample, atol=1e-6) for g, p in zip(grads, gsm.parameters()))


def test_the_clipped_noised_step_by_hand():
    # two samples' gradients over two parameters: norms 5 and 0.5; clip 1: the first scaled by 1/5
    grads = [torch.tensor([[3.0], [0.3]]), torch.tensor([[4.0, 0.0], [0.4, 0.0]])]
    gen = torch.Generator().manual_seed(1)
    out = clip_and_noise(grads, clip=1.0, noise=1e-12, generator=gen)
    assert torch.allclose(out[0], torch.tensor([(0.6 + 0.3) / 2])) and torch.allclose(out[1], torch.tensor(
        [(0.8 + 0.4) / 2, 0.0]))
    noisy = clip_and_noise(grads, clip=1.0, noise=2.0, generator=torch.Generator().manual_seed(1))
    draw = torch.randn(1, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(noisy[0], (torch.tensor([0.9]) + 2.0 * draw) / 2)


def test_client_epsilon_is_opacus_s():
    accountants = pytest.importorskip("opacus.accountants")
    acct = accountants.RDPAccountant()
    for _ in range(30):
        acct.step(noise_multiplier=1.1, sample_rate=0.25)
    assert client_epsilon(1.1, 0.25, 30, 1e-3) == pytest.approx(acct.get_epsilon(1e-3), rel=1e-12)


DPSGD = dict(rounds=2, clients__fraction=0.5, privacy__dpsgd="true", privacy__dpsgd_noise=1.0, privacy__dpsgd_clip=1.0,
             log__tensorboard="false", log__progress="false")


def _rows(tmp_path, name, **extra):
    cfg = load_config(overrides=tiny_overrides(tmp_path, **dict(DPSGD, log__dir=str(tmp_path / name), **extra)),
                      warn=False)
    run_experiment(cfg)
    return strip_timing(read_rows(tmp_path / name))


def test_dpsgd_runs_repeat_and_resume(tmp_path):
    whole = _rows(tmp_path, "whole")
    assert _rows(tmp_path, "again") == whole
    assert whole[-1]["dpsgd/epsilon_max"] > whole[0]["dpsgd/epsilon_max"] > 0
    cfg = load_config(overrides=tiny_overrides(tmp_path, **dict(DPSGD, log__dir=str(tmp_path / "part"))),
                      warn=False)
    crash_after(cfg, 1)
    run_experiment(cfg, resume=True)  # round 2's ε continues from the checkpointed step counts
    assert strip_timing(read_rows(tmp_path / "part")) == whole


def _balle_wang_epsilon(mu: float, delta: float) -> float:
    """The analytic Gaussian mechanism (Balle and Wang 2018, Theorem 8): outputs N(0, 1) and N(mu, 1) are (ε, δ)-DP
    iff Φ(-ε/mu + mu/2) - e^ε Φ(-ε/mu - mu/2) <= δ; the smallest such ε."""
    import math

    from scipy import optimize, stats

    def excess(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta
    return optimize.brentq(excess, 0.0, 500.0, xtol=1e-12)


def test_poisson_batches_have_binomial_sizes():
    import numpy as np
    from scipy import stats

    from raysim.privacy.dpsgd import poisson_batches, poisson_rate
    from raysim.privacy.stage import _DPSGDPart

    # Opacus's DPDataLoader over n = 600 samples, batch 32: ceil(600 / 32) = 19 steps an epoch, each sample in a
    # batch with probability q = 1/19, the sum divided by the expected batch int(600 / 19) = int(31.58) = 31
    assert poisson_rate(600, 32) == (19, 1 / 19, 31)
    cfg = load_config(overrides=["privacy.dpsgd=true"], warn=False)
    part = _DPSGDPart(cfg, type("Job", (), {"client_id": 0, "round": 1, "stream": ()})())
    gen = torch.Generator().manual_seed(0)
    batches = [b for _ in range(200) for b in part.batches(600, 32, gen, "cpu")]
    assert part.denominator == 31 and part.epochs == 200 and len(batches) == 200 * 19
    sizes = np.array([len(b) for b in batches])
    # Binomial(600, 1/19): mean 31.58, variance 600 (1/19)(18/19) = 29.92; a chi-square test over bins of the pmf
    assert sizes.mean() == pytest.approx(600 / 19, abs=4 * (29.92 / len(sizes)) ** 0.5)
    assert sizes.var(ddof=1) == pytest.approx(29.92, rel=0.1)
    edges = [0, 25, 28, 30, 32, 34, 36, 39, 601]
    observed = np.histogram(sizes, bins=edges)[0]
    binom = stats.binom(600, 1 / 19)
    expected = np.diff([binom.cdf(e - 1) for e in edges]) * len(sizes)
    assert stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3
    # and each sample joins each batch on its own: every sample about q of the time
    counts = np.bincount(torch.cat(batches).numpy(), minlength=600) / len(batches)
    assert abs(counts.mean() - 1 / 19) < 1e-3 and counts.min() > 0.03 and counts.max() < 0.08
    assert sum(1 for _ in poisson_batches(5, 32, gen, "cpu")) == 1  # fewer samples than a batch: q = 1, one step


def test_an_empty_poisson_batch_is_a_step_of_noise_alone():
    grads = [torch.zeros(0, 3), torch.zeros(0, 2, 2)]
    out = clip_and_noise(grads, clip=0.5, noise=2.0, generator=torch.Generator().manual_seed(4), denominator=31.0)
    gen = torch.Generator().manual_seed(4)
    draws = [torch.randn(3, generator=gen), torch.randn(2, 2, generator=gen)]
    assert all(torch.allclose(o, d * (2.0 * 0.5) / 31.0) for o, d in zip(out, draws))


def _client_sizes(tmp_path, **extra) -> list[int]:
    from raysim.data import build_federated_data

    cfg = load_config(overrides=tiny_overrides(tmp_path, **dict(DPSGD, **extra)), warn=False)
    data = build_federated_data(cfg)
    return [len(data.split(c).train) for c in range(data.num_clients)]


def test_the_logged_epsilon_is_opacus_s_poisson_accountant(tmp_path):
    accountants = pytest.importorskip("opacus.accountants")
    import math

    rows = _rows(tmp_path, "poisson", clients__fraction=1.0, train__batch_size=16)
    expected = []
    for n in _client_sizes(tmp_path, clients__fraction=1.0):  # every client both rounds, one epoch each
        acct = accountants.RDPAccountant()
        steps = math.ceil(n / 16)
        for _ in range(2 * steps):
            acct.step(noise_multiplier=1.0, sample_rate=1 / steps)
        expected.append(acct.get_epsilon(0.01 / n))  # δ null: 0.01 / its samples
    assert rows[-1]["dpsgd/epsilon_max"] == pytest.approx(max(expected), rel=1e-9)
    assert rows[-1]["dpsgd/epsilon_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-9)


def test_the_shuffle_option_is_accounted_without_amplification(tmp_path):
    from raysim.privacy.dpsgd import client_epsilon, shuffled_epsilon

    rows = _rows(tmp_path, "shuffle", clients__fraction=1.0, privacy__dpsgd_sampling="shuffle")
    # two epochs per client (two rounds of one): replacing one sample moves the one batch that holds it by 2C
    # against noise σC, a Gaussian of multiplier σ/2 = 0.5 an epoch; two compose to μ = √2 · 2 = 2.83
    expected = [_balle_wang_epsilon(2 * 2 ** 0.5, 0.01 / n) for n in _client_sizes(tmp_path, clients__fraction=1.0)]
    assert rows[-1]["dpsgd/epsilon_max"] == pytest.approx(max(expected), rel=1e-6)
    # the case: n = 600, B = 32, σ = 1, 380 steps (20 epochs of 19), δ = 1/600: accounted as Poisson
    # batches ε ≈ 5.4; shuffled batches without amplification μ = 2√20 = 8.94, ε ≈ 70
    assert client_epsilon(1.0, 1 / 19, 380, 1 / 600) == pytest.approx(5.4, abs=0.3)
    assert shuffled_epsilon(1.0, 20, 1 / 600) == pytest.approx(_balle_wang_epsilon(2 * 20 ** 0.5, 1 / 600), rel=1e-6)
    assert 60 < shuffled_epsilon(1.0, 20, 1 / 600) < 80


def test_the_client_part_takes_an_empty_batch_as_a_step_of_noise():
    from types import SimpleNamespace

    from raysim.privacy.stage import _DPSGDPart
    from raysim.seeds import DPSGD_STREAM, job_seed

    cfg = load_config(overrides=["privacy.dpsgd=true", "privacy.dpsgd_noise=1.5", "privacy.dpsgd_clip=0.5"],
                      warn=False)
    model = _model()
    params = list(model.parameters())
    recorded = []
    trainee = SimpleNamespace(model=model, params=params, alg=SimpleNamespace(client_loss=_ce), ctx=_Ctx(),
                              record=lambda *a: recorded.append(a))
    part = _DPSGDPart(cfg, SimpleNamespace(client_id=3, round=2, stream=()))
    part.denominator = 4.0  # a Poisson epoch's expected batch
    part.loss(trainee, torch.zeros(0, 8), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)).backward()
    gen = torch.Generator().manual_seed(job_seed(cfg.seed, 3, 2, DPSGD_STREAM))
    noise = [torch.randn(p.shape, generator=gen) * (1.5 * 0.5) / 4.0 for p in params]
    assert all(torch.allclose(p.grad, n) for p, n in zip(params, noise))  # the gradient is the noise alone
    assert recorded == [] and part.steps == 1  # no sample's loss, one accounted step


def test_a_sample_delta_of_at_least_one_over_n_is_warned_of(tmp_path, capsys):
    smallest = min(_client_sizes(tmp_path))
    _rows(tmp_path, "loose", rounds=1, privacy__dpsgd_delta=1.0 / smallest)
    err = capsys.readouterr().err
    assert f"privacy.dpsgd_delta={1.0 / smallest:g} is at least 1 / n for a client of n={smallest}" in err
    _rows(tmp_path, "tight", rounds=1, privacy__dpsgd_delta=0.01 / smallest)
    assert "privacy.dpsgd_delta" not in capsys.readouterr().err
