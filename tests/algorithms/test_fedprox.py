"""FedProx: the proximal term by hand, its gradient, mu = 0 is FedAvg bit for bit, tiny runs on the shared Ray."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import refused_config, strip_timing, tiny_overrides

from raysim.algorithms.base import ClientContext
from raysim.algorithms.fedprox import proximal_term
from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm


# ---------------------------------------------------------------------------------------------- the term (no Ray)
def test_proximal_term_and_its_gradient_by_hand():
    # w = (1, 2, -1), w_t = (0.5, 2, 1), mu = 0.1
    #   w - w_t = (0.5, 0, -2);  ||w - w_t||^2 = 0.25 + 0 + 4 = 4.25
    #   term = (mu/2) * 4.25 = 0.05 * 4.25 = 0.2125
    #   d term / d w = mu * (w - w_t) = (0.05, 0, -0.2);  w_t gets no gradient
    w = torch.tensor([1.0, 2.0, -1.0], requires_grad=True)
    w_t = torch.tensor([0.5, 2.0, 1.0], requires_grad=True)
    term = proximal_term([(w, w_t)], mu=0.1)
    assert term.item() == pytest.approx(0.2125, abs=1e-7)
    term.backward()
    assert torch.allclose(w.grad, torch.tensor([0.05, 0.0, -0.2]), atol=1e-7)
    assert w_t.grad is None

    # two tensors add up: a second pair w2 = (3), w2_t = (1): + (0.1/2) * 4 = 0.2  -> 0.4125
    w2 = torch.tensor([3.0], requires_grad=True)
    assert proximal_term([(w, w_t), (w2, torch.tensor([1.0]))], mu=0.1).item() == pytest.approx(0.4125, abs=1e-7)


def _setup(mu: float):
    cfg = load_config(None, ["algorithm.name=fedprox", f"algorithm.mu={mu}", "model.name=mlp", "model.hidden=[8]",
                             "model.feature_dim=6"])
    algo = get_algorithm("fedprox")(cfg)
    model = build_model(cfg, "mlp", (5,), 3, algorithm=algo)
    torch.manual_seed(1)
    global_model = {k: v + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items()}
    ctx = ClientContext(client_id=0, round=1, total_rounds=1, epoch=0, num_epochs=1,
                        payload={"model": {k: v.clone() for k, v in global_model.items()}})
    algo.client_setup(model, ctx)
    return algo, model, ctx, global_model


def test_client_loss_is_ce_plus_prox_against_the_frozen_download():
    algo, model, ctx, w_t = _setup(mu=0.5)
    x, y = torch.randn(4, 5), torch.tensor([0, 1, 2, 0])
    loss, parts = algo.client_loss(model, x, y, ctx)
    assert parts["prox"].item() == 0.0  # right after the download w == w_t
    # one SGD step: the live parameters move, the reference does not (the "compares params with themselves" bug
    # would keep the term at 0 forever)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss, parts = algo.client_loss(model, x, y, ctx)
    w = dict(model.named_parameters())
    expected = 0.25 * sum(((w[k] - w_t[k]) ** 2).sum() for k in w)  # mu/2 = 0.25
    assert parts["prox"].item() == pytest.approx(expected.item(), rel=1e-6) and parts["prox"].item() > 0
    assert loss.item() == pytest.approx(F.cross_entropy(model(x), y).item() + expected.item(), rel=1e-6)
    assert all(torch.equal(ctx.payload["model"][k], w_t[k]) for k in w_t)  # the download was never changed
    # the gradient is CE's plus mu * (w - w_t), parameter by parameter
    model.zero_grad()
    loss.backward()
    prox_grad = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for k, p in model.named_parameters():
        assert torch.allclose(prox_grad[k] - p.grad, 0.5 * (p.detach() - w_t[k]), atol=1e-6), k


def test_mu_zero_is_fedavgs_loss():
    algo, model, ctx, _ = _setup(mu=0)
    fedavg = get_algorithm("fedavg")(load_config(None, []))
    x, y = torch.randn(4, 5), torch.tensor([0, 1, 2, 0])
    loss, parts = algo.client_loss(model, x, y, ctx)
    ref, ref_parts = fedavg.client_loss(model, x, y, ctx)
    assert torch.equal(loss, ref) and parts == ref_parts == {}


@pytest.mark.parametrize("value", ["-1", "-0.001", "nan"])
def test_negative_mu_is_refused(value):
    with pytest.raises(ConfigError, match="'algorithm.mu': must be >= 0"):
        load_config(None, ["algorithm.name=fedprox", f"algorithm.mu={value}"])
    assert load_config(None, ["algorithm.name=fedprox"]).algorithm.mu == 0.01


def test_cli_bad_mu_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.mu", *tiny_overrides(tmp_path), "algorithm.name=fedprox", "algorithm.mu=-1")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- whole runs
@pytest.fixture(scope="module")
def runs(shared_run):
    """Two-round tiny runs with momentum: fedavg, fedprox mu=0 and fedprox mu=0.1."""
    variants = {"fedavg": dict(algorithm__name="fedavg"),
                "prox0": dict(algorithm__name="fedprox", algorithm__mu=0),
                "w1": dict(algorithm__name="fedprox", algorithm__mu=0.1)}
    return {name: shared_run(rounds=2, train__momentum=0.9, **extra)[1] for name, extra in variants.items()}


def test_mu_zero_gives_fedavgs_metrics_exactly(runs):
    assert strip_timing(runs["prox0"]) == strip_timing(runs["fedavg"])


def test_fedprox_run_adds_the_term_and_learns(runs):
    one = runs["w1"]
    assert [r["round"] for r in one] == [1, 2]
    for r in one:
        assert {"acc_global", "acc_mean", "loss", "loss_ce", "loss_prox", "bytes_up", "bytes_down"} <= set(r)
        assert r["loss"] == r["loss"] and r["loss_prox"] > 0
        assert r["loss"] == pytest.approx(r["loss_ce"] + r["loss_prox"], rel=1e-6)
    assert one[-1]["acc_global"] > 0.3  # chance is 0.1; seeds 0-4 reach 0.47 to 0.76
    assert one[0]["bytes_up"] == runs["fedavg"][0]["bytes_up"]  # the whole model travels, nothing more
    assert strip_timing(one) != strip_timing(runs["fedavg"])  # the term changes training
