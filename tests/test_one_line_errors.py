"""User mistakes of issue 39's table that must be one line and exit 2, never a traceback: train.lr=inf, YAML
duplicate keys and tabs (naming key and line), engine.dashboard without its extra, search.seed without
search.name."""

from __future__ import annotations

import pytest

from conftest import ROOT, refused_config
from raysim.errors import UserError


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_non_finite_learning_rate_is_refused_up_front(value):
    line = refused_config("train.lr", f"train.lr={value}")
    assert "must be a finite number > 0" in line, line


@pytest.mark.parametrize("text, says", [
    ("rounds: 2\nseed: 1\nrounds: 3\n", "found duplicate key rounds at line 3, column 1"),
    ("train:\n  lr: 0.1\n  lr: 0.2\n", "found duplicate key lr at line 3, column 3"),
    ("rounds: 2\ntrain:\n\tlr: 0.1\n", "a tab at line 3, column 1: YAML indents with spaces only"),
])
def test_yaml_mistakes_name_the_key_and_the_line(tmp_path, capsys, text, says):
    from raysim.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["config", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"raysim: error: {path}: not valid YAML ({says})", err


def test_the_dashboard_without_its_extra_is_one_line_naming_it(monkeypatch):
    import ray

    from raysim.config import load_config
    from raysim.engine.resources import start_ray

    monkeypatch.setattr(ray._private.utils, "get_dashboard_dependency_error",
                        lambda: ImportError("No module named 'aiohttp_cors'"))
    started = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append(k))
    cfg = load_config(None, ["engine.dashboard=true", "engine.address=local"])
    with pytest.raises(UserError, match=r"engine.dashboard.*aiohttp_cors.*pip install 'raysim\[dashboard\]'"):
        start_ray(cfg.engine)
    assert started == []  # refused before Ray starts


def test_search_seed_alone_seeds_the_default_searcher():
    from raysim.tune.spec import check_spec, load_sweep

    spec = load_sweep(ROOT / "experiments" / "sweeps" / "smoke-lr.yaml", ["search.seed=0"])
    assert spec.search == {"name": "random", "seed": 0}
    check_spec(spec)


def test_counts_of_one_are_singular():
    from raysim.tables import counted
    from raysim.tune.naming import SeedNaming, TrialNaming

    assert (counted(1, "time"), counted(2, "time"), counted(0, "trial")) == ("1 time", "2 times", "0 trials")
    assert TrialNaming().what(1) == "sweep of 1 trial"
    assert (SeedNaming().what(1), SeedNaming().what(3)) == ("1 seed", "3 seeds")
