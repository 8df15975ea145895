"""FedBN: which entries are batch norm, the kept statistics worked by hand through upload, aggregation and the next
round's setup, bytes, the one-line refusal of a model without batch norm, and a run on Ray (one vs two workers with
one killed: the batch-norm layers are client state)."""

from __future__ import annotations

import pytest
import torch
from conftest import context, killed_worker_matches_inline, refused_config, tiny_overrides
from torch import nn

from raysim.algorithms.base import ClientUpdate, batchnorm_keys
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.models import ClassifierModel, build_model
from raysim.registry import get_algorithm


def test_batchnorm_keys_of_the_zoo():
    cfg = load_config(None, ["model.feature_dim=8", "model.width=4"])
    bn = build_model(cfg, "cnn_bn", (1, 8, 8), 10).state_dict()
    assert batchnorm_keys(bn) == {f"backbone.{i}.{name}" for i in (1, 5, 10)
                                  for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    assert batchnorm_keys(build_model(cfg, "cnn", (1, 8, 8), 10).state_dict()) == set()
    resnet = build_model(cfg, "resnet10", (3, 16, 16), 10).state_dict()
    keys = batchnorm_keys(resnet)
    assert "backbone.0.layer2.0.downsample.1.running_var" in keys and "backbone.0.bn1.weight" in keys
    assert not any("conv" in k or k.startswith("head.") for k in keys)


def _tiny() -> ClassifierModel:
    """Linear(2, 2) = identity, then BatchNorm1d(2): the batch norm sees the raw inputs."""
    model = ClassifierModel(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), 2, 2)
    with torch.no_grad():
        model.backbone[0].weight.copy_(torch.eye(2))
        model.backbone[0].bias.zero_()
    return model


def test_each_client_keeps_its_own_batch_norm_statistics_by_hand():
    # momentum 0.1, running mean 0 and variance 1 at first; the variance is the unbiased batch variance
    #   A's batch (1, 2), (3, 6): mean (2, 4), var ((1+1)/1, (4+4)/1) = (2, 8)
    #       running mean 0.1·(2, 4) = (0.2, 0.4);  running var 0.9·1 + 0.1·(2, 8) = (1.1, 1.7)
    #   B's batch (0, 0), (0, 2): mean (0, 1), var (0, 2) -> running mean (0, 0.1), running var (0.9, 1.1)
    algo = get_algorithm("fedbn")(load_config(None, ["algorithm.name=fedbn"]))
    initial = _tiny().state_dict()
    server = algo.init_server_state(initial)
    assert set(server["model"]) == {"backbone.0.weight", "backbone.0.bias", "head.weight", "head.bias"}
    updates, kept = [], {}
    for cid, (batch, shift, n) in enumerate(((torch.tensor([[1.0, 2.0], [3.0, 6.0]]), 1.0, 1),
                                             (torch.tensor([[0.0, 0.0], [0.0, 2.0]]), 3.0, 3))):
        model = _tiny()
        model.train()
        model(batch)  # the forward pass in train mode updates the running statistics
        with torch.no_grad():  # stands in for local training: A's linear weights move by 1, B's by 3
            model.backbone[0].weight.add_(shift)
            model.backbone[1].weight.add_(shift)  # γ moves too, and stays local
        ctx = context(client_id=cid)
        upload = algo.client_upload(model, ctx)
        kept[cid] = algo.client_keep(model, ctx)
        assert set(upload) == set(server["model"]) and set(kept[cid]) == batchnorm_keys(initial)
        updates.append(ClientUpdate(cid, upload, n))
    assert kept[0]["backbone.1.running_mean"].tolist() == pytest.approx([0.2, 0.4])
    assert kept[0]["backbone.1.running_var"].tolist() == pytest.approx([1.1, 1.7])
    assert kept[1]["backbone.1.running_mean"].tolist() == pytest.approx([0.0, 0.1])
    assert kept[1]["backbone.1.running_var"].tolist() == pytest.approx([0.9, 1.1])
    server = algo.server_aggregate(updates, server, 1)
    # the next round (and evaluation): the average of the linear layer (identity + (1·1 + 3·3)/4 = identity + 2.5)
    # over the client's own batch norm, γ included
    for cid, gamma in ((0, 2.0), (1, 4.0)):
        model = _tiny()
        ctx = context(client_id=cid, round=2, payload=algo.server_payload(server, 2), state=kept[cid])
        algo.client_setup(model, ctx)
        assert torch.allclose(model.backbone[0].weight, torch.eye(2) + 2.5)
        assert torch.equal(model.backbone[1].running_mean, kept[cid]["backbone.1.running_mean"])
        assert torch.equal(model.backbone[1].running_var, kept[cid]["backbone.1.running_var"])
        assert model.backbone[1].weight.tolist() == [gamma, gamma]
    assert not algo.has_global_model


def test_a_model_without_batch_norm_is_refused_in_one_line(tmp_path):
    line = refused_config("model.name", *tiny_overrides(tmp_path, engine__backend="inline"), "algorithm.name=fedbn")
    assert "mlp has none" in line and "cnn_bn" in line
    assert not (tmp_path / "run").exists()


def test_fedbn_bytes_leave_batch_norm_out_and_it_differs_from_fedavg(tmp_path):
    def run(name, algorithm):
        cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), engine__backend="inline",
                                               algorithm__name=algorithm, model__name="cnn_bn", model__width=4,
                                               data__partition="dirichlet"))
        return run_experiment(cfg)[1]

    fedbn, fedavg = run("fedbn", "fedbn"), run("fedavg", "fedavg")
    # 4 clients; batch norm over 4 + 8 + 16 channels: (γ, β, mean, var) floats and one int64 counter per layer
    bn_bytes = 4 * (4 * 4 * (4 + 8 + 16) + 3 * 8)
    assert [r["bytes_up"] for r in fedbn] == [r["bytes_up"] - bn_bytes for r in fedavg]
    assert [r["bytes_down"] for r in fedbn] == [r["bytes_down"] - bn_bytes for r in fedavg]
    assert "acc_global" not in fedbn[-1] and fedbn[-1]["acc_mean"] != fedavg[-1]["acc_mean"]


def test_fedbn_on_ray_matches_one_worker_with_a_worker_killed(ray_cluster, tmp_path):
    rows = killed_worker_matches_inline(tmp_path, algorithm__name="fedbn", model__name="cnn_bn", model__width=8)
    assert rows[-1]["acc_mean"] > 0.2
