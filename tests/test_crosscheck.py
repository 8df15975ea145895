"""The cross-check's glue (benchmarks/crosscheck/): what it hands a peer is what raysim trains on, and its paired
comparison is scipy's. The peers themselves are not needed (they are checkouts the lead runs it against)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "crosscheck"))
import crosscheck  # noqa: E402


@pytest.mark.parametrize("method", ["moon", "fednh"])
def test_export_is_raysims_federation_and_initial_model(method, tmp_path):
    from raysim.config import load_config
    from raysim.data import build_federated_data
    from raysim.models import build_model
    from raysim.registry import get_algorithm

    m = crosscheck.METHODS[method]
    crosscheck.export(m, 1, tmp_path)
    cfg = load_config(crosscheck.FEDERATION, list(m.raysim) + ["seed=1"])
    data = build_federated_data(cfg)
    meta = json.loads((tmp_path / "federation.json").read_text())
    assert meta["num_clients"] == data.num_clients == 10 and meta["rounds"] == cfg.rounds
    for cid in (0, data.num_clients - 1):
        for part in ("train", "test"):
            with open(tmp_path / "dataset" / "crosscheck" / part / f"{cid}.npz", "rb") as fh:
                got = np.load(fh, allow_pickle=True)["data"].tolist()  # how PFLlib's read_data opens it
            x, y, _ = data.tensors(cid, part)
            assert np.array_equal(got["x"], x.numpy()) and np.array_equal(got["y"], y.numpy())
    # the initial weights are those of the method's model (MOON's projection head, FedNH's prototypes included)
    init = torch.load(tmp_path / "init.pt", weights_only=True)
    model = build_model(cfg, "mlp", data.input_shape(0), 10, 0, get_algorithm(cfg.algorithm.name)(cfg))
    assert init.keys() == model.state_dict().keys()
    assert all(torch.equal(init[k], v) for k, v in model.state_dict().items())
    assert load_config(tmp_path / "config.yaml").algorithm.name == cfg.algorithm.name


def test_compare_pairs_seeds_with_scipys_paired_t_test():
    from scipy import stats

    # two seeds x three rounds; raysim ahead by 0.1 and 0.3 at the last round
    curves = {"fedavg": {"raysim": {"0": [0.5, 0.6, 0.7], "1": [0.4, 0.5, 0.9]},
                         "peer": {"0": [0.5, 0.6, 0.6], "1": [0.4, 0.4, 0.6]}}}
    row = crosscheck.compare(curves, ["fedavg"], [0, 1])[0]
    assert row["final"]["diff"] == pytest.approx(0.2) and row["final"]["raysim"] == pytest.approx(0.8)
    assert row["final"]["p"] == pytest.approx(stats.ttest_rel([0.7, 0.9], [0.6, 0.6]).pvalue)
    assert row["mean"]["diff"] == pytest.approx(np.mean([0.1 / 3, 0.4 / 3]))
    assert row["max_round_gap"] == pytest.approx(0.2)  # round 3: 0.8 against 0.6
    # equal curves: no test (zero variance), not a NaN
    same = {"fedavg": {"raysim": curves["fedavg"]["raysim"], "peer": curves["fedavg"]["raysim"]}}
    assert crosscheck.compare(same, ["fedavg"], [0, 1])[0]["final"]["p"] is None
    assert "| fedavg |" in crosscheck.table([row])
