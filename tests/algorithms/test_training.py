"""raysim.algorithms.training: LocalOptimizer takes torch.optim's steps bit for bit, without torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from raysim.algorithms.training import LocalOptimizer, batch_bounds


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, generator=g).requires_grad_(), torch.randn(3, generator=g).requires_grad_(),
            torch.randn(2, generator=g).requires_grad_()]  # the last never gets a gradient


def _train(make, steps: int = 6) -> list[torch.Tensor]:
    params = _params(0)
    opt = make(params)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        x = torch.randn(4, 5, generator=g)
        loss = ((x @ params[0] + params[1]) ** 2).mean() * (step + 1)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in params]


SETTINGS = [("sgd", {}), ("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.5, "weight_decay": 1e-3}),
            ("adam", {}), ("adam", {"weight_decay": 1e-2})]


@pytest.mark.parametrize("kind,options", SETTINGS)
def test_local_optimizer_takes_torch_optims_steps_bit_for_bit(kind, options):
    torch_class = torch.optim.SGD if kind == "sgd" else torch.optim.Adam
    ours = _train(lambda ps: LocalOptimizer(ps, kind=kind, lr=0.05, **options))
    theirs = _train(lambda ps: torch_class(ps, lr=0.05, **options))
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    assert not torch.equal(ours[0], _params(0)[0])  # it trained
    assert torch.equal(ours[2], _params(0)[2])  # a parameter without a gradient is left alone, as torch.optim does


def test_local_optimizer_keeps_state_as_torch_optim_does():
    params = _params(0)
    opt = LocalOptimizer(params, kind="adam", lr=0.1)
    params[0].grad = torch.ones_like(params[0])
    opt.step()
    opt.step()
    state = opt.state[params[0]]
    assert float(state["step"]) == 2.0 and state["exp_avg"].shape == params[0].shape
    assert params[1] not in opt.state  # no gradient, no state
    sgd = LocalOptimizer(params, kind="sgd", lr=0.1, momentum=0.9)
    params[0].grad = torch.full_like(params[0], 2.0)
    sgd.step()
    assert torch.equal(sgd.state[params[0]]["momentum_buffer"], torch.full_like(params[0], 2.0))
    sgd.zero_grad()
    assert params[0].grad is None


def test_local_optimizer_refuses_what_torch_optim_refuses():
    with pytest.raises(ValueError):
        LocalOptimizer(_params(0), kind="sgd", lr=-1.0)
    with pytest.raises(ValueError):
        LocalOptimizer(_params(0), kind="rmsprop", lr=0.1)


def test_a_run_in_process_never_imports_torch_dynamo(tmp_path):
    """What LocalOptimizer is for: a whole run in process trains and evaluates without torch._dynamo."""
    code = ("import sys; from raysim.config import load_config; from raysim.engine.runner import run_experiment; "
            f"run_experiment(load_config(None, ['rounds=1', 'clients.num=3', 'data.name=sklearn_digits', "
            f"'model.name=mlp', 'model.hidden=[8]', 'engine.backend=inline', 'log.dir={tmp_path / 'run'}', "
            "'log.progress=false'])); print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_batch_bounds_joins_a_trailing_single_sample():
    assert batch_bounds(7, 3) == [(0, 3), (3, 7)]
    assert batch_bounds(6, 3) == [(0, 3), (3, 6)]
    assert batch_bounds(1, 3) == [(0, 1)]
