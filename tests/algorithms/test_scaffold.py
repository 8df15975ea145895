"""SCAFFOLD: the corrected step and option II by hand, the correction as a zero-valued loss term, a client job
against plain SGD written out, option I, the server's c, doubled bytes, bad values, and a run on Ray (one vs two
workers with one killed: c_i is client state)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import killed_worker_matches_inline, refused_config, strip_timing, tiny_overrides

from raysim.algorithms.base import ClientUpdate
from raysim.algorithms.scaffold import correction_term, option_two
from raysim.config import ConfigError, load_config
from raysim.data import build_federated_data
from raysim.engine.core import ClientJobs
from raysim.engine.jobs import TrainJob
from raysim.engine.runner import run_experiment
from raysim.registry import get_algorithm


# ---------------------------------------------------------------------------------------------- the math by hand
def test_corrected_steps_and_option_two_by_hand():
    # f(w) = ½‖w‖² (gradient w), x = (1, 2), c = (0.5, -1), c_i = (0.2, 0.3): c - c_i = (0.3, -1.3), η_l = 0.1
    #   step 1: w = (1, 2) - 0.1·((1, 2) + (0.3, -1.3)) = (1 - 0.13, 2 - 0.07) = (0.87, 1.93)
    #   step 2: w = (0.87, 1.93) - 0.1·((0.87, 1.93) + (0.3, -1.3)) = (0.87 - 0.117, 1.93 - 0.063) = (0.753, 1.867)
    # option II, K = 2: c_i⁺ = c_i - c + (x - y)/(K·η_l) = (-0.3, 1.3) + (0.247, 0.133)/0.2 = (0.935, 1.965)
    #   = the mean of the plain gradients along the path, ((1 + 0.87)/2, (2 + 1.93)/2), as the paper reads it
    c, c_i = {"w": torch.tensor([0.5, -1.0])}, {"w": torch.tensor([0.2, 0.3])}
    x = torch.tensor([1.0, 2.0])
    w = torch.nn.Parameter(x.clone())
    opt = torch.optim.SGD([w], lr=0.1)
    for expected in ([0.87, 1.93], [0.753, 1.867]):
        term = correction_term([("w", w)], c, c_i)
        assert term.item() == 0.0  # zero in value: the logged loss stays the cross-entropy
        opt.zero_grad()
        (0.5 * (w ** 2).sum() + term).backward()
        opt.step()
        assert w.detach().tolist() == pytest.approx(expected, abs=1e-6)
    new = option_two(c_i["w"], c["w"], x, w.detach(), steps=2, lr=0.1)
    assert new.tolist() == pytest.approx([0.935, 1.965], abs=1e-5)
    # a name missing from a control variate counts as 0 (round 1, a client's first round): no correction at all
    w.grad = None
    correction_term([("w", w)], {}, {}).backward()
    assert w.grad.tolist() == [0.0, 0.0]


def test_server_update_by_hand():
    # N = 4 clients, 2 report. x = (0, 0), c = (1, 1). A (n = 1): y = (4, 0), Δc = (2, -2); B (n = 3): y = (0, 4),
    # Δc = (2, 6). x̄ = ((4 + 0)/4, (0 + 12)/4) = (1, 3);  c = (1, 1) + ((2, -2) + (2, 6))/4 = (2, 2)
    algo = get_algorithm("scaffold")(load_config(None, ["algorithm.name=scaffold", "clients.num=4"]))
    state = algo.init_server_state({"w": torch.zeros(2)})
    state["control"] = {"w": torch.ones(2)}
    def update(cid, y, delta, n):
        return ClientUpdate(cid, {"model": {"w": torch.tensor(y)}, "delta_control": {"w": torch.tensor(delta)}}, n)

    ups = [update(0, [4.0, 0.0], [2.0, -2.0], 1), update(1, [0.0, 4.0], [2.0, 6.0], 3)]
    out = algo.server_aggregate(ups, state, 1)
    assert out["model"]["w"].tolist() == [1.0, 3.0] and out["control"]["w"].tolist() == [2.0, 2.0]
    # η_g = 0.5: x = 0 + 0.5·((1, 3) - 0) = (0.5, 1.5); payload = (x, c), evaluation's = x alone
    half = get_algorithm("scaffold")(load_config(None, ["algorithm.name=scaffold", "algorithm.server_lr=0.5"]))
    stepped = half.server_aggregate(ups, half.init_server_state({"w": torch.zeros(2)}), 1)
    assert stepped["model"]["w"].tolist() == [0.5, 1.5]
    assert set(algo.server_payload(out, 2)) == {"model", "control"} and set(algo.eval_payload(out)) == {"model"}


# ---------------------------------------------------------------------------------------------- a client job
def _jobs(*extra: str):
    cfg = load_config(None, ["algorithm.name=scaffold", "data.name=sklearn_digits", "data.partition=iid",
                             "clients.num=4", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=6",
                             "train.lr=0.1", "train.batch_size=1000", "train.local_epochs=3", *extra])
    jobs = ClientJobs(cfg, build_federated_data(cfg))
    model = jobs.model(0)
    torch.manual_seed(0)
    x = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    c = {k: 0.01 * torch.randn_like(v) for k, v in x.items()}
    c_i = {k: 0.01 * torch.randn_like(v) for k, v in x.items()}
    return cfg, jobs, x, c, c_i


def test_a_client_job_is_sgd_on_the_corrected_gradient_then_option_two():
    """Full batches (batch_size ≥ n) and plain SGD: the job's model is K = 3 steps of y ← y − η(∇CE(y) + c − c_i)
    written out here, and it uploads y and Δc = c_i⁺ − c_i with c_i⁺ = c_i − c + (x − y)/(3·0.1), which it keeps."""
    cfg, jobs, x, c, c_i = _jobs()
    result, kept = jobs.train(TrainJob(client_id=0, round=2, payload_ref=None), {"model": x, "control": c}, None,
                              {"control": c_i})
    data_x, data_y, _ = jobs.data.tensors(0, "train")
    model = copy.deepcopy(jobs.model(0))
    model.load_state_dict(x)
    ces = []
    for _ in range(3):
        model.zero_grad()
        ce = F.cross_entropy(model(data_x), data_y)
        ce.backward()
        ces.append(ce.item())
        with torch.no_grad():
            for name, p in model.named_parameters():
                p -= 0.1 * (p.grad + c[name] - c_i[name])
    y = dict(model.named_parameters())
    assert set(result.upload) == {"model", "delta_control"}
    for name in x:
        assert torch.allclose(result.upload["model"][name], y[name], atol=1e-5), name
        c_new = c_i[name] - c[name] + (x[name] - result.upload["model"][name]) / (3 * 0.1)
        assert torch.allclose(kept["control"][name], c_new, atol=1e-5), name
        assert torch.allclose(result.upload["delta_control"][name], c_new - c_i[name], atol=1e-6), name
    # the logged loss is the cross-entropy alone (the correction term is 0 in value)
    assert result.loss == pytest.approx(sum(ces) / 3, rel=1e-5) and result.parts == {}


def test_option_one_keeps_the_full_local_gradient_at_x():
    cfg, jobs, x, c, c_i = _jobs("algorithm.control=1")
    _, kept = jobs.train(TrainJob(client_id=1, round=2, payload_ref=None), {"model": x, "control": c}, None,
                         {"control": c_i})
    data_x, data_y, _ = jobs.data.tensors(1, "train")
    model = copy.deepcopy(jobs.model(1))
    model.load_state_dict(x)
    F.cross_entropy(model(data_x), data_y).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(kept["control"][name], p.grad, atol=1e-6), name


# ---------------------------------------------------------------------------------------------- runs and config
def test_bytes_double_and_round_one_is_fedavg(tmp_path):
    def run(name, **extra):
        return run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name),
                                                               engine__backend="inline", **extra)))[1]

    fedavg, scaffold = run("fedavg", algorithm__name="fedavg"), run("scaffold", algorithm__name="scaffold")
    assert [r["bytes_up"] for r in scaffold] == [2 * r["bytes_up"] for r in fedavg]  # y_i and Δc_i
    # x alone before any client reported (c = {}), then x and c
    assert [r["bytes_down"] for r in scaffold] == [fedavg[0]["bytes_down"], 2 * fedavg[1]["bytes_down"]]
    # round 1: c = c_i = 0, so SCAFFOLD is FedAvg; round 2 corrects
    assert scaffold[0]["acc_global"] == fedavg[0]["acc_global"] and scaffold[0]["loss"] == fedavg[0]["loss"]
    assert scaffold[1]["loss"] != fedavg[1]["loss"]


def test_defaults_and_bad_values():
    a = load_config(None, ["algorithm.name=scaffold"]).algorithm
    assert (a.control, a.server_lr) == (2, 1.0)
    for override, key in (("algorithm.control=3", "algorithm.control"),
                          ("algorithm.server_lr=-1", "algorithm.server_lr")):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            load_config(None, ["algorithm.name=scaffold", override])


def test_option_two_with_momentum_or_adam_warns():
    from raysim.checks import config_warnings

    assert config_warnings(load_config(None, ["algorithm.name=scaffold", "train.momentum=0"])) == []
    (line,) = config_warnings(load_config(None, ["algorithm.name=scaffold", "train.momentum=0.9"]))
    assert "train.momentum=0.9" in line and "plain SGD" in line
    assert config_warnings(load_config(None, ["algorithm.name=scaffold", "train.optimizer=adam"]))
    assert config_warnings(load_config(None, ["algorithm.name=scaffold", "algorithm.control=1",
                                              "train.momentum=0.9"])) == []


def test_cli_bad_control_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.control", *tiny_overrides(tmp_path), "algorithm.name=scaffold", "algorithm.control=0")
    assert not (tmp_path / "run").exists()


def test_scaffold_on_ray_matches_one_worker_with_a_worker_killed(ray_cluster, tmp_path):
    rows = killed_worker_matches_inline(tmp_path, algorithm__name="scaffold")
    assert rows[-1]["acc_global"] > 0.2 and all(r["bytes_up"] > 0 for r in rows)


def test_resume_continues_c_and_every_c_i(tmp_path):
    """Two rounds, checkpoint, resume to four: the same metrics as four rounds straight (c and the optimiser's state
    in the server checkpoint, each c_i in its client file)."""
    def cfg(name, rounds):
        return load_config(None, tiny_overrides(tmp_path / name, rounds=rounds, engine__backend="inline",
                                                algorithm__name="scaffold", clients__fraction=0.5,
                                                data__partition="dirichlet"))

    _, straight, _ = run_experiment(cfg("straight", 4))
    run_experiment(cfg("resumed", 2))
    _, rest, _ = run_experiment(cfg("resumed", 4), resume=True)
    assert [r["round"] for r in rest] == [3, 4] and strip_timing(rest) == strip_timing(straight[2:])
