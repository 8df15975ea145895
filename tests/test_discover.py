"""``raysim config show``, ``raysim config keys`` and ``raysim list``: what a new user types to find their way."""

from __future__ import annotations

import sys

import pytest
import yaml

from conftest import EXAMPLE_PLUGINS, ROOT, refused_config
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


def _rows(out: str) -> dict[str, str]:
    """`raysim list`'s two columns back as name -> description (a long description wraps onto indented lines)."""
    rows: dict[str, str] = {}
    name = ""
    for line in out.splitlines():
        if line[:1].isspace():
            rows[name] += " " + line.strip()
        else:
            name, _, text = line.partition(" ")
            rows[name] = text.strip()
    return rows


def test_list_shows_names_with_their_first_docstring_line(capsys):
    code, out = _out(capsys, "list", "algorithms")
    assert code == 0
    rows = _rows(out)  # earlier tests may have registered plugins
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
    for argv in (["--help"], ["run", "--help"], ["tune", "--help"], ["report", "--help"], ["config", "--help"],
                 ["list", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0, argv  # argparse exits 0 after printing the help
        out = capsys.readouterr().out
        assert out.startswith("usage: raysim") and "examples:" in out, argv
        examples = out.split("examples:", 1)[1]
        assert "raysim " in examples, argv  # at least one command to copy


# ---------------------------------------------------------------------------------------------- rough edges (#27)
def test_config_show_and_keys_help_carry_examples(capsys):
    for argv in (["config", "show", "--help"], ["config", "keys", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0, argv
        out = capsys.readouterr().out
        assert "examples:" in out and f"raysim config {argv[1]} " in out.split("examples:")[1]


def test_list_descriptions_are_whole_paragraphs(capsys, monkeypatch):
    """Descriptions were the docstring's first line, cut mid-sentence; now the whole first paragraph, wrapped."""
    monkeypatch.setenv("COLUMNS", "100")
    code, out = _out(capsys, "list", "models")
    assert code == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mobilenet_v2 "))
    indent = lines[start].index("torchvision")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    text = " ".join(line[indent:].strip() for line in lines[start:end])
    assert text.endswith("and the final 1x1 convolution (1280).")
    assert all(len(line) <= 100 for line in lines)


@pytest.mark.parametrize("kind", ["algorithm", "model", "dataset"])
def test_list_reads_the_same_descriptions_it_would_get_by_importing(kind):
    """`raysim list` reads built-ins' docstrings from source (no torch, no torchvision); they are the imported
    objects' own."""
    from raysim import registry

    registry._load_builtins(kind)
    table = registry._TABLES[kind]
    static = registry._static_docs(kind)
    for name in registry._BUILTINS[kind]:
        module = sys.modules[table[name].__module__]
        doc = table[name].__doc__ or module.__doc__ or ""
        assert registry.first_paragraph(static[name]) == registry.first_paragraph(doc), name


@pytest.mark.slow
def test_list_imports_neither_torch_nor_torchvision():
    """`raysim list` took 2.6-5.1 s (9 s for models): it imported every module, torch and torchvision with them."""
    import subprocess

    code = ("import sys; from raysim.cli import main\n"
            "for kind in ('algorithms', 'models', 'datasets', 'experiments'): main(['list', kind])\n"
            "print([m for m in ('torch', 'torchvision', 'sklearn', 'ray') if m in sys.modules], file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == "[]"
    assert "fedprox " in done.stdout and "resnet18 " in done.stdout and "sklearn_digits " in done.stdout


def test_list_experiments_and_run_them_by_name(capsys, tmp_path, monkeypatch):
    code, out = _out(capsys, "list", "experiments")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert {"smoke", "default", "unideal/digits-niid1-cpu/unideal", "sweeps/smoke-lr"} <= set(names)
    assert "finishes in well under a minute" in " ".join(out.split())  # however the terminal wraps it
    monkeypatch.chdir(tmp_path)  # anywhere: a shipped experiment is found by name
    code, out = _out(capsys, "config", "show", "unideal/digits-niid1-cpu/unideal", "rounds=2")
    assert code == 0 and yaml.safe_load(out)["algorithm"]["name"] == "unideal" and yaml.safe_load(out)["rounds"] == 2
    code, out = _out(capsys, "config", "show", "experiments/smoke.yaml")  # the README's paths work too
    assert code == 0 and yaml.safe_load(out)["name"] == "smoke"
    assert main(["config", "show", "no-such-experiment"]) == 2
    assert "raysim list experiments" in capsys.readouterr().err


def test_unknown_algorithm_key_names_the_algorithms_that_have_it():
    err = refused_config("algorithm.mu", "algorithm.mu=0.1")
    assert "fedavg has no key mu, but fednova, fedprox, moon do (set algorithm.name=fednova)" in err


def test_plugin_off_the_path_gets_a_pythonpath_hint(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_plugins").mkdir()
    (tmp_path / "my_plugins" / "fancy_avg.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert main(["config", "show", "plugins=[fancy_avg]"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "found my_plugins/fancy_avg.py, so run `export PYTHONPATH=my_plugins`" in err
    assert main(["config", "show", "plugins=[nowhere_at_all]"]) == 2
    assert "put the folder holding nowhere_at_all.py on PYTHONPATH" in capsys.readouterr().err
