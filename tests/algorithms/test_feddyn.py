"""FedDyn: the linear term and the server's drift (h) by hand, the evaluated model (the plain mean) by hand, the
client's gradient and its kept λ, α scaled by client size, refusals, and a run on Ray (one vs two workers with one
killed: λ is client state)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import context, killed_worker_matches_inline, refused_config, tiny_overrides

import raysim
from raysim.algorithms.base import ClientUpdate
from raysim.algorithms.feddyn import ALPHA, MEAN_SIZE, linear_term, server_update
from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm


# ---------------------------------------------------------------------------------------------- the math by hand
def test_linear_term_and_its_gradient_by_hand():
    # θ = (1, 2), λ = (0.5, -1), α = 0.1: α⟨λ, θ⟩ = 0.1·(0.5 - 2) = -0.15; gradient αλ = (0.05, -0.1), none into λ
    theta, lam = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([0.5, -1.0], requires_grad=True)
    term = linear_term([(theta, lam)], alpha=0.1)
    assert term.item() == pytest.approx(-0.15)
    term.backward()
    assert theta.grad.tolist() == pytest.approx([0.05, -0.1]) and lam.grad is None
    # λ None (a client's first round) is 0
    assert linear_term([(theta, None)], alpha=0.1).item() == 0.0


def test_server_drift_and_model_by_hand():
    # N = 4, θ^{t-1} = (0, 0), D = (0.5, 0.5); this round θ_1 = (1, 2), θ_2 = (3, -2) (uniform mean, whatever n_k)
    #   mean = (2, 0);  D ← D + (2/4)·((2, 0) - (0, 0)) = (0.5, 0.5) + (1, 0) = (1.5, 0.5)  [h = -α·D]
    #   θ^t = mean + D = (3.5, 0.5);  a running mean (1, 3) → 2 and a counter (2, 4) → 3: averaged, no drift
    model = {"w": torch.zeros(2), "bn.running_mean": torch.zeros(1), "bn.num_batches_tracked": torch.tensor(0)}
    uploads = [{"w": torch.tensor([1.0, 2.0]), "bn.running_mean": torch.tensor([1.0]),
                "bn.num_batches_tracked": torch.tensor(2)},
               {"w": torch.tensor([3.0, -2.0]), "bn.running_mean": torch.tensor([3.0]),
                "bn.num_batches_tracked": torch.tensor(4)}]
    new, drift, mean = server_update(model, {"w": torch.tensor([0.5, 0.5])}, uploads, num_clients=4)
    assert mean["w"].tolist() == [2.0, 0.0] and mean["bn.running_mean"].tolist() == [2.0]
    assert drift["w"].tolist() == [1.5, 0.5] and set(drift) == {"w"}
    assert new["w"].tolist() == [3.5, 0.5] and new["bn.running_mean"].tolist() == [2.0]
    assert int(new["bn.num_batches_tracked"]) == 3
    # a second round with the same models from θ^t: D += (2/4)·((2, 0) - (3.5, 0.5)) = (1.5, 0.5) + (-0.75, -0.25)
    new2, drift2, _ = server_update(new, drift, uploads, num_clients=4)
    assert drift2["w"].tolist() == [0.75, 0.25] and new2["w"].tolist() == [2.75, 0.25]


def test_the_evaluated_model_is_the_plain_mean_and_clients_download_theta_by_hand():
    # The numbers of the test above, through the algorithm: N = 4, θ^{t-1} = (0, 0), D = (0.5, 0.5), θ_1 = (1, 2)
    # from 10 samples, θ_2 = (3, -2) from 30. Clients download θ^t = mean + D = (3.5, 0.5); what is evaluated
    # (acc_mean, acc_global) is the authors' avg_model, the uniform mean (2, 0), not the sample-weighted (2.5, -1)
    # and not θ^t. With algorithm.evaluate=server, θ^t is evaluated. Before any round there is no mean: θ^0.
    for evaluate, scored in (("mean", [2.0, 0.0]), ("server", [3.5, 0.5])):
        cfg = load_config(None, ["algorithm.name=feddyn", "clients.num=4", f"algorithm.evaluate={evaluate}"])
        algo = get_algorithm("feddyn")(cfg)
        state = algo.init_server_state({"w": torch.zeros(2)})
        assert algo.eval_payload(state)["model"]["w"].tolist() == [0.0, 0.0]
        state["drift"] = {"w": torch.tensor([0.5, 0.5])}
        updates = [ClientUpdate(0, {"w": torch.tensor([1.0, 2.0])}, 10),
                   ClientUpdate(1, {"w": torch.tensor([3.0, -2.0])}, 30)]
        state = algo.server_aggregate(updates, state, round=1)
        assert algo.server_payload(state, round=2)["model"]["w"].tolist() == [3.5, 0.5]
        assert algo.eval_payload(state)["model"]["w"].tolist() == scored


def test_evaluating_theta_instead_changes_the_scores_and_nothing_else(tmp_path):
    # The option changes which model is scored, never what is trained: the same losses round by round.
    rows = {}
    for evaluate in ("mean", "server"):
        rows[evaluate] = raysim.run(None, *tiny_overrides(tmp_path / evaluate, rounds=3, clients__fraction=0.5),
                                    "algorithm.name=feddyn", "algorithm.alpha=0.1", f"algorithm.evaluate={evaluate}",
                                    progress=False).metrics
    assert rows["mean"]["loss"].tolist() == rows["server"]["loss"].tolist()
    assert rows["mean"]["acc_global"].tolist() != rows["server"]["acc_global"].tolist()


# ---------------------------------------------------------------------------------------------- client hooks
def _setup(*extra: str, n: int = 6, mean_size: float = 6.0):
    cfg = load_config(None, ["algorithm.name=feddyn", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=6",
                             *extra])
    algo = get_algorithm("feddyn")(cfg)
    model = build_model(cfg, "mlp", (5,), 3, algorithm=algo)
    torch.manual_seed(1)
    start = {k: v + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items()}
    lam = {k: 0.2 * torch.randn_like(v) for k, v in model.named_parameters()}
    x, y = torch.randn(n, 5), torch.randint(0, 3, (n,))
    ctx = context(payload={"model": {k: v.clone() for k, v in start.items()}}, state={"lambda": lam},
                  meta={MEAN_SIZE: mean_size}, train_data=(x, y, torch.arange(n)))
    algo.client_setup(model, ctx)  # loads the download, puts α_k into ctx.state
    return algo, model, ctx, start, lam, x, y


def test_client_gradient_is_ce_plus_alpha_lambda_plus_alpha_drift():
    algo, model, ctx, start, lam, x, y = _setup("algorithm.alpha=0.5")
    with torch.no_grad():  # move away from the download so the proximal part is not zero
        for p in model.parameters():
            p.add_(0.3)
    loss, parts = algo.client_loss(model, x, y, ctx)
    w = dict(model.named_parameters())
    linear = 0.5 * sum((w[k] * lam[k]).sum() for k in w)
    prox = 0.25 * sum(((w[k] - start[k]) ** 2).sum() for k in w)
    assert parts["linear"].item() == pytest.approx(linear.item(), rel=1e-5)
    assert parts["prox"].item() == pytest.approx(prox.item(), rel=1e-5) and parts["prox"].item() > 0
    assert loss.item() == pytest.approx(parts["ce"].item() + linear.item() + prox.item(), rel=1e-5)
    model.zero_grad()
    loss.backward()
    dyn = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for k, p in model.named_parameters():  # ∇CE + α_k·λ + α_k·(θ − θ^{t-1}), α_k = α (n_k = n̄)
        assert torch.allclose(dyn[k] - p.grad, 0.5 * lam[k] + 0.5 * (p.detach() - start[k]), atol=1e-6), k
    # the kept λ moves by the distance travelled this round
    kept = algo.client_keep(model, ctx)["lambda"]
    for k, p in model.named_parameters():
        assert torch.allclose(kept[k], lam[k] + p.detach() - start[k]), k
    assert algo.clip_grad_norm == 10.0  # the authors' clip


def test_alpha_is_scaled_by_the_clients_share_of_the_mean_size():
    # n̄ = 12, n_k = 6: α_k = α·12/6 = 2α (the authors' alpha_coef / (n_k / n̄)); scale_alpha=false: α
    algo, _, ctx, *_ = _setup("algorithm.alpha=0.1", n=6, mean_size=12.0)
    assert algo.client_alpha(ctx) == pytest.approx(0.2)
    plain, _, ctx2, *_ = _setup("algorithm.alpha=0.1", "algorithm.scale_alpha=false", n=6, mean_size=12.0)
    assert plain.client_alpha(ctx2) == 0.1


def test_setup_puts_alpha_into_a_new_state_for_the_loss_and_keeps_lambda_alone():
    """client_setup: α_k as a float32 scalar in a new ctx.state (the passed-in dict may be the stored state), which
    the loss reads (a stack has no train_data to size the client by); client_keep keeps λ alone."""
    algo, model, ctx, _, _, x, y = _setup("algorithm.alpha=0.1", n=6, mean_size=12.0)
    given = {"lambda": ctx.state["lambda"]}
    ctx.state = given
    algo.client_setup(model, ctx)
    assert set(given) == {"lambda"} and ctx.state is not given  # the state passed in is untouched
    alpha = ctx.state[ALPHA]
    assert alpha.dtype == torch.float32 and alpha.dim() == 0 and alpha.item() == pytest.approx(0.2)
    ctx.state = {**ctx.state, ALPHA: torch.tensor(0.0)}  # the loss reads α_k from the state, nowhere else
    _, parts = algo.client_loss(model, x, y, ctx)  # at the download: the proximal part is 0 anyway
    assert parts["linear"].item() == 0.0 and parts["prox"].item() == 0.0
    assert set(algo.client_keep(model, ctx)) == {"lambda"}


def test_first_round_has_no_linear_term():
    """λ_k starts as zeros for every parameter (init_client_state): one state structure for every client."""
    algo, model, ctx, *_, x, y = _setup()
    ctx.state = algo.init_client_state(model, ctx)
    assert {k: v.abs().sum().item() for k, v in ctx.state["lambda"].items()} == \
        {name: 0.0 for name, _ in model.named_parameters()}
    algo.client_setup(model, ctx)
    _, parts = algo.client_loss(model, x, y, ctx)
    assert parts["linear"].item() == 0.0


# ---------------------------------------------------------------------------------------------- config and runs
def test_defaults_and_bad_values():
    a = load_config(None, ["algorithm.name=feddyn"]).algorithm
    assert (a.alpha, a.scale_alpha, a.max_grad_norm, a.evaluate) == (0.01, True, 10.0, "mean")
    for override, key in (("algorithm.alpha=0", "algorithm.alpha"), ("algorithm.max_grad_norm=-1",
                                                                      "algorithm.max_grad_norm"),
                          ("algorithm.evaluate=cloud", "algorithm.evaluate")):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            load_config(None, ["algorithm.name=feddyn", override])


def test_cli_bad_alpha_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.alpha", *tiny_overrides(tmp_path), "algorithm.name=feddyn", "algorithm.alpha=-0.1")
    assert not (tmp_path / "run").exists()


def test_scaled_alpha_on_data_made_on_demand_is_refused_in_one_line(tmp_path):
    refused_config("algorithm.scale_alpha", *tiny_overrides(tmp_path, data__name="synthetic", model__name="mlp",
                                                            engine__backend="inline"), "algorithm.name=feddyn")


def test_feddyn_on_ray_matches_one_worker_with_a_worker_killed(ray_cluster, tmp_path):
    rows = killed_worker_matches_inline(tmp_path, algorithm__name="feddyn", algorithm__alpha=0.1)
    assert rows[-1]["acc_global"] > 0.2
    assert all(r["loss"] == pytest.approx(r["loss_ce"] + r["loss_linear"] + r["loss_prox"], rel=1e-6) for r in rows)
    assert any(r["loss_linear"] != 0 for r in rows[1:])  # clients back for a second round bring their λ
