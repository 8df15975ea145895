"""MOON: the model-contrastive loss by hand, the ModelFedCon layout, the previous-model pool, and a run in this
process against one on two Ray workers with a worker killed mid-job (the pool is client state, kept outside the
workers)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import read_rows, refused_config, strip_timing, tiny_overrides

from raysim.algorithms.base import ClientContext
from raysim.algorithms.moon import ProjectedBackbone, model_contrastive_loss
from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm


# ---------------------------------------------------------------------------------------------- the loss (no Ray)
def test_contrastive_loss_by_hand():
    # tau = 0.5. Sample 1: z = (1, 0), z_glob = (2, 0): cos = 1; z_prev = (0, 3): cos = 0.
    #   logits (1/0.5, 0/0.5) = (2, 0);  l1 = -log(e^2 / (e^2 + e^0)) = log(1 + e^-2) = 0.1269280110
    # Sample 2: z = (1, 1), z_glob = (1, 0): cos = 1/sqrt(2); z_prev = (-1, -1): cos = -1.
    #   logits (sqrt(2), -2);  l2 = log(1 + e^-(sqrt(2) + 2)) = 0.0323725798
    # mean = (0.1269280110 + 0.0323725798) / 2 = 0.0796502954
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[2.0, 0.0], [1.0, 0.0]])
    z_prev = torch.tensor([[0.0, 3.0], [-1.0, -1.0]])
    assert model_contrastive_loss(z, z_glob, [z_prev], 0.5).item() == pytest.approx(0.0796502954, abs=1e-7)
    assert model_contrastive_loss(z[:1], z_glob[:1], [z_prev[:1]], 0.5).item() == pytest.approx(0.1269280110, abs=1e-7)

    # two previous models, tau = 1: z = (1, 0), z_glob = (1, 0): cos 1; z_prev1 = (0, 1): cos 0; z_prev2 = (-1, 0): -1
    #   l = -log(e^1 / (e^1 + e^0 + e^-1)) = log(1 + e^-1 + e^-2) = log(1.5032147244) = 0.4076059644
    two = model_contrastive_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]),
                                 [torch.tensor([[0.0, 1.0]]), torch.tensor([[-1.0, 0.0]])], 1.0)
    assert two.item() == pytest.approx(0.4076059644, abs=1e-7)
    # no previous model: the positive alone, -log(1) = 0 (the authors' first round)
    assert model_contrastive_loss(z, z_glob, [], 0.5).item() == 0.0


def test_equal_global_and_previous_give_log2_and_no_gradient():
    # z_glob == z_prev: both logits equal, l = -log(1/2) = log 2 whatever z is, so dl/dz = 0 (round 1 here)
    z = torch.tensor([[0.3, -1.2, 2.0], [1.0, 0.5, 0.0]], requires_grad=True)
    other = torch.tensor([[1.0, 1.0, 1.0], [-2.0, 0.0, 1.0]])
    loss = model_contrastive_loss(z, other, [other.clone()], 0.5)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    loss.backward()
    assert z.grad.abs().max().item() < 1e-7


# ---------------------------------------------------------------------------------------------- hooks (no Ray)
def _tiny(*extra: str):
    cfg = load_config(None, ["algorithm.name=moon", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=6",
                             "algorithm.out_dim=4", *extra])
    algo = get_algorithm("moon")(cfg)
    return cfg, algo, build_model(cfg, "mlp", (5,), 3, algorithm=algo)


def test_adapt_model_is_modelfedcon():
    cfg, algo, model = _tiny()
    assert isinstance(model.backbone, ProjectedBackbone)
    b = model.backbone
    assert (b.l1.in_features, b.l1.out_features, b.l2.in_features, b.l2.out_features) == (6, 6, 6, 4)
    assert (model.head.in_features, model.head.out_features) == (4, 3)
    assert all(k.startswith(("backbone.", "head.")) for k in model.state_dict())
    x = torch.randn(7, 5)
    h = b.body(x)
    z = b.l2(F.relu(b.l1(h)))  # ModelFedCon.forward: h -> l1 -> relu -> l2 = projection, l3 on it
    assert h.shape == (7, 6) and torch.equal(model.features(x), z) and torch.equal(model(x), model.head(z))
    # the same seeded model on every worker and on the driver
    again = build_model(cfg, "mlp", (5,), 3, algorithm=get_algorithm("moon")(cfg))
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
    assert get_algorithm("moon")(load_config(None, ["algorithm.name=moon"])).config.out_dim == 256


def _ctx(payload: dict, state: dict, rnd: int = 2) -> ClientContext:
    return ClientContext(client_id=0, round=rnd, total_rounds=3, epoch=0, num_epochs=1, payload=payload, state=state)


def test_loss_contrasts_with_the_download_and_the_kept_model():
    cfg, algo, model = _tiny("algorithm.mu=2", "algorithm.tau=0.5")
    init = algo.init_client_state(model, _ctx({}, {}))
    assert init["initial"] and len(init["prev"]) == 1
    torch.manual_seed(0)
    glob = {k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items()}
    prev = {k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items()}
    ctx = _ctx({"model": {k: v.clone() for k, v in glob.items()}}, {"prev": [prev]})
    algo.client_setup(model, ctx)
    assert all(torch.equal(v, glob[k]) for k, v in model.state_dict().items())  # training starts from w^t
    with torch.no_grad():  # step away from w^t, so z differs from z_glob
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    loss, parts = algo.client_loss(model, x, y, ctx)

    _, _, ref = _tiny()  # the same architecture, loaded with each frozen model
    def project(sd):
        ref.load_state_dict(sd)
        return ref.eval().features(x).detach()
    z = model.features(x)
    con = model_contrastive_loss(z, project(glob), [project(prev)], 0.5)
    ce = F.cross_entropy(model.head(z), y)
    assert parts["con"].item() == pytest.approx(con.item(), rel=1e-6) and con.item() > 0
    assert loss.item() == pytest.approx(ce.item() + 2 * con.item(), rel=1e-6)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    frozen = [ctx.scratch["glob"], *ctx.scratch["prevs"]]
    assert all(p.grad is None and not p.requires_grad for t in frozen for p in t.parameters())


def test_pool_drops_the_initial_model_and_is_fifo():
    cfg, algo, model = _tiny("algorithm.model_buffer_size=2")
    payload = {"model": model.state_dict()}
    first = algo.init_client_state(model, _ctx(payload, {}, rnd=1))
    ctx = _ctx(payload, first, rnd=1)
    algo.client_setup(model, ctx)
    assert len(ctx.scratch["prevs"]) == 1
    kept1 = algo.client_keep(model, ctx)
    assert len(kept1["prev"]) == 1 and "initial" not in kept1  # the client's own model only
    m2 = {k: v + 1 for k, v in model.state_dict().items()}
    model.load_state_dict(m2)
    kept2 = algo.client_keep(model, _ctx(payload, kept1))
    assert len(kept2["prev"]) == 2 and torch.equal(kept2["prev"][1]["head.bias"], m2["head.bias"])
    model.load_state_dict({k: v + 2 for k, v in m2.items()})
    kept3 = algo.client_keep(model, _ctx(payload, kept2))
    assert len(kept3["prev"]) == 2 and torch.equal(kept3["prev"][0]["head.bias"], m2["head.bias"])  # oldest out
    _, algo0, model0 = _tiny("algorithm.mu=0")
    assert algo0.init_client_state(model0, _ctx(payload, {})) == {}
    assert algo0.client_keep(model0, _ctx(payload, {})) == {}


@pytest.mark.parametrize("override, key", [
    ("algorithm.mu=-1", "algorithm.mu"), ("algorithm.tau=0", "algorithm.tau"),
    ("algorithm.out_dim=0", "algorithm.out_dim"),
    ("algorithm.model_buffer_size=0", "algorithm.model_buffer_size"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_config(None, ["algorithm.name=moon", override])
    a = load_config(None, ["algorithm.name=moon"]).algorithm
    assert (a.mu, a.tau, a.out_dim, a.model_buffer_size) == (1.0, 0.5, 256, 1)


def test_cli_bad_tau_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.tau", *tiny_overrides(tmp_path), "algorithm.name=moon", "algorithm.tau=-0.5")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- on Ray
# half the clients sampled, so some clients train for the first time after round 1 and others bring back a pool
# from two rounds before
SLOW = dict(rounds=5, clients__num=6, clients__fraction=0.5, data__partition="dirichlet", algorithm__name="moon",
            algorithm__mu=5, algorithm__out_dim=32, train__local_epochs=4, model__hidden="[256,256]")


def test_one_worker_in_process_and_two_on_ray_with_one_killed_agree(ray_cluster, tmp_path):
    """The same metrics in this process, and on two Ray workers of which one is SIGKILLed in the middle of a job of
    round 2 (helpers.killed_worker_matches_inline): the job runs again on a fresh worker, and every client's
    previous-model pool lives outside the dead worker."""
    from helpers import killed_worker_matches_inline

    one = killed_worker_matches_inline(tmp_path, **SLOW)
    for r in one:
        assert {"acc_global", "acc_mean", "loss", "loss_ce", "loss_con"} <= set(r)
        assert math.isfinite(r["loss"]) and r["loss"] == pytest.approx(r["loss_ce"] + 5 * r["loss_con"], rel=1e-6)
    assert one[0]["loss_con"] == pytest.approx(math.log(2), rel=1e-4)  # round 1: previous = initial = global model
    # chance is 0.1; MOON at mu = 5 learns erratically on this tiny set: seeds 0-4 reach 0.29 to 0.57
    assert one[-1]["loss_con"] < math.log(2) and one[-1]["acc_global"] > 0.2
    assert strip_timing(read_rows(tmp_path / "one")) == strip_timing(one)
