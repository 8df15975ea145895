"""The three plugins in examples/plugins: FedNesterov (a server optimiser on the built-in hook), blobs (dataset),
resmlp (model)."""

from __future__ import annotations

import sys

import pytest
import torch

import raysim
from conftest import EXAMPLE_PLUGINS, tiny_overrides
from raysim.config import load_config
from raysim.models import build_model

PLUGINS = "plugins=[fednesterov,blobs,resmlp]"
if str(EXAMPLE_PLUGINS) not in sys.path:  # the driver imports them; Ray's workers get them from PYTHONPATH (conftest)
    sys.path.insert(0, str(EXAMPLE_PLUGINS))


def test_nesterov_plugin_steps_by_hand_and_without_momentum_is_fedavg():
    import fednesterov
    from raysim.algorithms.base import ClientUpdate

    # two clients, weights 1 and 3: w̄ = ((1 + 9)/4, (2 + 18)/4) = (2.5, 5); an integer buffer (3 + 15)/4 = 4.5 -> 4
    uploads = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)},
               {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}]
    updates = [ClientUpdate(client_id=c, upload=u, num_samples=w) for c, (u, w) in enumerate(zip(uploads, [1, 3]))]
    # β = 0.5, η = 1, from x = 0: g = -w̄, v = g, x = 0 - (g + 0.5·v) = 1.5·w̄ = (3.75, 7.5) (heavy ball: w̄ itself)
    # again from x = 0: v = 0.5·v + g = 1.5·g, x = -(g + 0.5·1.5·g) = 1.75·w̄ = (4.375, 8.75);  β = 0: w̄ both times
    for beta, first, second in ((0.5, [3.75, 7.5], [4.375, 8.75]), (0.0, [2.5, 5.0], [2.5, 5.0])):
        cfg = load_config(None, ["plugins=[fednesterov]", "algorithm.name=fednesterov",
                                 f"algorithm.server_momentum={beta}"])
        algo = fednesterov.FedNesterov(cfg)
        state = algo.init_server_state({"w": torch.zeros(2), "n": torch.tensor(0)})
        state = algo.server_aggregate(updates, state, 1)
        assert state["model"]["w"].tolist() == pytest.approx(first)
        assert int(state["model"]["n"]) == 4  # integer buffers are averaged, not stepped
        state["model"]["w"] = torch.zeros(2)
        assert algo.server_aggregate(updates, state, 2)["model"]["w"].tolist() == pytest.approx(second)


def test_plugin_model_takes_its_own_config_keys():
    cfg = load_config(None, ["plugins=[resmlp]", "model.name=resmlp", "model.resmlp.blocks=3",
                             "model.resmlp.width=24", "model.feature_dim=8"])
    assert cfg.model.resmlp.blocks == 3
    model = build_model(cfg, "resmlp", (10,), 4)
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules()) == 3
    assert model(torch.zeros(5, 10)).shape == (5, 4)


def test_plugin_dataset_takes_its_own_config_keys():
    import blobs

    cfg = load_config(None, ["plugins=[blobs]", "data.name=blobs", "data.blobs.features=6", "data.blobs.classes=3",
                             "clients.num=3", "data.partition=iid"])
    data = blobs.blobs(cfg)
    assert data.num_classes == 3 and data.input_shape(0) == (6,) and data.num_clients == 3


def test_all_three_plugins_run_together(tmp_path):
    result = raysim.run(None, *tiny_overrides(tmp_path, data__name="blobs", model__name="resmlp",
                                              algorithm__name="fednesterov", model__resmlp__blocks=1),
                        PLUGINS, "data.blobs.samples=200")
    assert list(result.metrics["round"]) == [1, 2]
    assert result.metrics["acc_global"].iloc[-1] > 0.5  # well-separated blobs are learnt in two rounds
    assert result.config.algorithm.server_momentum == 0.9


def test_nesterov_plugin_declares_vectorisable_hooks_and_its_cohorts_change_no_number(tmp_path):
    """The plugin declares ``vectorizable = True`` (FedAvg's client hooks): stacks of 3 give the metrics of one
    client at a time, in this process."""
    import fednesterov

    from raysim.engine.runner import run_experiment

    assert "vectorizable" in vars(fednesterov.FedNesterov) and fednesterov.FedNesterov.refusal("stack") is None

    def rows(vectorize: str) -> list[dict]:
        cfg = load_config(None, tiny_overrides(tmp_path / vectorize, plugins="[fednesterov]",
                                               algorithm__name="fednesterov", engine__backend="inline",
                                               engine__vectorize=vectorize, clients__num=5))
        return [{k: v for k, v in r.items() if not k.startswith("wall_s") and k != "vectorize"}
                for r in run_experiment(cfg)[1]]

    assert rows("3") == rows("off")
