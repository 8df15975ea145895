"""FedOpt: one server step of FedAdam, FedYogi and FedAdagrad worked by hand, FedAvgM's momentum, buffers averaged
not stepped, FedAvgM(0, 1) = FedAvg's metrics exactly (in process), bad values refused, and FedAdam on Ray (one vs
two workers with one killed)."""

from __future__ import annotations

import pytest
import torch
from conftest import killed_worker_matches_inline, refused_config, strip_timing, tiny_overrides

from raysim.algorithms.base import ClientUpdate
from raysim.config import ConfigError, load_config
from raysim.engine.runner import run_experiment
from raysim.registry import get_algorithm


def _algo(name: str, *extra: str):
    return get_algorithm(name)(load_config(None, [f"algorithm.name={name}", *extra]))


def _round(algo, x: list[float]):
    """One server step from the global model w = x, with a batch-norm running mean and an integer counter beside it,
    after two clients: A (1 sample) uploads w = (3, -2), B (3 samples) uploads w = (1, -2): w̄ = ((3 + 3)/4, -2) =
    (1.5, -2)."""
    state = algo.init_server_state({"w": torch.tensor(x), "bn.running_mean": torch.zeros(2),
                                    "bn.num_batches_tracked": torch.tensor(0)})
    uploads = [{"w": torch.tensor([3.0, -2.0]), "bn.running_mean": torch.tensor([1.0, 1.0]),
                "bn.num_batches_tracked": torch.tensor(2)},
               {"w": torch.tensor([1.0, -2.0]), "bn.running_mean": torch.tensor([5.0, 1.0]),
                "bn.num_batches_tracked": torch.tensor(6)}]
    updates = [ClientUpdate(client_id=0, upload=uploads[0], num_samples=1),
               ClientUpdate(client_id=1, upload=uploads[1], num_samples=3)]
    state = algo.server_aggregate(updates, state, 1)
    # running statistics and counters take the plain average, never a step: (1 + 15)/4 = 4, (1 + 3)/4 = 1; (2 + 18)/4
    assert state["model"]["bn.running_mean"].tolist() == [4.0, 1.0]
    assert int(state["model"]["bn.num_batches_tracked"]) == 5 and set(state["optimizer"]) == {"w"}
    return state


# ---------------------------------------------------------------------------------------------- server steps by hand
def test_fedadam_one_server_step_by_hand():
    # x = (1, -2), w̄ = (1.5, -2): Δ = w̄ - x = (0.5, 0). η = 0.1, β1 = 0.9, β2 = 0.99, τ = 1e-3, m = 0, v = τ² = 1e-6
    #   m = 0.9·0 + 0.1·Δ = (0.05, 0)
    #   v = 0.99·1e-6 + 0.01·Δ² = (0.00000099 + 0.0025, 0.00000099) = (0.00250099, 9.9e-7)
    #   x = x + η·m/(√v + τ): 1 + 0.1·0.05/(0.0500099 + 0.001) = 1 + 0.005/0.0510099 = 1.0980202;  -2 + 0 = -2
    algo = _algo("fedadam", "algorithm.server_lr=0.1")
    state = _round(algo, [1.0, -2.0])
    assert state["model"]["w"].tolist() == pytest.approx([1.0980202, -2.0], abs=1e-6)
    assert state["optimizer"]["w"]["m"].tolist() == pytest.approx([0.05, 0.0])
    assert state["optimizer"]["w"]["v"].tolist() == pytest.approx([0.00250099, 9.9e-7], rel=1e-5)


