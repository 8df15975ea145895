"""FedPCL: the prototype-contrastive loss by hand, prototype averaging and prediction, model.weights and the offline
stand-in backbone (cache), the hooks without Ray, and a HETE run on Ray (workers 1 vs 2)."""

from __future__ import annotations

import math

import numpy as np

import pytest
import torch

from conftest import ROOT, read_rows, refused_config, tiny_overrides
from raysim.algorithms.base import ClientContext, ClientUpdate
from raysim.algorithms.fedpcl import (BACKBONES_KEY, GROUP_KEY, FrozenProjection, filled, mean_prototypes,
                                      own_prototype_logits, prototype_contrastive_loss, stand_in_backbone)
from raysim.config import ConfigError, load_config
from raysim.errors import UserError
from raysim.models import build_model
from raysim.registry import get_algorithm



# ---------------------------------------------------------------------------------------------- the math by hand
def test_prototype_contrastive_loss_by_hand():
    # features f0 = [1,0] (class 0), f1 = [0,1] (class 1), two identical views; prototypes P0 = [1,0], P1 = [0,1]
    # contrast set (view-major) [f0, f1, f0, f1]; anchor rows [P0, P1, P0, P1]; with tau = base_tau = 1:
    # row 0: logits P0·[f0,f1,f0,f1] = [1,0,1,0]; the diagonal (col 0) is left out of the denominator:
    #        e^0 + e^1 + e^0 = 2 + e; its one positive is col 2 (same class, not the diagonal): log_prob = 1 - log(2+e)
    # every row is the same by symmetry, so L = -(1/1)·(1 - log(2+e)) = log(2+e) - 1 = 0.5514...
    f = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    views = torch.stack([f, f], dim=1)
    y = torch.tensor([0, 1])
    protos, present = torch.eye(2), torch.tensor([True, True])
    loss = prototype_contrastive_loss(views, y, protos, present, tau=1.0, base_tau=1.0)
    assert loss.item() == pytest.approx(math.log(2 + math.e) - 1)
    # the tau / base_tau factor; and at the default tau = base_tau = 0.07 the logits are 1/0.07 apart:
    # each row -(1/0.07 - log(2 + e^(1/0.07))) with the row max (1/0.07) subtracted first
    assert prototype_contrastive_loss(views, y, protos, present, 1.0, 0.5).item() == pytest.approx(2 * loss.item())
    t = 1 / 0.07
    got = prototype_contrastive_loss(views.double(), y, protos.double(), present).item()  # float64: e^-14.3 terms
    assert got == pytest.approx(math.log(2 + math.exp(t)) - t, rel=1e-9)


def _reference_conloss(features, labels, protos, tau, base_tau):
    """The authors' ConLoss written as loops over anchors and contrasts (lib/losses.py, contrast_mode 'all')."""
    bsz, views = features.shape[:2]
    contrast = [features[b, v] for v in range(views) for b in range(bsz)]
    lab = [int(labels[b]) for _ in range(views) for b in range(bsz)]
    total = 0.0
    for i in range(len(contrast)):
        anchor = protos[lab[i]]
        logits = [float(anchor @ c) / tau for c in contrast]
        denom = sum(math.exp(l) for j, l in enumerate(logits) if j != i)
        pos = [logits[j] - math.log(denom) for j in range(len(contrast)) if j != i and lab[j] == lab[i]]
        total += -(tau / base_tau) * sum(pos) / len(pos)
    return total / len(contrast)


def test_contrastive_loss_matches_the_authors_loops():
    torch.manual_seed(0)
    f = torch.nn.functional.normalize(torch.randn(6, 2, 5), dim=2)
    y = torch.tensor([0, 1, 2, 0, 1, 1])
    protos = torch.nn.functional.normalize(torch.randn(3, 5), dim=1)
    got = prototype_contrastive_loss(f, y, protos, torch.ones(3, dtype=torch.bool), 0.5, 0.07)
    assert got.item() == pytest.approx(_reference_conloss(f, y, protos, 0.5, 0.07), rel=1e-5)


def test_plain_mean_of_prototypes_and_the_fill_by_hand():
    # client A: class 0 [1,2], class 1 [0,4] (counts 5, 1); client B: class 0 [3,0] (count 9)
    # authors' proto_aggregation: each holder weighs 1 -> class 0 ([1,2] + [3,0]) / 2 = [2,1]; class 1 [0,4]
    a = (torch.tensor([[1.0, 2.0], [0.0, 4.0]]), torch.tensor([5, 1, 0], dtype=torch.int32))
    b = (torch.tensor([[3.0, 0.0]]), torch.tensor([9, 0, 0], dtype=torch.int32))
    protos, holders = mean_prototypes([a, b])
    assert torch.allclose(protos, torch.tensor([[2.0, 1.0], [0.0, 4.0]])) and holders.tolist() == [2, 1, 0]
    # B lacks class 1: its set is filled with the global [0,4]; class 2 has no prototype anywhere
    g_dense = torch.tensor([[2.0, 1.0], [0.0, 4.0], [0.0, 0.0]])
    dense, present = filled(*b, g_dense, torch.tensor([True, True, False]))
    assert torch.equal(dense, torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0]]))
    assert present.tolist() == [True, True, False]


