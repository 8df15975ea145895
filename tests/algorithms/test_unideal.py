"""UNIDEAL, PartialKD and FedRep: what crosses the network, the teacher, the schedule, and HETE runs on Ray."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, context, read_rows, strip_timing, tiny_overrides

from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.engine.jobs import TrainJob
from raysim.trees import nbytes
from raysim.engine.core import ClientJobs
from raysim.errors import UserError
from raysim.models import build_model
from raysim.registry import get_algorithm

HEAD_KEYS = {"head.weight", "head.bias"}


# ---------------------------------------------------------------------------------------------- config (no Ray)
def test_config_defaults_and_keys():
    cfg = load_config(None, ["algorithm.name=unideal"])
    a = cfg.algorithm
    assert (a.alpha, a.metric, a.schedule.start, a.schedule.end, a.schedule.over, a.schedule.shape) == \
        (1.0, "cosine", None, 1.0, "local_epochs", "linear")
    cfg = load_config(None, ["algorithm.name=unideal", "algorithm.metric=l1", "algorithm.schedule.over=rounds",
                             "algorithm.schedule.shape=step", "algorithm.schedule.start=0.25", "algorithm.alpha=0.5"])
    assert (cfg.algorithm.metric, cfg.algorithm.schedule.over, cfg.algorithm.schedule.start) == ("l1", "rounds", 0.25)
    assert load_config(None, ["algorithm.name=fedrep", "algorithm.head_epochs=3"]).algorithm.head_epochs == 3


@pytest.mark.parametrize("override, key", [
    ("algorithm.metric=kl", "algorithm.metric"),
    ("algorithm.alpha=-1", "algorithm.alpha"),
    ("algorithm.schedule.start=0", "algorithm.schedule.start"),
    ("algorithm.schedule.end=1.5", "algorithm.schedule.end"),
    ("algorithm.schedule.over=steps", "algorithm.schedule.over"),
    ("algorithm.schedule.shape=cosine", "algorithm.schedule.shape"),
    ("algorithm.schedule.bogus=1", "bogus"),
])
def test_bad_unideal_config_names_the_key(override, key):
    with pytest.raises(UserError, match=key):
        load_config(None, ["algorithm.name=unideal", override])


def test_partialkd_has_no_schedule_and_fedrep_checks_head_epochs():
    with pytest.raises(UserError, match="schedule"):
        load_config(None, ["algorithm.name=partialkd", "algorithm.schedule.end=0.5"])
    with pytest.raises(UserError, match="algorithm.head_epochs"):
        load_config(None, ["algorithm.name=fedrep", "algorithm.head_epochs=-1"])


# ---------------------------------------------------------------------------------------------- hooks (no Ray)
def _tiny(name: str, *extra: str):
    cfg = load_config(None, [f"algorithm.name={name}", "model.name=mlp", "model.hidden=[8]", "model.feature_dim=6",
                             "train.batch_size=4", "train.local_epochs=3", *extra])
    return cfg, get_algorithm(name)(cfg), build_model(cfg, "mlp", (5,), 3)


def test_teacher_is_the_payload_head_on_own_features_and_gets_no_gradient():
    from raysim.algorithms.base import ClientContext

    cfg, algo, model = _tiny("unideal")
    torch.manual_seed(0)
    teacher = {"head.weight": torch.randn(3, 6, requires_grad=True), "head.bias": torch.randn(3, requires_grad=True)}
    ctx = ClientContext(client_id=0, round=1, total_rounds=2, epoch=2, num_epochs=3, payload={"model": teacher})
    x, y = torch.randn(4, 5), torch.tensor([0, 1, 2, 0])
    loss, parts = algo.client_loss(model, x, y, ctx)
    feats = model.features(x)
    t_logits, s_logits = F.linear(feats, teacher["head.weight"], teacher["head.bias"]), model.head(feats)
    kl = (F.softmax(t_logits, 1) * (F.log_softmax(t_logits, 1) - F.log_softmax(s_logits, 1))).sum(1).mean()
    assert parts["clkd"].item() == pytest.approx(kl.item(), rel=1e-5)  # last epoch: p = 1, every sample
    assert loss.item() == pytest.approx(F.cross_entropy(s_logits, y).item() + kl.item(), rel=1e-5)
    loss.backward()
    assert teacher["head.weight"].grad is None and teacher["head.bias"].grad is None
    assert model.head.weight.grad is not None
    # the first epoch distils one sample per batch only
    assert algo.fraction(ClientContext(0, 1, 2, 0, 3, {})) == pytest.approx(1 / 4)


def test_local_head_stays_and_only_the_head_is_uploaded():
    cfg, algo, model = _tiny("unideal")
    state = {k: v + 1.0 for k, v in model.state_dict().items()}
    payload = {"model": {"head.weight": torch.zeros(3, 6), "head.bias": torch.zeros(3)}}
    algo.client_setup(model, context(state=state, payload=payload))
    assert torch.equal(model.head.weight, state["head.weight"])  # the global head is not loaded into the model
    assert set(algo.client_upload(model, context())) == HEAD_KEYS
    assert set(algo.client_keep(model, context())) == set(model.state_dict())  # backbone and local head stay
    algo.eval_setup(model, context(round=-1, state=state, payload=payload))
    assert torch.equal(model.head.bias, state["head.bias"])  # evaluation uses the local head


def test_fedrep_phases_head_then_body_and_shares_the_backbone():
    cfg, algo, model = _tiny("fedrep", "algorithm.head_epochs=2")
    (head, e1), (body, e2) = algo.local_phases(model, context())
    assert (e1, e2) == (2, 3)
    assert {id(p) for p in head} == {id(p) for p in model.head.parameters()}
    assert {id(p) for p in body} == {id(p) for p in model.backbone.parameters()}
    assert all(k.startswith("backbone.") for k in algo.client_upload(model, context()))
    assert set(algo.client_keep(model, context())) == HEAD_KEYS


# ---------------------------------------------------------------------------------------------- on Ray
def test_worker_uploads_resnet18_head_only(tmp_path):
    """What the driver receives from a real worker job: the two head tensors, 5,130 float32s, and nothing else."""
    cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="unideal", model__name="resnet18",
                                           model__feature_dim=512, clients__num=6, train__batch_size=64))
    from raysim.data import build_federated_data

    data = build_federated_data(cfg)
    # the client-job core, in this process: exactly what a worker's job sends back to the driver
    algo = get_algorithm("unideal")(cfg)
    initial = build_model(cfg, "resnet18", data.input_shape(0), 10).state_dict()
    payload = algo.server_payload(algo.init_server_state(initial), 1)
    result, state = ClientJobs(cfg, data).train(TrainJob(client_id=0, round=1, payload_ref=None), payload, None, None)
    assert set(result.upload) == HEAD_KEYS
    assert nbytes(result.upload) == 5130 * 4 and nbytes(payload) == 5130 * 4
    assert set(state) == set(initial)  # the whole model stays on the client


def _run(tmp_path, name: str, **extra) -> list[dict]:
    """A tiny two-round run on one worker (the results do not depend on the worker count)."""
    overrides = tiny_overrides(tmp_path / name, engine__num_workers=1, **extra)
    run_dir, _, _ = run_experiment(load_config(None, overrides))
    return read_rows(run_dir)


@pytest.fixture(scope="module")
def kd_runs(tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("kd")
    common = dict(train__local_epochs=2)
    return {
        "unideal": _run(tmp, "unideal", algorithm__name="unideal", **common),
        "fixed": _run(tmp, "fixed", algorithm__name="unideal", algorithm__schedule__start=1.0, **common),
        "partialkd": _run(tmp, "partialkd", algorithm__name="partialkd", **common),
    }


def test_unideal_bytes_are_head_only(kd_runs, shared_run):
    rows = kd_runs["unideal"]
    head_floats = 16 * 10 + 10  # tiny_overrides: feature_dim 16, 10 classes, 4 clients
    whole_floats = (64 * 32 + 32) + (32 * 16 + 16) + head_floats  # what fedavg moves: the whole mlp
    assert [r["bytes_up"] for r in rows] == [4 * 4 * head_floats] * 2
    assert [r["bytes_down"] for r in rows] == [4 * 4 * head_floats] * 2
    assert [r["bytes_up_total"] for r in rows] == [16 * head_floats, 32 * head_floats]
    assert [r["bytes_down_total"] for r in rows] == [16 * head_floats, 32 * head_floats]
    fedavg = shared_run()[1]  # the same federation under FedAvg
    assert [(r["bytes_up"], r["bytes_down"]) for r in fedavg] == [(4 * 4 * whole_floats,) * 2] * 2
    assert rows[0]["bytes_up"] / fedavg[0]["bytes_up"] == head_floats / whole_floats  # 6.1 % of what FedAvg moves
    assert "acc_global" not in rows[-1] and rows[-1]["acc_mean"] > 0.3
    assert {"loss_ce", "loss_clkd"} <= set(rows[-1])


def test_partialkd_equals_unideal_with_schedule_fixed_at_one(kd_runs):
    assert strip_timing(kd_runs["partialkd"]) == strip_timing(kd_runs["fixed"])
    # the default curriculum distils one sample per batch in the first epoch: a smaller KD term, other metrics
    assert kd_runs["unideal"][0]["loss_clkd"] < kd_runs["partialkd"][0]["loss_clkd"]


def test_fedrep_moves_the_backbone_only(tmp_path):
    rows = _run(tmp_path, "fedrep", algorithm__name="fedrep", train__momentum=0.9)  # seeds 0-4: acc 0.58-0.72
    assert rows[-1]["bytes_up"] == 4 * 4 * ((64 * 32 + 32) + (32 * 16 + 16)) and rows[-1]["acc_mean"] > 0.3
    assert "acc_global" not in rows[-1]


def test_hete_three_backbones_train_together(tmp_path):
    overrides = tiny_overrides(tmp_path / "h", algorithm__name="unideal", clients__num=3, engine__num_workers=1,
                               model__name="[cnn,resnet18,mobilenet_v3_small]", model__width=8,
                               model__feature_dim=32, train__batch_size=64, train__lr=0.02)
    _, rows, _ = run_experiment(load_config(None, overrides))
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[-1]["bytes_up"] == 3 * (32 * 10 + 10) * 4
    # chance is 0.1; seeds 0-4 reach 0.29 to 0.33
    assert rows[-1]["acc_mean"] > 0.25 and rows[-1]["loss"] < rows[0]["loss"], rows
    from raysim.data import build_federated_data

    cfg = load_config(None, overrides + ["algorithm.name=fedrep"])
    with pytest.raises(UserError, match="model.name"):  # averaging a backbone needs one architecture
        get_algorithm("fedrep")(cfg).check(cfg, build_federated_data(cfg))


def test_tabular_style_hete_mlps_train_together(tmp_path):
    rows = _run(tmp_path, "mlp_hete", algorithm__name="unideal", model__name="mlp_hete", clients__num=3,
                train__local_epochs=2)
    assert rows[-1]["bytes_up"] == 3 * (16 * 10 + 10) * 4 and rows[-1]["acc_mean"] > 0.3, rows


# ---------------------------------------------------------------------------------------------- experiments/unideal
EXPERIMENTS = ROOT / "experiments" / "unideal"
KD_ALGOS = {"local", "partialavg", "partialkd", "unideal", "unideal-l1", "unideal-l2", "fedproto", "fedgen-p", "fedpcl"}
# one architecture and input shape: no HETE files
AVERAGING = {"fedavg", "fedrep", "fedpac", "fedgen", "fedbabu", "fedrod", "fedkd"}
# beyond the seed, in the Digits NIID-1 table only (fedavg-bn: FedAvg on fedbn's cnn_bn)
BEYOND = {"digits-niid1": {"fedbn", "ditto"}, "digits-niid1-cpu": {"fedbn", "ditto", "fedavg-bn"}}


@pytest.mark.slow
def test_experiment_configs_load_and_cover_every_method():
    settings = sorted(p for p in EXPERIMENTS.iterdir() if p.is_dir())
    assert len(settings) == 12
    for setting in settings:
        names = {p.stem for p in setting.glob("*.yaml")} - {"base"}
        expected = KD_ALGOS if "hete" in setting.name else KD_ALGOS | AVERAGING
        assert names == expected | BEYOND.get(setting.name, set()), setting
        for path in setting.glob("*.yaml"):
            cfg = load_config(path)
            algo = ("unideal" if path.stem == "base"
                    else path.stem.removesuffix("-l1").removesuffix("-l2").removesuffix("-bn"))
            assert cfg.algorithm.name == algo, path
            if algo == "unideal":
                assert cfg.algorithm.metric == (path.stem.split("-") + ["cosine"])[1], path
            assert len(set(cfg.model.names())) > 1 or cfg.model.name == "mlp_hete" or "hete" not in setting.name
            if not setting.name.endswith("-cpu") and setting.name.startswith("digits"):
                assert cfg.rounds == 50 and set(cfg.model.names()) <= {"resnet18", "mobilenet_v3_small", "vgg11_bn"}


def test_tabular_fedavg_and_fedrep_configs_pass_their_check():
    """Their files run the sliced setting (each client its own columns) in the shared column space
    (data.feature_layout=shared): one input width, each column at one place, so averaging means something."""
    from raysim.data import build_federated_data

    for name in ("fedavg", "fedrep"):
        cfg = load_config(EXPERIMENTS / "tabular-niid2" / f"{name}.yaml")
        data = build_federated_data(cfg)
        get_algorithm(name)(cfg).check(cfg, data)
        assert len({tuple(data.clients[c].features) for c in range(cfg.clients.num)}) == cfg.clients.num
        assert len({data.input_shape(c) for c in range(cfg.clients.num)}) == 1
