"""experiments/beyond: every file loads with its method's name (tests/test_shipped_configs.py runs every tiny file for
its rounds and checks that it learns)."""

from __future__ import annotations

from conftest import ROOT
from raysim.config import load_config

BEYOND = ROOT / "experiments" / "beyond"
METHODS = {"scaffold", "feddyn", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedbn", "ditto", "fednova", "fedasync",
           "fedbuff"}


def test_every_file_names_its_method_and_the_table_shares_one_setting():
    tiny = {p.stem.removeprefix("tiny-") for p in BEYOND.glob("tiny-*.yaml")}
    table = {p.stem.removeprefix("dir01-") for p in BEYOND.glob("dir01-*.yaml")}
    assert tiny == METHODS
    assert table == METHODS - {"fedbn", "ditto", "fednova", "fedasync", "fedbuff"} | {"fedavg", "fedprox"}
    base = load_config(BEYOND / "dir01-fedavg.yaml")
    for method in table:
        cfg = load_config(BEYOND / f"dir01-{method}.yaml")
        assert cfg.algorithm.name == method and cfg.name == f"dir01-{method}"
        assert (cfg.data, cfg.model, cfg.train, cfg.clients, cfg.rounds) == (base.data, base.model, base.train,
                                                                           base.clients, base.rounds)
    assert (base.data.alpha, base.train.momentum) == (0.1, 0.0)

