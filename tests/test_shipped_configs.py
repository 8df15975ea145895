"""Every shipped experiment of smoke size learns: experiments/smoke.yaml and every ``tiny-*.yaml`` under
experiments/, each run in process for its own rounds with its own seed, must keep every round's loss finite, end
with a lower loss than its first round, and end with an accuracy above chance by ``MARGIN``.

The margin, measured on seeds 0-4 (this machine, ``engine.backend=inline``): the final round's acc_mean, over the
five seeds, was

    smoke 0.80-0.89        tiny-ditto 0.82-0.91      tiny-fedadagrad 0.65-0.86   tiny-fedadam 0.55-0.72
    tiny-fedavgm 0.81-0.89 tiny-fedbn 0.89-0.93      tiny-feddyn 0.82-0.92       tiny-fedyogi 0.54-0.72
    tiny-scaffold 0.64-0.72   tiny-fednova 0.79-0.86    tiny-fedbuff 0.73-0.92      tiny-fedasync 0.71-0.82

and acc_global, where there is one, 0.56-0.91. Chance is 0.1 (ten digits), so every config cleared chance by at
least 0.44 on every seed; the test asks for 0.3. tiny-scaffold before issue 38 (momentum 0.9 inherited from
smoke.yaml, against SCAFFOLD's plain steps) ended at 0.04-0.31 with its loss rising to 3.3-23.7: it fails here.
"""

from __future__ import annotations

import math

import pytest
from conftest import ROOT

import raysim
from raysim.config import load_config

EXPERIMENTS = ROOT / "experiments"
SHIPPED = sorted([EXPERIMENTS / "smoke.yaml", *EXPERIMENTS.rglob("tiny-*.yaml")])
CHANCE = {"sklearn_digits": 0.1}  # 1 / classes, by data.name
MARGIN = 0.3  # above chance, at the last round (see the measured ranges above)


def test_the_shipped_set_is_what_it_should_be():
    names = {p.stem for p in SHIPPED}
    assert {"smoke", "tiny-scaffold", "tiny-feddyn", "tiny-ditto", "tiny-fedbn"} <= names and len(names) >= 9


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_config_learns(path, tmp_path):
    cfg = load_config(path)
    assert cfg.data.name in CHANCE, f"add the chance accuracy of {cfg.data.name} to CHANCE"
    floor = CHANCE[cfg.data.name] + MARGIN
    rows = raysim.run(path, "engine.backend=inline", "engine.num_workers=1", f"log.dir={tmp_path / 'run'}",
                      progress=False).metrics
    assert len(rows) == cfg.rounds
    losses = rows["loss"].tolist()
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0], f"{path.name}: loss went from {losses[0]:.3f} to {losses[-1]:.3f}"
    last = rows.iloc[-1]
    assert last["acc_mean"] >= floor, f"{path.name}: acc_mean {last['acc_mean']:.3f} < {floor:.2f}"
    if "acc_global" in rows and last["acc_global"] is not None and not math.isnan(last["acc_global"]):
        assert last["acc_global"] >= floor, f"{path.name}: acc_global {last['acc_global']:.3f} < {floor:.2f}"
