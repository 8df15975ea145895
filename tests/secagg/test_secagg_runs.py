"""Secure-aggregation runs (tiny digits, in process): plain FedAvg's numbers within the fixed-point error, the same
metrics wherever the sums were taken and after a resume, composed with DP-FedAvg, with dropouts in simulated time
and with QSGD summed in the ring, the protocol's bytes, one-line refusals, and two Ray workers with one killed."""

from __future__ import annotations

import pytest
from conftest import crash_after, killed_worker_matches_inline, read_rows, refused_config, strip_timing, tiny_overrides

from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.errors import RunStopped, UserError
from raysim.secagg import ring

BASE = dict(rounds=3, clients__num=6, clients__fraction=0.5, log__tensorboard="false", log__progress="false")
ON = dict(secagg__enabled="true")
SYSTEM = dict(system__enabled="true", system__speed__median=50, system__speed__spread=10, system__dropout=0.3,
              system__latency__median=0.5, clients__num=8, clients__fraction=0.5)


def _cfg(tmp_path, name: str, **extra):
    return load_config(None, tiny_overrides(tmp_path, **dict(BASE, log__dir=str(tmp_path / name), **extra)),
                       warn=False)


def _run(tmp_path, name: str, **extra) -> list[dict]:
    run_experiment(_cfg(tmp_path, name, **extra))
    return strip_timing(read_rows(tmp_path / name))


def _close(a: list[dict], b: list[dict]) -> None:
    """The same run within the fixed-point error: its losses to 1e-5, its accuracies to a test sample or two."""
    for x, y in zip(a, b, strict=True):
        loss = "loss" if "loss" in y else "nonprivate/loss"  # a private run logs its training loss as a diagnostic
        assert x[loss] == pytest.approx(y[loss], rel=1e-5) and x["acc_mean"] == pytest.approx(y["acc_mean"], abs=0.01)


def test_secure_aggregation_gives_fedavg_s_numbers_wherever_the_sums_were_taken(tmp_path):
    plain = _run(tmp_path, "plain")
    masked = _run(tmp_path, "masked", **ON)
    _close(masked, plain)
    assert _run(tmp_path, "uploads", **ON, engine__partial_sums="false") == masked
    assert _run(tmp_path, "groups", **ON, engine__sum_group=1) == masked
    assert _run(tmp_path, "plus", **ON, secagg__neighbours=2) == _run(tmp_path, "plus-again", **ON,
                                                                      secagg__neighbours=2)
    # bytes: 3 clients a round, each its masked vector (its model's entries and its weight, 32 bits each) and the
    # protocol's messages with its 2 peers (Bonawitz et al.'s sizes); and the peers' keys and shares it receives
    entries = plain[0]["bytes_up"] // 3 // 4
    up, down = ring.traffic(2, entries + 1, 32)
    assert masked[0]["bytes_up"] == 3 * up and masked[0]["bytes_down"] == plain[0]["bytes_down"] + 3 * down
    assert all(r["secagg/dropped"] == 0 for r in masked)


def test_a_resumed_secure_aggregation_run_gives_the_whole_run_s_numbers(tmp_path):
    whole = _run(tmp_path, "whole", **ON, compression__up="topk", compression__ratio=0.2)
    cfg = _cfg(tmp_path, "part", **ON, compression__up="topk", compression__ratio=0.2)
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == whole


def test_with_dp_fedavg_the_noise_goes_on_the_decoded_sum(tmp_path):
    pytest.importorskip("dp_accounting")
    dp = dict(privacy__enabled="true", privacy__noise_multiplier=0.7, privacy__clip=0.5)
    _close(_run(tmp_path, "masked-dp", **ON, **dp), _run(tmp_path, "dp", **dp))


def test_dropouts_in_simulated_time_are_unmasked_through_their_neighbours(tmp_path):
    plain = _run(tmp_path, "clock", **SYSTEM)
    masked = _run(tmp_path, "clock-masked", **SYSTEM, **ON, secagg__neighbours=2)
    assert sum(r["secagg/dropped"] for r in masked) == sum(r["dropouts"] for r in plain) > 0
    _close(masked, plain)
    # the protocol's bytes take simulated time: each round lasts longer
    assert all(m["round_sim_s"] > p["round_sim_s"] for m, p in zip(masked, plain))
    with pytest.raises(RunStopped, match="cannot be unmasked"):  # every holder must survive: a dropout stops it
        _run(tmp_path, "clock-strict", **SYSTEM, **ON, secagg__threshold=1.0)


def test_qsgd_levels_are_summed_in_a_narrow_ring(tmp_path):
    qsgd = dict(compression__up="qsgd", compression__bits=4, secagg__range=0.25, algorithm__weighting="uniform")
    narrow = _run(tmp_path, "narrow", **ON, **qsgd, secagg__bits=8)  # 3 clients x 7 levels fit 8 bits
    wide = _run(tmp_path, "wide", **ON, **qsgd, secagg__bits=32)
    assert [r["loss"] for r in narrow] == [r["loss"] for r in wide]  # the same levels, summed exactly in either
    assert narrow[0]["bytes_up"] < wide[0]["bytes_up"]
    with pytest.raises(UserError, match="secagg.bits"):  # the training samples as weights overflow 8 bits
        run_experiment(_cfg(tmp_path, "samples", **ON, **{**qsgd, "algorithm__weighting": "samples"},
                            secagg__bits=8))


def test_what_secure_aggregation_cannot_serve_is_one_line(tmp_path):
    line = refused_config("secagg.enabled", *tiny_overrides(tmp_path, **ON, aggregator__name="median"))
    assert "median" in line
    assert "Uploads.apart" in refused_config("secagg.enabled", *tiny_overrides(tmp_path, **ON,
                                                                               algorithm__name="fedcda"))
    refused_config("secagg.enabled", *tiny_overrides(tmp_path, **ON, asynchronous__mode="fedbuff"))
    refused_config("secagg.enabled", *tiny_overrides(tmp_path, **ON, attack__name="sign_flip",
                                                     attack__fraction=0.25))
    # 4 clients x values in [-4, 4] at 4 fractional bits (4 x 4 x 16 = 256) overflow a ring of 8 bits (up to 127)
    line = refused_config("secagg.frac_bits", *tiny_overrides(tmp_path, **ON, secagg__bits=8, secagg__frac_bits=4))
    assert "overflow" in line
    refused_config("secagg.bits", *tiny_overrides(tmp_path, **ON, secagg__bits=65))
    refused_config("secagg.bits", *tiny_overrides(tmp_path, **ON, secagg__bits=4))  # not even whole numbers fit
    refused_config("secagg.neighbours", *tiny_overrides(tmp_path, **ON, secagg__neighbours=3))
    refused_config("secagg.threshold", *tiny_overrides(tmp_path, **ON, secagg__threshold=0))


@pytest.mark.slow
def test_a_secure_aggregation_run_gives_the_same_numbers_on_two_ray_workers_one_killed(ray_cluster, tmp_path):
    """The masks are functions of (seed, round, clients): a killed job masks again the same on another worker."""
    rows = killed_worker_matches_inline(tmp_path, secagg__enabled="true", secagg__neighbours=2)
    assert all("secagg/dropped" in r for r in rows)
