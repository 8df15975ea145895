"""Algorithm hooks without Ray: what each algorithm shares, keeps and averages."""

from __future__ import annotations

import torch

from conftest import context
from raysim.algorithms.base import weighted_average
from raysim.config import load_config
from raysim.models import build_model
from raysim.registry import get_algorithm


def _model(cfg, seed_shift=0):
    m = build_model(cfg, "mlp", (1, 8, 8), 10)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(seed_shift)
    return m


def test_weighted_average_weights_by_samples():
    a, b = {"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([4.0, 6.0])}
    out = weighted_average([a, b], [1, 3])
    assert torch.allclose(out["w"], torch.tensor([3.0, 5.0]))


def test_shared_parts():
    cfg = load_config(None, ["model.name=mlp"])
    model = _model(cfg)
    keys = set(model.state_dict())
    for name, expect_up in [("fedavg", keys), ("local", set()),
                            ("partialavg", {k for k in keys if k.startswith("head.")})]:
        algo = get_algorithm(name)(load_config(None, [f"algorithm.name={name}"]))
        up, keep = algo.client_upload(model, context()), algo.client_keep(model, context())
        assert set(up) == expect_up, name
        assert set(up) | set(keep) == keys and not set(up) & set(keep), name


def test_partialavg_setup_replaces_only_the_head():
    cfg = load_config(None, ["algorithm.name=partialavg"])
    algo = get_algorithm("partialavg")(cfg)
    own, other = _model(cfg, 0.0), _model(cfg, 1.0)
    state = algo.client_keep(own, context())
    payload = {"model": algo.client_upload(other, context())}
    fresh = _model(cfg, 5.0)
    algo.client_setup(fresh, context(state=state, payload=payload))
    for k, v in fresh.state_dict().items():
        src = other if k.startswith("head.") else own
        assert torch.equal(v, src.state_dict()[k]), k
