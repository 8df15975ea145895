"""FedProto: the prototype math by hand, the hooks without Ray, and tiny runs on the 2-CPU Ray (workers 1 vs 2,
a killed worker, HETE architectures, bytes on the wire)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, context, read_rows, refused_config, tiny_overrides
from raysim.algorithms.base import ClientContext, ClientUpdate
from raysim.algorithms.fedproto import (aggregate_prototypes, class_prototypes, dense_prototypes, prototype_logits,
                                        proto_regulariser)
from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm



# ---------------------------------------------------------------------------------------------- the math by hand
def test_class_prototypes_by_hand():
    # class 0: mean of [1,0] and [3,2] = [2,1]; class 1: none; class 2: [5,5]
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    protos, counts = class_prototypes(feats, torch.tensor([0, 0, 2]), num_classes=3)
    assert torch.equal(protos, torch.tensor([[2.0, 1.0], [5.0, 5.0]])) and protos.dtype == torch.float32
    assert torch.equal(counts, torch.tensor([2, 0, 1], dtype=torch.int32))
    dense, present = dense_prototypes(protos, counts)
    assert torch.equal(dense, torch.tensor([[2.0, 1.0], [0.0, 0.0], [5.0, 5.0]]))
    assert present.tolist() == [True, False, True]


def test_count_weighted_average_by_hand():
    # client A: class 0 mean [1,2] (2 samples), class 1 mean [0,4] (1 sample)
    # client B: class 0 mean [4,8] (1 sample),  class 2 mean [3,3] (3 samples)
    # client C: class 1 mean [6,1] (2 samples)
    # class 0: (2*[1,2] + 1*[4,8]) / 3 = [6,12]/3 = [2,4]          (plain mean over clients: [2.5,5])
    # class 1: (1*[0,4] + 2*[6,1]) / 3 = [12,6]/3 = [4,2]          (plain mean: [3,2.5])
    # class 2: [3,3] (only B);  class 3: nobody -> no prototype; counts [3,3,3,0]
    a = (torch.tensor([[1.0, 2.0], [0.0, 4.0]]), torch.tensor([2, 1, 0, 0], dtype=torch.int32))
    b = (torch.tensor([[4.0, 8.0], [3.0, 3.0]]), torch.tensor([1, 0, 3, 0], dtype=torch.int32))
    c = (torch.tensor([[6.0, 1.0]]), torch.tensor([0, 2, 0, 0], dtype=torch.int32))
    protos, counts = aggregate_prototypes([a, b, c])
    assert torch.allclose(protos, torch.tensor([[2.0, 4.0], [4.0, 2.0], [3.0, 3.0]]))
    assert counts.tolist() == [3, 3, 3, 0]
    # the same through the hook, from ClientUpdates; the payload carries exactly this
    algo = get_algorithm("fedproto")(load_config(None, ["algorithm.name=fedproto"]))
    state = algo.init_server_state({})
    assert algo.server_payload(state, 1) == {}  # round 1: no prototypes
    updates = [ClientUpdate(i, {"protos": p, "counts": n}, num_samples=int(n.sum())) for i, (p, n) in
               enumerate([a, b, c])]
    state = algo.server_aggregate(updates, state, 1)
    payload = algo.server_payload(state, 2)
    assert torch.allclose(payload["protos"], protos) and torch.equal(payload["counts"], counts)
    assert algo.on_round_end(1, {}, state) == {"proto_classes": 3}
    torch.save(state, "/dev/null")  # checkpointable


def test_plain_mean_aggregation_two_clients_by_hand():
    # the authors' proto_aggregation (algorithm.aggregation=mean): each client holding a class weighs 1
    # client A: class 0 mean [1, 2] (3 samples), class 1 mean [0, 4] (1 sample)
    # client B: class 0 mean [5, 6] (1 sample),  class 2 mean [3, 3] (2 samples)
    # mean:           class 0: ([1,2] + [5,6]) / 2 = [3, 4]; class 1: [0, 4]; class 2: [3, 3]
    # count-weighted: class 0: (3*[1,2] + 1*[5,6]) / 4 = [8, 12]/4 = [2, 3]
    a = (torch.tensor([[1.0, 2.0], [0.0, 4.0]]), torch.tensor([3, 1, 0], dtype=torch.int32))
    b = (torch.tensor([[5.0, 6.0], [3.0, 3.0]]), torch.tensor([1, 0, 2], dtype=torch.int32))
    protos, counts = aggregate_prototypes([a, b], "mean")
    assert torch.equal(protos, torch.tensor([[3.0, 4.0], [0.0, 4.0], [3.0, 3.0]]))
    assert counts.tolist() == [4, 1, 2]  # the counts still travel summed
    assert torch.equal(aggregate_prototypes([a, b])[0][0], torch.tensor([2.0, 3.0]))
    algo = get_algorithm("fedproto")(load_config(None, ["algorithm.name=fedproto", "algorithm.aggregation=mean"]))
    updates = [ClientUpdate(i, {"protos": p, "counts": n}, num_samples=int(n.sum())) for i, (p, n) in enumerate([a, b])]
    state = algo.server_aggregate(updates, algo.init_server_state({}), 1)
    assert torch.equal(state["protos"], protos)
    with pytest.raises(Exception, match="'algorithm.aggregation'"):
        load_config(None, ["algorithm.name=fedproto", "algorithm.aggregation=median"])


def test_regulariser_by_hand():
    # f = [[1,2],[3,4],[0,0]], y = [0,1,2]; C̄0 = [0,0], C̄1 = [3,2], class 2 has no global prototype
    # sample 0: (1-0)² + (2-0)² = 5; sample 1: 0 + (4-2)² = 4; sample 2: no prototype -> 0
    # authors' MSELoss: (5 + 4 + 0) / (B*d = 3*2) = 1.5
    f = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]], requires_grad=True)
    protos = torch.tensor([[0.0, 0.0], [3.0, 2.0], [0.0, 0.0]])
    present = torch.tensor([True, True, False])
    reg = proto_regulariser(f, torch.tensor([0, 1, 2]), protos, present)
    assert reg.item() == pytest.approx(1.5)
    reg.backward()  # d/df = 2 (f - C̄) / 6 on rows with a prototype, 0 elsewhere
    assert torch.allclose(f.grad, torch.tensor([[2 / 6, 4 / 6], [0.0, 4 / 6], [0.0, 0.0]]))
    # the same as the authors' nn.MSELoss on a copy with rows replaced by their prototype
    g = f.detach().clone()
    target = g.clone()
    target[0], target[1] = protos[0], protos[1]
    assert torch.nn.MSELoss()(target, g).item() == pytest.approx(1.5)


def _hooks(*extra: str):
    cfg = load_config(None, ["algorithm.name=fedproto", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=2",
                             "train.batch_size=4", *extra])
    torch.manual_seed(0)
    return cfg, get_algorithm("fedproto")(cfg), build_model(cfg, "mlp", (5,), 3)


def _ctx(payload: dict, x: torch.Tensor, y: torch.Tensor, rnd: int = 2) -> ClientContext:
    return ClientContext(client_id=0, round=rnd, total_rounds=3, epoch=0, num_epochs=1, payload=payload,
                         num_classes=3, train_data=(x, y, torch.arange(len(y))))


def test_client_loss_upload_and_keep():
    cfg, algo, model = _hooks("algorithm.ld=0.5")
    x, y = torch.randn(4, 5), torch.tensor([0, 1, 2, 0])
    # round 1: no payload, plain CE and a zero regulariser
    loss, parts = algo.client_loss(model, x, y, _ctx({}, x, y, rnd=1))
    assert loss.item() == pytest.approx(F.cross_entropy(model(x), y).item()) and parts["proto"].item() == 0
    # with global prototypes for classes 0 and 2 only: CE + 0.5 * the authors' MSE
    payload = {"protos": torch.tensor([[1.0, -1.0], [0.5, 2.0]]), "counts": torch.tensor([4, 0, 2], dtype=torch.int32)}
    loss, parts = algo.client_loss(model, x, y, _ctx(dict(payload), x, y))
    f = model.features(x).detach()
    target = f.clone()
    target[0] = target[3] = torch.tensor([1.0, -1.0])
    target[2] = torch.tensor([0.5, 2.0])
    mse = torch.nn.MSELoss()(target, f).item()
    assert parts["proto"].item() == pytest.approx(mse, rel=1e-6)
    assert loss.item() == pytest.approx(F.cross_entropy(model(x), y).item() + 0.5 * mse, rel=1e-6)
    # the upload: prototypes of the classes present (0, 1, 2 here) from the model in eval mode, and counts
    model.train()
    up = algo.client_upload(model, _ctx({}, x, y))
    assert model.training  # mode restored
    assert set(up) == {"protos", "counts"} and up["counts"].tolist() == [2, 1, 1]
    assert torch.allclose(up["protos"][0], f[[0, 3]].mean(0)) and torch.allclose(up["protos"][2], f[2])
    assert set(algo.client_keep(model, context())) == set(model.state_dict())  # the whole model stays


def test_prototype_prediction_by_hand():
    # f = [1,1]; C̄0 = [0,0] (mean sq. dist 1), C̄1 = [1,2] (0.5), C̄2 = [1,1] (0) but the client holds only 0 and 1
    f = torch.tensor([[1.0, 1.0]])
    protos, present = torch.tensor([[0.0, 0.0], [1.0, 2.0], [1.0, 1.0]]), torch.tensor([True, True, True])
    logits = prototype_logits(f, protos, present)
    assert torch.allclose(logits, torch.tensor([[-1.0, -0.5, 0.0]]))
    logits = prototype_logits(f, protos, present, own_classes=torch.tensor([0, 1, 1]))
    assert logits[0, :2].tolist() == [-1.0, -0.5] and logits[0, 2] == float("-inf") and logits.argmax() == 1
    # through the hook: predict=prototype uses it, the default uses the client's own classifier
    cfg, algo, model = _hooks("algorithm.predict=prototype")
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    payload = {"protos": torch.randn(3, 2), "counts": torch.tensor([1, 1, 1], dtype=torch.int32)}
    want = prototype_logits(model.features(x), payload["protos"], torch.ones(3, dtype=torch.bool), y)
    assert torch.equal(algo.predict(model, x, _ctx(dict(payload), x, y)), want)
    _, plain, _ = _hooks()
    assert torch.equal(plain.predict(model, x, _ctx(dict(payload), x, y)), model(x))


# ---------------------------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("override, key", [("algorithm.ld=-1", "algorithm.ld"), ("algorithm.ld=nan", "algorithm.ld"),
                                           ("algorithm.predict=knn", "algorithm.predict"),
                                           ("algorithm.mu=1", "algorithm.mu")])
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config(None, ["algorithm.name=fedproto", override])


def test_bad_hyperparameter_through_the_cli_exits_2(tmp_path):
    for bad, key in (("algorithm.ld=-0.5", "algorithm.ld"), ("algorithm.predict=knn", "algorithm.predict")):
        refused_config(key, *tiny_overrides(tmp_path, algorithm__name="fedproto"), bad)


def test_experiment_configs_load():
    from raysim.config import to_flat_dict

    paths = sorted((ROOT / "experiments" / "unideal").glob("*/fedproto.yaml"))
    assert len(paths) == 12  # every setting directory, -cpu siblings and HETE included
    recipes = {tuple(sorted((k, str(v)) for k, v in to_flat_dict(load_config(path)).items()
                            if k.startswith("algorithm."))) for path in paths}
    assert len(recipes) == 1 and dict(next(iter(recipes)))["algorithm.name"] == "fedproto"  # one recipe everywhere


# ---------------------------------------------------------------------------------------------- whole runs
# Dirichlet labels so that clients lack classes and upload fewer prototype rows
SLOW = dict(rounds=3, clients__num=6, data__partition="dirichlet", algorithm__name="fedproto")


def _cfg(tmp_path: Path, name: str, **extra):
    return load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **{**SLOW, **extra}))


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> dict:
    """The run in this process, and the config it was made from."""
    from raysim.engine.runner import run_experiment

    tmp = tmp_path_factory.mktemp("fedproto")
    run_dir, _, _ = run_experiment(_cfg(tmp, "one"))
    return {"one": read_rows(run_dir), "cfg": _cfg(tmp, "probe")}


def test_run_sends_prototypes_and_learns(one_run):
    rows = one_run["one"]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["loss"] == r["loss"] and r["loss"] < 1e3 for r in rows)  # finite
    assert {"loss_ce", "loss_proto", "proto_classes", "acc_mean", "bytes_up", "bytes_down"} <= set(rows[-1])
    assert "acc_global" not in rows[-1]  # no global model
    assert rows[0]["loss_proto"] == 0 and all(r["loss_proto"] > 0 for r in rows[1:])  # round 1: no prototypes yet
    assert rows[-1]["proto_classes"] == 10 and rows[-1]["acc_mean"] > 0.3


def test_worker_killed_mid_job_on_ray_changes_no_metric(ray_cluster, tmp_path):
    """Two Ray workers, one SIGKILLed in the middle of a job of round 2: the job runs again, and the metrics are
    those of the run in this process (helpers.killed_worker_matches_inline)."""
    from helpers import killed_worker_matches_inline

    rows = killed_worker_matches_inline(tmp_path, **SLOW)
    assert rows[-1]["proto_classes"] == 10 and all(r["loss_proto"] > 0 for r in rows[1:])


def test_bytes_are_prototypes_and_counts_only(one_run):
    """Up: each client's present classes x feature_dim float32s + 10 int32 counts, <= 10 x (16 + 1) x 4 bytes.
    Down: nothing in round 1, then the 10 global prototypes and counts per client."""
    from raysim.data import build_federated_data

    data = build_federated_data(one_run["cfg"])
    classes, dim, clients = 10, 16, 6
    present = [len(data.tensors(c, "train")[1].unique()) for c in range(clients)]
    assert min(present) < classes  # Dirichlet: some client lacks a class, so it sends fewer rows
    expected_up = sum((k * dim + classes) * 4 for k in present)
    for r in one_run["one"]:
        assert r["bytes_up"] == expected_up <= clients * classes * (dim + 1) * 4
        assert r["bytes_down"] == (0 if r["round"] == 1 else clients * (classes * dim + classes) * 4)


def test_hete_architectures_train_together(tmp_path):
    from raysim.engine.runner import run_experiment

    overrides = tiny_overrides(tmp_path / "h", algorithm__name="fedproto", clients__num=3, rounds=3,
                               model__name="[cnn,mlp,mlp_hete]", model__width=8, train__local_epochs=2)
    _, rows, _ = run_experiment(load_config(None, overrides))
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["bytes_up"] == 3 * (10 * 16 + 10) * 4 for r in rows)  # iid: every client holds every class
    assert rows[-1]["acc_mean"] > 0.3 and rows[-1]["loss_proto"] > 0, rows
