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