def test_prediction_by_the_nearest_own_prototype_by_hand():
    # z = [1,1]; own prototypes: class 0 [0,0] (mean sq. distance 1), class 2 [1,2] (0.5); class 1 not held
    logits = own_prototype_logits(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 0.0], [1.0, 2.0]]),
                                  torch.tensor([3, 0, 2], dtype=torch.int32))
    assert logits[0, 0].item() == -1.0 and logits[0, 1].item() == float("-inf") and logits[0, 2].item() == -0.5
    assert logits.argmax().item() == 2


# ---------------------------------------------------------------------------------------------- model.weights
def test_model_weights_file_loads_and_errors_name_the_key(tmp_path):
    # a missing file: one line naming the key and the file expected
    with pytest.raises(ConfigError, match=r"^config key 'model\.weights': file not found: /nonexistent/bb\.pt"):
        load_config(None, ["model.weights=/nonexistent/bb.pt"])
    with pytest.raises(ConfigError, match=r"model\.weights': a list must have one entry per client"):
        load_config(None, ["clients.num=3", "model.weights=[null,null]"])
    # the backbone's own format: a model built with it starts from those weights (the head is unchanged)
    base = ["model.name=mlp", "model.hidden=[8]", "model.feature_dim=4"]
    donor = build_model(load_config(None, base + ["seed=7"]), "mlp", (5,), 3)
    path = tmp_path / "mlp.pt"
    torch.save(donor.backbone.state_dict(), path)
    model = build_model(load_config(None, base + [f"model.weights={path}"]), "mlp", (5,), 3)
    plain = build_model(load_config(None, base), "mlp", (5,), 3)
    assert all(torch.equal(v, donor.backbone.state_dict()[k]) for k, v in model.backbone.state_dict().items())
    assert torch.equal(model.head.weight, plain.head.weight)
    # a shape mismatch names the key
    with pytest.raises(UserError, match=r"config key 'model\.weights': .*'1\.weight' has shape \[8, 5\]"):
        build_model(load_config(None, ["model.hidden=[16]", "model.feature_dim=4", f"model.weights={path}"]),
                    "mlp", (5,), 3)
    # torchvision's format for a ResNet wrapped in its linear adapter (feature_dim != 512): keys without the "0.",
    # an ImageNet classifier (fc.*) ignored, the adapter left as initialised
    cfg = load_config(None, ["model.name=resnet10", "model.feature_dim=16"])
    net = build_model(cfg, "resnet10", (3, 8, 8), 10).backbone
    tv = {k[2:]: torch.randn_like(v) if v.is_floating_point() else v for k, v in net.state_dict().items()
          if k.startswith("0.")}
    tv.update({"fc.weight": torch.zeros(1000, 512), "fc.bias": torch.zeros(1000)})
    torch.save(tv, tmp_path / "resnet10.pt")
    loaded = build_model(load_config(None, ["model.name=resnet10", "model.feature_dim=16",
                                            f"model.weights={tmp_path / 'resnet10.pt'}"]), "resnet10", (3, 8, 8), 10)
    assert torch.equal(loaded.backbone[0].conv1.weight, tv["conv1.weight"])
    assert torch.equal(loaded.backbone[1].weight, net[1].weight)


# ---------------------------------------------------------------------------------------------- stand-in and hooks
def _tiny_cfg(tmp_path, *extra: str):
    return load_config(None, tiny_overrides(tmp_path, algorithm__name="fedpcl", algorithm__pretrain__epochs=2,
                                            algorithm__pretrain__cache_dir=str(tmp_path / "cache"),
                                            algorithm__proj_dim=8, data__server_holdout=0.1) + list(extra))


