"""``raysim config show``, ``raysim config keys`` and ``raysim list``: what a new user types to find their way."""

from __future__ import annotations

import sys

import yaml

from conftest import EXAMPLE_PLUGINS, ROOT
from raysim.cli import main
from raysim.schema import config_keys


def _out(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_config_show_prints_the_resolved_yaml(capsys):
    code, out = _out(capsys, "config", "show", str(ROOT / "experiments" / "smoke.yaml"), "rounds=3", "train.lr=0.2")
    assert code == 0
    cfg = yaml.safe_load(out)
    assert cfg["rounds"] == 3 and cfg["train"]["lr"] == 0.2 and cfg["name"] == "smoke"
    assert "num_workers" in cfg["engine"]  # every key filled in, not only the file's


def test_config_show_bad_key_is_a_one_line_error(capsys):
    assert main(["config", "show", "train.nope=1"]) == 2
    assert "train.nope" in capsys.readouterr().err


def test_every_builtin_key_has_type_default_and_help():
    for algorithm in ("fedavg", "local", "partialavg", "partialkd", "unideal", "fedrep", "fapd"):
        keys = config_keys(algorithm)
        missing = [k.key for k in keys if not k.help]
        assert not missing, f"{algorithm}: keys without help: {missing}"
        assert all(k.type for k in keys)
    common = {k.key: k for k in config_keys()}
    assert common["train.lr"].type == "float" and common["train.lr"].default == 0.05
    assert common["engine.address"].type == "str | null"


def test_config_keys_lists_an_algorithms_own_keys(capsys):
    code, out = _out(capsys, "config", "keys", "--algorithm", "fapd")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("algorithm.delta_k "))
    assert "int" in line and " 5 " in line and "dimensions added" in line
    assert "algorithm.teacher.epochs" in out and "clients.num" in out


def test_list_shows_names_with_their_first_docstring_line(capsys):
    code, out = _out(capsys, "list", "algorithms")
    assert code == 0
    rows = dict(line.split(None, 1) for line in out.splitlines())  # earlier tests may have registered plugins
    from raysim.registry import _BUILTINS

    assert set(_BUILTINS["algorithm"]) <= set(rows)
    assert all(rows[name].strip() != "(no docstring)" for name in _BUILTINS["algorithm"])
    code, out = _out(capsys, "list", "datasets")
    assert "sklearn_digits" in out and "scikit-learn" in out


def test_list_and_keys_include_plugins(capsys):
    sys.path.insert(0, str(EXAMPLE_PLUGINS))
    try:
        code, out = _out(capsys, "list", "models", "--plugins", "resmlp")
        assert code == 0 and any(line.startswith("resmlp ") for line in out.splitlines())
        code, out = _out(capsys, "config", "keys", "--plugins", "resmlp,blobs", "--model", "resmlp",
                         "--dataset", "blobs")
        assert "model.resmlp.blocks" in out and "data.blobs.spread" in out
    finally:
        sys.path.remove(str(EXAMPLE_PLUGINS))


def test_help_carries_examples(capsys):
    for argv in (["--help"], ["run", "--help"], ["config", "--help"], ["list", "--help"]):
        try:
            main(argv)
        except SystemExit:
            pass
        assert "examples:" in capsys.readouterr().out
