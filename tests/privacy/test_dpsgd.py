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