def test_stand_in_backbone_is_pretrained_on_the_servers_holdout_and_cached(tmp_path, capsys):
    from raysim.data import build_federated_data

    cfg = _tiny_cfg(tmp_path)
    algo = get_algorithm("fedpcl")(cfg)
    before = build_federated_data(cfg)  # what every method of this config trains on (holdout already taken)
    data = algo.prepare_data(build_federated_data(cfg))
    # fedpcl's clients keep exactly the training samples every other method's clients keep: nothing more is carved
    assert all(np.array_equal(a.train, b.train) for a, b in zip(before.clients, data.clients))
    full = build_federated_data(load_config(None, tiny_overrides(tmp_path, data__server_holdout=0.0)))
    for cid, split in enumerate(data.clients):  # 10% of each client went to the server, for every method alike
        held = data.holdout_by_client[cid]
        assert len(held) == round(0.1 * len(full.clients[cid].train)) and not np.intersect1d(held, split.train).size
        assert np.array_equal(np.sort(np.concatenate([held, split.train])), np.sort(full.clients[cid].train))
    assert set(data.meta[GROUP_KEY].values()) == {"mlp:1x8x8"}  # one architecture and input shape: one backbone
    sd = data.meta[BACKBONES_KEY]["mlp:1x8x8"]
    assert "stand-in" in capsys.readouterr().err and len(list((tmp_path / "cache").glob("*.pt"))) == 1
    # the second time it comes from the cache, bit for bit
    again = algo.prepare_data(build_federated_data(cfg)).meta[BACKBONES_KEY]["mlp:1x8x8"]
    assert "pre-trained" not in capsys.readouterr().err and all(torch.equal(sd[k], again[k]) for k in sd)
    # the stand-in is what central training on the held-out samples gives (same recipe, another cache directory)
    fresh = stand_in_backbone(_tiny_cfg(tmp_path, f"algorithm.pretrain.cache_dir={tmp_path / 'other'}"), data,
                              list(range(len(data.clients))), dict(enumerate(data.holdout_by_client)))
    assert all(torch.equal(sd[k], fresh[k]) for k in sd)
    # with model.weights nobody needs a stand-in
    path = tmp_path / "w.pt"
    torch.save(sd, path)
    cfg_w = _tiny_cfg(tmp_path, f"model.weights={path}")
    data_w = get_algorithm("fedpcl")(cfg_w).prepare_data(build_federated_data(cfg_w))
    assert set(data_w.meta[GROUP_KEY].values()) == {None}
    # without a holdout there is nothing no client holds: a one-line error naming the key, not a carved split
    cfg_0 = _tiny_cfg(tmp_path, "data.server_holdout=0")
    with pytest.raises(UserError, match="'data.server_holdout'"):
        get_algorithm("fedpcl")(cfg_0).prepare_data(build_federated_data(cfg_0))

    # ------------------------------------------------------------- the hooks on that data, no Ray
    model = build_model(cfg, "mlp", (1, 8, 8), 10, 0, algo)
    assert isinstance(model.backbone, FrozenProjection) and model.head.in_features == 8
    x, y, idx = data.tensors(0, "train")
    x, y = x[:40], y[:40]

    def ctx(payload, state, rnd):
        return ClientContext(client_id=0, round=rnd, total_rounds=3, epoch=0, num_epochs=1, payload=payload,
                             state=state, meta=data.meta, num_classes=10, train_data=(x, y, idx[:40]))

    c1 = ctx({}, {}, 1)
    algo.client_setup(model, c1)
    assert all(torch.equal(model.backbone.frozen.state_dict()[k], sd[k]) for k in sd)  # the stand-in is loaded
    model.train()
    assert not model.backbone.frozen.training  # the frozen backbone stays in eval mode
    phase = algo.local_phases(model, c1)
    assert {id(p) for p in phase[0][0]} == {id(p) for p in model.backbone.proj.parameters()}
    loss, _ = algo.client_loss(model, x, y, c1)
    assert loss.item() == 0  # round 1: no prototypes yet (the authors' 0 * loss1)
    up = algo.client_upload(model, c1)
    k = int((up["counts"] > 0).sum())
    assert up["protos"].shape == (k, 8) and int(up["counts"].sum()) == 40
    keep = algo.client_keep(model, c1)
    assert set(keep) == {"model", "protos", "counts"} and not any("frozen" in key for key in keep["model"])
    # the server: newest local prototypes per client, their plain mean; the payload holds all of them
    state = algo.init_server_state({})
    assert algo.server_payload(state, 1) == {}
    other = {"protos": up["protos"] + 1, "counts": up["counts"]}
    state = algo.server_aggregate([ClientUpdate(0, up, 40), ClientUpdate(2, other, 40)], state, 1)
    assert torch.allclose(state["protos"], up["protos"] + 0.5)
    payload = algo.server_payload(state, 2)
    assert len(payload["local_protos"]) == 2 and torch.equal(payload["local_protos"][1], other["protos"])
    # round 2: the loss is the sum of the contrast with each client's (filled) prototypes; only the projection learns
    c2 = ctx(dict(payload), dict(keep), 2)
    algo.client_setup(model, c2)
    loss, parts = algo.client_loss(model, x, y, c2)
    z = model.features(x).detach()
    views = torch.stack([z, z], 1)
    want = sum(prototype_contrastive_loss(views, y, *filled(p, n, *mean_dense(state)), 0.07, 0.07)
               for p, n in ((up["protos"], up["counts"]), (other["protos"], other["counts"])))
    assert loss.item() == pytest.approx(want.item(), rel=1e-5) and loss.item() > 0
    model.zero_grad(set_to_none=True)
    loss.backward()
    assert model.backbone.proj.weight.grad is not None
    assert all(p.grad is None for p in model.backbone.frozen.parameters())
    # prediction: the nearest of the client's own prototypes (kept in its state)
    c3 = ctx({}, dict(keep), -1)
    algo.eval_setup(model, c3)
    assert torch.equal(algo.predict(model, x, c3), own_prototype_logits(model.features(x), keep["protos"],
                                                                        keep["counts"]))