def test_fedyogi_second_moment_by_hand():
    # step 1, as FedAdam's but v = v - (1 - β2)·Δ²·sign(v - Δ²) = 1e-6 - 0.01·0.25·sign(1e-6 - 0.25)
    #   = 1e-6 + 0.0025 = 0.002501 (Adam: 0.00250099); coordinate 2: Δ = 0, v stays 1e-6 (Adam: 9.9e-7)
    #   x = 1 + 0.1·0.05/(√0.002501 + 0.001) = 1 + 0.005/(0.0500100 + 0.001) = 1.0980200
    algo = _algo("fedyogi", "algorithm.server_lr=0.1")
    state = _round(algo, [1.0, -2.0])
    moments = state["optimizer"]["w"]
    assert moments["v"].tolist() == pytest.approx([0.002501, 1e-6], rel=1e-5)
    assert state["model"]["w"].tolist() == pytest.approx([1.0980200, -2.0], abs=1e-6)
    # step 2 from x = 1, with w̄ = 1.01: Δ = 0.01, Δ² = 1e-4 < v, so sign(v - Δ²) = +1 and v shrinks additively:
    #   m = 0.9·0.05 + 0.1·0.01 = 0.046;  v = 0.002501 - 0.01·1e-4 = 0.0025 (Adam: 0.99·0.002501 + 1e-6 = 0.00247699)
    #   x = 1 + 0.1·0.046/(√0.0025 + 0.001) = 1 + 0.0046/0.051 = 1.0901961
    one = {"m": moments["m"][:1].clone(), "v": moments["v"][:1].clone()}
    x = algo.server_step(torch.tensor([1.0]), torch.tensor([1.01]), one)
    assert one["m"].item() == pytest.approx(0.046, rel=1e-5) and one["v"].item() == pytest.approx(0.0025, rel=1e-5)
    assert x.item() == pytest.approx(1.0901961, abs=1e-6)


def test_fedadagrad_one_server_step_by_hand():
    # β1 = 0 (the authors' Keras Adagrad has no first moment): m = Δ = (0.5, 0); v = τ² + Δ² = (0.250001, 1e-6)
    #   x = 1 + 0.1·0.5/(√0.250001 + 0.001) = 1 + 0.05/(0.500001 + 0.001) = 1.0998002;  -2 + 0 = -2
    algo = _algo("fedadagrad")  # server_lr 0.1 is its default
    state = _round(algo, [1.0, -2.0])
    assert state["optimizer"]["w"]["v"].tolist() == pytest.approx([0.250001, 1e-6], rel=1e-5)
    assert state["model"]["w"].tolist() == pytest.approx([1.0998002, -2.0], abs=1e-6)
    # Adagrad's v only grows: a second identical step adds Δ² again
    x = algo.server_step(torch.tensor([1.0]), torch.tensor([1.5]), {"m": torch.zeros(1), "v": torch.tensor([0.250001])})
    assert x.item() == pytest.approx(1 + 0.05 / ((0.500001 ** 2 + 0.25) ** 0.5 + 0.001), abs=1e-6)


def test_fedavgm_momentum_by_hand():
    # β = 0.5, η = 1, pseudo-gradient g = x - w̄. From x = 0 (coordinate 1): g = -1.5, v = -1.5, x = 0 + 1.5 = 1.5 (=w̄)
    # again from x = 0: g = -1.5, v = 0.5·(-1.5) - 1.5 = -2.25, x = 0 + 2.25: momentum overshoots the average
    algo = _algo("fedavgm", "algorithm.server_momentum=0.5")
    state = _round(algo, [0.0, 0.0])
    assert state["model"]["w"].tolist() == [1.5, -2.0] and state["optimizer"]["w"]["v"].tolist() == [-1.5, 2.0]
    x = algo.server_step(torch.tensor([0.0]), torch.tensor([1.5]), {"v": torch.tensor([-1.5])})
    assert x.item() == pytest.approx(2.25)
    # η = 0.5 halves the step: x = 0 - 0.5·(0.5·(-1.5) - 1.5) = 1.125
    half = _algo("fedavgm", "algorithm.server_momentum=0.5", "algorithm.server_lr=0.5")
    assert half.server_step(torch.tensor([0.0]), torch.tensor([1.5]), {"v": torch.tensor([-1.5])}).item() == 1.125


