"""Warnings for settings that run but mean less than they seem: the data's own, and those an algorithm declares."""

from __future__ import annotations

from raysim import registry
from raysim.algorithms.base import Algorithm
from raysim.checks import config_warnings
from raysim.config import load_config


class _Cautious(Algorithm):
    @classmethod
    def config_warnings(cls, cfg):
        return [f"rounds={cfg.rounds} is few"] if cfg.rounds < 3 else []


def test_an_algorithms_declared_warnings_are_collected_and_printed(monkeypatch, capsys):
    monkeypatch.setitem(registry._ALGORITHMS, "cautious", _Cautious)
    cfg = load_config(None, ["algorithm.name=cautious", "rounds=2"])
    assert capsys.readouterr().err == "raysim: warning: rounds=2 is few\n"
    assert config_warnings(cfg) == ["rounds=2 is few"]
    load_config(None, ["algorithm.name=cautious", "rounds=5"])
    assert capsys.readouterr().err == ""
    # the data's warning comes first, then the algorithm's
    both = load_config(None, ["algorithm.name=cautious", "rounds=2", "data.partition=niid2", "clients.num=1",
                              "data.name=sklearn_digits"], warn=False)
    warnings = config_warnings(both)
    assert len(warnings) == 2 and "exactly niid1" in warnings[0] and warnings[1] == "rounds=2 is few"
