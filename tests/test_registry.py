"""The registry imports only the module that defines a looked-up built-in, and its name map is complete."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raysim import registry
from raysim.errors import UserError


@pytest.mark.parametrize("kind", ["algorithm", "model", "dataset"])
def test_builtin_map_names_every_builtin_and_its_module(kind):
    registry._load_builtins(kind)
    table = {"algorithm": registry._ALGORITHMS, "model": registry._MODELS, "dataset": registry._DATASETS}[kind]
    builtin = {name: obj.__module__ for name, obj in table.items() if obj.__module__.startswith("raysim.")}
    assert builtin == registry._BUILTINS[kind]


@pytest.mark.slow
def test_looking_up_a_small_model_does_not_import_torchvision():
    code = ("import sys; from raysim.registry import get_model, get_dataset, get_algorithm; "
            "get_model('mlp'); get_dataset('sklearn_digits'); get_algorithm('fedavg'); "
            "print('torchvision' in sys.modules, 'raysim.models.zoo' in sys.modules, 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False"]
    # a zoo model still resolves, by importing its module on demand
    assert registry.get_model("resnet18").__module__ == "raysim.models.zoo"


def test_unknown_name_lists_every_builtin():
    with pytest.raises(UserError, match=r"config key 'model.name': unknown model 'nope'; known: .*cnn.*resnet18"):
        registry.get_model("nope")


def test_every_builtin_config_is_its_algorithms_own_and_loads_without_it():
    """``algorithm_config`` (what loading a config uses) gives each built-in's Config without importing the
    algorithm; it must be the very class the algorithm declares, for every built-in name."""
    assert set(registry._BUILTIN_CONFIGS) == set(registry._BUILTINS["algorithm"])
    for name in registry.builtin_names("algorithm"):
        assert registry.algorithm_config(name) is registry.get_algorithm(name).Config, name


def test_a_builtins_warnings_are_its_configs():
    """Loading a config warns from the Config alone while a built-in is not imported (checks.config_warnings), which
    says the same only while no built-in algorithm overrides ``Algorithm.config_warnings``."""
    from raysim.algorithms.base import Algorithm

    overriding = [n for n in registry.builtin_names("algorithm")
                  if registry.get_algorithm(n).config_warnings.__func__ is not Algorithm.config_warnings.__func__]
    assert overriding == []


def test_an_unknown_algorithm_is_refused_alike_with_or_without_importing_the_builtins():
    with pytest.raises(UserError) as light:
        registry.algorithm_config("fedavgg")
    with pytest.raises(UserError) as full:
        registry.get_algorithm("fedavgg")
    assert str(light.value) == str(full.value)
    assert "did you mean 'fedavg'" in str(light.value) and "scaffold" in str(light.value)
    assert registry.algorithm_names() == registry.names("algorithm")


def test_a_builtin_without_a_torch_free_config_still_resolves(monkeypatch):
    """A built-in added without an entry in ``_BUILTIN_CONFIGS`` is looked up through its algorithm (slower: torch),
    never refused as unknown."""
    from raysim.algorithms.configs.fedprox import FedProxConfig

    monkeypatch.delitem(registry._BUILTIN_CONFIGS, "fedprox")
    monkeypatch.delitem(registry._ALGORITHMS, "fedprox", raising=False)  # as if never imported (restored after)
    monkeypatch.delitem(sys.modules, "raysim.algorithms.fedprox", raising=False)
    assert registry.algorithm_config("fedprox") is FedProxConfig
    assert "fedprox" in registry._ALGORITHMS  # through its algorithm
