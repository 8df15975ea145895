"""FedNova: a_i by hand (plain, momentum, proximal), the normalised server step by hand, a client job's step count
and upload, equal step counts give FedAvg, and bad values."""

from __future__ import annotations

import pytest
import torch
from conftest import refused_config

from raysim.algorithms.base import ClientUpdate
from raysim.algorithms.fednova import normalizing_vector
from raysim.algorithms.training import batch_bounds
from raysim.config import ConfigError, load_config
from raysim.data import build_federated_data
from raysim.engine.core import ClientJobs
from raysim.engine.jobs import TrainJob
from raysim.registry import get_algorithm


def test_normalizing_vector_by_hand():
    # plain SGD: a_i = τ_i
    assert normalizing_vector(3) == 3.0
    # momentum ρ = 0.5, τ = 3: counters 1, 1 + 0.5 = 1.5, 1.5·0.5 + 1 = 1.75; a = 1 + 1.5 + 1.75 = 4.25
    #   closed form [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ) = [3 − 0.5·0.875/0.5]/0.5 = 2.125/0.5 = 4.25
    assert normalizing_vector(3, momentum=0.5) == 4.25
    # proximal ημ = 0.1, τ = 3: 1, 1·0.9 + 1 = 1.9, 1.9·0.9 + 1 = 2.71 = (1 − 0.9³)/0.1
    assert normalizing_vector(3, eta_mu=0.1) == pytest.approx(2.71, abs=1e-12)
    assert normalizing_vector(0) == 0.0


def _update(cid: int, y: list[float], steps: int, n: int) -> ClientUpdate:
    """What a client that moved from x = 0 to y in ``steps`` plain steps uploads: d = (x − y)/τ, a = τ = steps."""
    d = -torch.tensor(y, dtype=torch.float64) / steps
    tau = torch.tensor(float(steps), dtype=torch.float64)
    return ClientUpdate(cid, {"d": {"w": d.float()}, "buffers": {}, "a": tau, "tau": tau.clone()}, n)


def test_server_step_by_hand():
    # x = (0, 0). A: n = 1, τ = 2, y = (2, 0): d_A = (−1, 0). B: n = 3, τ = 4, y = (0, 4): d_B = (0, −1).
    # p = (1/4, 3/4): Σ p d = (−0.25, −0.75); τ_eff = 2/4 + 3·4/4 = 3.5; x ← 0 − 3.5·(−0.25, −0.75) = (0.875, 2.625)
    # (FedAvg: Σ p y = (0.5, 3): B, with twice the steps, pulls it further towards its own optimum)
    algo = get_algorithm("fednova")(load_config(None, ["algorithm.name=fednova"]))
    state = algo.init_server_state({"w": torch.zeros(2)})
    out = algo.server_aggregate([_update(0, [2.0, 0.0], 2, 1), _update(1, [0.0, 4.0], 4, 3)], state, 1)
    assert out["model"]["w"].tolist() == [0.875, 2.625]
    # equal steps (τ = 2 each): τ_eff = 2, x = −2·(−0.25, −0.75)·... = Σ p y = (0.5, 3): FedAvg
    same = algo.server_aggregate([_update(0, [2.0, 0.0], 2, 1), _update(1, [0.0, 4.0], 2, 3)],
                                 algo.init_server_state({"w": torch.zeros(2)}), 1)
    assert same["model"]["w"].tolist() == [0.5, 3.0]
    # server momentum gmf = 0.5: round 1 v = (0.875, 2.625), x = (0.875, 2.625); round 2 with the same updates
    # (from x, so y is relative: d unchanged) v = 0.5·v + step = 1.5·(0.875, 2.625), x = x − ... = 2.5·(0.875, 2.625)
    gmf = get_algorithm("fednova")(load_config(None, ["algorithm.name=fednova", "algorithm.server_momentum=0.5"]))
    st = gmf.init_server_state({"w": torch.zeros(2)})
    ups = [_update(0, [2.0, 0.0], 2, 1), _update(1, [0.0, 4.0], 4, 3)]
    st = gmf.server_aggregate(ups, st, 1)
    assert st["model"]["w"].tolist() == [0.875, 2.625]
    st = gmf.server_aggregate(ups, st, 2)
    assert st["model"]["w"].tolist() == pytest.approx([2.5 * 0.875, 2.5 * 2.625])


def test_a_client_job_counts_its_steps_and_normalises():
    """Batches of 16, two epochs: τ_i is the job's batches times its epochs (counted step by step), a_i with
    momentum 0.9 the authors' recursion, and d_i·a_i = x − y_i for every parameter."""
    cfg = load_config(None, ["algorithm.name=fednova", "data.name=sklearn_digits", "data.partition=iid",
                             "clients.num=4", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=6",
                             "train.lr=0.1", "train.batch_size=16", "train.local_epochs=2", "train.momentum=0.9"])
    jobs = ClientJobs(cfg, build_federated_data(cfg))
    x = {k: v.clone() for k, v in jobs.model(0).state_dict().items()}
    result, _ = jobs.train(TrainJob(client_id=0, round=1, payload_ref=None), {"model": x}, None, None)
    n = len(jobs.data.tensors(0, "train")[1])
    steps = 2 * len(batch_bounds(n, 16))
    up = result.upload
    assert up["tau"].item() == steps and up["a"].item() == pytest.approx(normalizing_vector(steps, 0.9))
    # the same job under FedAvg (the same loss, seed and steps) uploads y_i itself: x − a_i·d_i is it
    fedavg = ClientJobs(cfg, jobs.data, algorithm=get_algorithm("fedavg")(cfg))
    y, _ = fedavg.train(TrainJob(client_id=0, round=1, payload_ref=None), {"model": x}, None, None)
    assert set(up["d"]) == {k for k, _ in jobs.model(0).named_parameters()}
    for key, d in up["d"].items():
        assert not torch.equal(d, torch.zeros_like(d)), key  # it trained
        assert torch.allclose(x[key] - up["a"].item() * d, y.upload[key], atol=1e-6), key


def test_bad_values_and_adam_refused(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.server_momentum"):
        load_config(None, ["algorithm.name=fednova", "algorithm.server_momentum=1.0"])
    with pytest.raises(ConfigError, match="algorithm.mu"):
        load_config(None, ["algorithm.name=fednova", "algorithm.mu=-1"])
    refused_config("train.optimizer", "experiments/beyond/tiny-fednova.yaml", "train.optimizer=adam",
                   "engine.backend=inline", "log.tensorboard=false", f"log.dir={tmp_path / 'run'}")
    assert not (tmp_path / "run").exists()  # nothing half-written