def test_fedavgm_without_momentum_keeps_no_state_and_returns_the_average_bit_for_bit():
    algo = _algo("fedavgm", "algorithm.server_momentum=0")
    assert algo.init_moments(torch.zeros(3)) == {}
    x, avg = torch.randn(1000), torch.randn(1000) * 1e-3
    assert torch.equal(algo.server_step(x, avg, {}), avg)  # x - (x - w̄) would round


# ---------------------------------------------------------------------------------------------- runs in process
def _inline(tmp_path, name, **extra):
    return run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name),
                                                           engine__backend="inline", **extra)))[1]


def test_fedavgm_with_momentum_zero_and_server_lr_one_gives_fedavgs_metrics_exactly(tmp_path):
    fedavg = _inline(tmp_path, "fedavg", algorithm__name="fedavg", rounds=3)
    avgm0 = _inline(tmp_path, "avgm0", algorithm__name="fedavgm", algorithm__server_momentum=0, rounds=3)
    assert strip_timing(avgm0) == strip_timing(fedavg)
    avgm = _inline(tmp_path, "avgm", algorithm__name="fedavgm", rounds=3)  # β = 0.9: the same until round 2
    assert strip_timing(avgm)[0] == strip_timing(fedavg)[0] and strip_timing(avgm)[1:] != strip_timing(fedavg)[1:]


# ---------------------------------------------------------------------------------------------- config
def test_defaults():
    for name, expected in (("fedadam", (0.01, 0.9, 0.99, 1e-3)), ("fedyogi", (0.01, 0.9, 0.99, 1e-3)),
                           ("fedadagrad", (0.1, 0.0, 0.99, 1e-3))):
        a = load_config(None, [f"algorithm.name={name}"]).algorithm
        assert (a.server_lr, a.beta1, a.beta2, a.tau) == expected, name
    a = load_config(None, ["algorithm.name=fedavgm"]).algorithm
    assert (a.server_lr, a.server_momentum) == (1.0, 0.9)


@pytest.mark.parametrize("name,override,key", [
    ("fedadam", "algorithm.server_lr=0", "algorithm.server_lr"),
    ("fedadam", "algorithm.server_lr=nan", "algorithm.server_lr"),
    ("fedyogi", "algorithm.beta2=1", "algorithm.beta2"),
    ("fedadagrad", "algorithm.beta1=-0.1", "algorithm.beta1"),
    ("fedadam", "algorithm.tau=0", "algorithm.tau"),
    ("fedavgm", "algorithm.server_momentum=1", "algorithm.server_momentum"),
])
def test_bad_values_name_the_key(name, override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_config(None, [f"algorithm.name={name}", override])


def test_cli_bad_beta2_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.beta2", *tiny_overrides(tmp_path), "algorithm.name=fedyogi", "algorithm.beta2=1.5")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- on Ray
def test_fedadam_on_ray_matches_one_worker_with_a_worker_killed(ray_cluster, tmp_path):
    """The server's moments live in the server state (driver, checkpoint), untouched by a dead worker."""
    rows = killed_worker_matches_inline(tmp_path, algorithm__name="fedadam", algorithm__server_lr=0.03)
    assert rows[-1]["acc_global"] > 0.2 and {"optimizer"} <= set(_checkpointed_server_state(tmp_path / "one"))


def _checkpointed_server_state(run_dir) -> dict:
    from raysim.engine.state import read_checkpoint

    return read_checkpoint(run_dir)["server_state"]


def test_resume_continues_the_servers_moments(tmp_path):
    def cfg(name, rounds):
        return load_config(None, tiny_overrides(tmp_path / name, rounds=rounds, engine__backend="inline",
                                                algorithm__name="fedyogi", algorithm__server_lr=0.03))

    _, straight, _ = run_experiment(cfg("straight", 4))
    run_experiment(cfg("resumed", 2))
    _, rest, _ = run_experiment(cfg("resumed", 4), resume=True)
    assert [r["round"] for r in rest] == [3, 4] and strip_timing(rest) == strip_timing(straight[2:])
