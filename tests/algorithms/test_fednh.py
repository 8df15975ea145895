"""FedNH: the prototype smoothing by hand, the cosine head, the worker's gradient clipping, tiny runs on Ray."""

from __future__ import annotations

import pytest
import torch
from conftest import read_rows, refused_config, tiny_overrides

from raysim.algorithms.base import ClientUpdate
from raysim.algorithms.fednh import PROTO_KEY, SCALE_KEY, PrototypeHead, client_prototypes, smooth_prototypes
from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm


# ---------------------------------------------------------------------------------------------- the math (no Ray)
def test_prototype_smoothing_by_hand():
    # 2 classes, d = 2, W = [[1, 0], [0, 1]], rho = 0.5.
    # client A: one class-0 sample f = (3, 4) -> f/|f| = (0.6, 0.8); mean (0.6, 0.8), normalised (0.6, 0.8);
    #           scaled by n_A0 = 1 -> (0.6, 0.8); class 1 absent -> (0, 0), n_A1 = 0
    # client B: class-0 samples (0, 2), (0, 5) -> both (0, 1); mean (0, 1); scaled by n_B0 = 2 -> (0, 2)
    # server, class 0: (0.6 + 0, 0.8 + 2) / (1 + 2) = (0.2, 0.93333); |.| = sqrt(0.04 + 0.871111) = 0.954521
    #                  mu_0 = (0.209529, 0.977802)
    #                  0.5 * (1, 0) + 0.5 * mu_0 = (0.604764, 0.488901); |.| = sqrt(0.365740 + 0.239024) = 0.777666
    #                  W_0 = (0.777666, 0.628671)
    #         class 1: nobody holds it -> mu_1 = 0 -> normalize(0.5 * (0, 1)) = (0, 1): unchanged
    scaled_a, counts_a = client_prototypes(torch.tensor([[3.0, 4.0]]), torch.tensor([0]), 2)
    scaled_b, counts_b = client_prototypes(torch.tensor([[0.0, 2.0], [0.0, 5.0]]), torch.tensor([0, 0]), 2)
    assert torch.allclose(scaled_a, torch.tensor([[0.6, 0.8], [0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(scaled_b, torch.tensor([[0.0, 2.0], [0.0, 0.0]]), atol=1e-6)
    assert counts_a.tolist() == [1, 0] and counts_b.tolist() == [2, 0] and counts_a.dtype == torch.int32
    w = torch.eye(2)
    new = smooth_prototypes(w, [(scaled_a, counts_a), (scaled_b, counts_b)], rho=0.5)
    assert torch.allclose(new, torch.tensor([[0.777666, 0.628671], [0.0, 1.0]]), atol=1e-5)
    assert torch.allclose(new.norm(dim=1), torch.ones(2), atol=1e-6)
    assert torch.equal(w, torch.eye(2))  # the input is not changed in place
    # rho = 1 keeps W; rho = 0 replaces a held class's row by the normalised mean
    assert torch.allclose(smooth_prototypes(w, [(scaled_a, counts_a)], rho=1.0), w)
    assert torch.allclose(smooth_prototypes(w, [(scaled_a, counts_a), (scaled_b, counts_b)], rho=0.0)[0],
                          torch.tensor([0.209529, 0.977802]), atol=1e-5)


def test_prototype_head_is_scaled_cosine_with_frozen_unit_rows():
    torch.manual_seed(0)
    head = PrototypeHead(feature_dim=16, num_classes=10, scale=30.0, learn_scale=True)
    w = head.prototype
    assert torch.allclose(w.norm(dim=1), torch.ones(10), atol=1e-6)
    assert torch.allclose(w @ w.t(), torch.eye(10), atol=1e-5)  # orthogonal init: orthonormal rows (classes <= d)
    assert "prototype" not in dict(head.named_parameters())  # a buffer: no optimiser ever sees it
    assert [n for n, _ in head.named_parameters()] == ["scale"]
    # by hand: W = I_2, f = (3, 4): cos = (0.6, 0.8), logits = 30 * (0.6, 0.8) = (18, 24)
    head2 = PrototypeHead(feature_dim=2, num_classes=2, scale=30.0, learn_scale=False)
    head2.prototype.copy_(torch.eye(2))
    assert torch.allclose(head2(torch.tensor([[3.0, 4.0]])), torch.tensor([[18.0, 24.0]]))
    assert dict(head2.named_parameters()) == {} and head2.scale.item() == 30.0
    # more classes than dimensions: rows still unit vectors
    assert torch.allclose(PrototypeHead(4, 10, 1.0, True).prototype.norm(dim=1), torch.ones(10), atol=1e-6)


def test_authors_scale_init_and_unweighted_body_average_two_clients_by_hand():
    # algorithm.scale=1.0 (the authors' CNN): logits are the plain cosines. Feature [3, 4] -> unit [0.6, 0.8]; with
    # prototypes e1, e2 the logits are [0.6, 0.8] (at the default s = 30: [18, 24])
    head = PrototypeHead(2, 2, scale=1.0, learn_scale=True)
    head.prototype.copy_(torch.eye(2))
    assert torch.allclose(head(torch.tensor([[3.0, 4.0]])), torch.tensor([[0.6, 0.8]]))
    cfg = load_config(None, ["algorithm.name=fednh", "algorithm.scale=1.0"])
    model = build_model(cfg, "mlp", (64,), 10, algorithm=get_algorithm("fednh")(cfg))
    assert model.head.scale.item() == 1.0
    # two clients: body weight w = 1 (1 sample) and 5 (3 samples), s = 2 and 6; no class means (counts 0)
    #   samples (default): w = (1 + 3*5)/4 = 4, s = (2 + 3*6)/4 = 5;   uniform (authors): w = 3, s = 4
    protos = torch.eye(2)

    def update(cid: int, w: float, s: float, n: int) -> ClientUpdate:
        upload = {"model": {"body.w": torch.tensor([w]), SCALE_KEY: torch.tensor([s])},
                  "protos": torch.zeros(2, 2), "counts": torch.zeros(2, dtype=torch.int32)}
        return ClientUpdate(client_id=cid, upload=upload, num_samples=n)

    for average, (w, s) in (("samples", (4.0, 5.0)), ("uniform", (3.0, 4.0))):
        algo = get_algorithm("fednh")(load_config(None, ["algorithm.name=fednh", f"algorithm.body_average={average}"]))
        state = algo.server_aggregate([update(0, 1.0, 2.0, 1), update(1, 5.0, 6.0, 3)],
                                      {"model": {PROTO_KEY: protos}}, 1)
        assert state["model"]["body.w"].item() == pytest.approx(w) and state["model"][SCALE_KEY].item() == s
        assert torch.equal(state["model"][PROTO_KEY], protos)  # no class means: W unchanged
    with pytest.raises(ConfigError, match="'algorithm.body_average'"):
        load_config(None, ["algorithm.name=fednh", "algorithm.body_average=median"])


def test_config_defaults_and_clip_attribute():
    cfg = load_config(None, ["algorithm.name=fednh"])
    a = cfg.algorithm
    assert (a.rho, a.scale, a.learn_scale, a.clip_grad) == (0.9, 30.0, True, 10.0)
    assert get_algorithm("fednh")(cfg).clip_grad_norm == 10.0
    assert get_algorithm("fednh")(load_config(None, ["algorithm.name=fednh", "algorithm.clip_grad=0"])).clip_grad_norm \
        is None
    assert get_algorithm("fedavg")(load_config(None, [])).clip_grad_norm is None  # the engine's default: no clipping
    for bad, key in [("algorithm.rho=1.5", "rho"), ("algorithm.scale=0", "scale"), ("algorithm.clip_grad=-1", "clip")]:
        with pytest.raises(ConfigError, match=f"'algorithm.{key}"):
            load_config(None, ["algorithm.name=fednh", bad])


def test_cli_bad_rho_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.rho", *tiny_overrides(tmp_path), "algorithm.name=fednh", "algorithm.rho=1.5")


# ---------------------------------------------------------------------------------------------- on Ray
def test_worker_clips_gradients_and_uploads_prototypes(tmp_path):
    """A real client job in this process: with clip_grad tiny, every SGD step moves the trained parameters by at
    most lr * clip, so the body stays (almost) where it was; the upload carries body, s, prototypes and counts."""
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import TrainJob

    cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="fednh", algorithm__clip_grad=1e-9))
    data = build_federated_data(cfg)
    algo = get_algorithm("fednh")(cfg)
    initial = build_model(cfg, "mlp", data.input_shape(0), 10, algorithm=algo).state_dict()
    payload = algo.server_payload(algo.init_server_state(initial), 1)
    result, state = ClientJobs(cfg, data).train(TrainJob(client_id=0, round=1, payload_ref=None), payload, None, None)
    up = result.upload
    assert set(up) == {"model", "protos", "counts"} and PROTO_KEY not in up["model"] and SCALE_KEY in up["model"]
    assert state is None  # everything the client trains is shared
    steps = -(-result.num_samples // cfg.train.batch_size)
    moved = max(float((up["model"][k] - initial[k]).abs().max()) for k in up["model"])
    assert 0 < moved <= steps * cfg.train.lr * 1e-9 * 1.01
    counts = torch.bincount(data.tensors(0, "train")[1], minlength=10)
    assert torch.equal(up["counts"], counts.to(torch.int32))
    assert torch.allclose(up["protos"].norm(dim=1), counts.float(), atol=1e-4)  # n_c * unit vector


def test_fednh_run_learns_its_scale_and_sends_prototypes(tmp_path):
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="fednh", train__local_epochs=2))
    run_dir, _, _ = run_experiment(cfg)
    one = read_rows(run_dir)
    assert [r["round"] for r in one] == [1, 2]
    for r in one:
        assert {"acc_global", "acc_mean", "loss", "bytes_up", "bytes_down", "scale"} <= set(r)
        assert r["loss"] == r["loss"] and r["scale"] != 30.0  # s is learned
    assert one[-1]["acc_global"] > 0.5  # chance is 0.1
    # up per client: MLP body (64*32 + 32 + 32*16 + 16) + s (1) floats + protos 10*16 floats + counts 10 int32
    assert one[0]["bytes_up"] == 4 * (64 * 32 + 32 + 32 * 16 + 16 + 1 + 10 * 16 + 10) * 4