def mean_dense(state):
    from raysim.algorithms.fedproto import dense_prototypes

    return dense_prototypes(state["protos"], state["counts"])


# ---------------------------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("override, key", [("algorithm.tau=0", "algorithm.tau"),
                                           ("algorithm.base_tau=-1", "algorithm.base_tau"),
                                           ("algorithm.proj_dim=0", "algorithm.proj_dim"),
                                           ("algorithm.global_weight=-1", "algorithm.global_weight"),
                                           ("algorithm.pretrain.epochs=0", "algorithm.pretrain.epochs")])
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, ["algorithm.name=fedpcl", override])


def test_bad_values_through_the_cli_exit_2(tmp_path):
    for bad, key in (("algorithm.tau=-0.1", "algorithm.tau"), ("model.weights=/nonexistent/bb.pt", "model.weights")):
        refused_config(key, *tiny_overrides(tmp_path, algorithm__name="fedpcl"), bad)


def test_experiment_configs_load():
    from raysim.config import to_flat_dict

    paths = sorted((ROOT / "experiments" / "unideal").glob("*/fedpcl.yaml"))
    assert len(paths) == 12  # every setting, HETE included: only prototypes travel
    recipes = set()
    for path in paths:
        flat = to_flat_dict(load_config(path))
        assert flat["algorithm.name"] == "fedpcl"
        recipes.add(tuple(sorted((k, str(v)) for k, v in flat.items() if k.startswith("algorithm.")
                                 or k in ("train.optimizer", "train.lr", "train.weight_decay"))))
    assert len(recipes) == 1  # one recipe (the authors' optimiser and loss) in every setting


# ---------------------------------------------------------------------------------------------- a whole run
def test_hete_run_sends_prototypes_only_and_learns(tmp_path):
    """HETE (cnn, mlp, mlp_hete, mlp): only prototypes travel."""
    from raysim.engine.runner import run_experiment

    overrides = tiny_overrides(tmp_path, algorithm__name="fedpcl", rounds=3, model__name="[cnn,mlp,mlp_hete,mlp]",
                               model__width=8, train__optimizer="adam", train__lr=0.001, train__weight_decay=0.0001,
                               algorithm__pretrain__epochs=3, algorithm__pretrain__cache_dir=str(tmp_path / "c"),
                               data__server_holdout=0.1)
    run_dir, _, _ = run_experiment(load_config(None, overrides))
    rows = read_rows(run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in rows)
    assert {"loss_con", "proto_classes", "acc_mean", "bytes_up", "bytes_down"} <= set(rows[-1])
    assert "acc_global" not in rows[-1]
    # iid: every client holds all 10 classes; up: 10 x 256 prototype floats + 10 counts per client; down: nothing
    # in round 1, then the global set and the 4 clients' local sets, to each of the 4 clients
    per_set = (10 * 256 + 10) * 4
    assert all(r["bytes_up"] == 4 * per_set for r in rows)
    assert rows[0]["bytes_down"] == 0 and all(r["bytes_down"] == 4 * 5 * per_set for r in rows[1:])
    assert rows[0]["loss_con"] == 0 and all(r["loss_con"] > 0 for r in rows[1:])
    assert rows[-1]["proto_classes"] == 10 and rows[-1]["acc_mean"] > 0.3, rows


def test_stand_in_cache_follows_the_data_cache(tmp_path, monkeypatch):
    """No algorithm.pretrain.cache_dir: the stand-in lives beside the data cache ($RAYSIM_CACHE honoured)."""
    from raysim.algorithms.fedpcl import _cache_root

    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "rc"))
    assert _cache_root(load_config(None, ["algorithm.name=fedpcl"])) == tmp_path / "rc" / "fedpcl-backbone"
    cfg = load_config(None, ["algorithm.name=fedpcl", f"data.cache_dir={tmp_path / 'dc'}"])
    assert _cache_root(cfg) == tmp_path / "dc" / "fedpcl-backbone"
    cfg = load_config(None, ["algorithm.name=fedpcl", f"algorithm.pretrain.cache_dir={tmp_path / 'own'}"])
    assert _cache_root(cfg) == tmp_path / "own"
