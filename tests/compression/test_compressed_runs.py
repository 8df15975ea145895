"""Compressed runs (tiny digits, in process): the same metrics wherever the sums were taken and after a resume (error
feedback's residual lives in the client state store and its checkpoint), the encodings' bytes in ``bytes_up``,
``bytes_down`` and the simulated clock, one-line refusals, and two Ray workers with one killed."""

from __future__ import annotations

import math

import pytest
from conftest import (crash_after, kill_group_once, killed_worker_matches_inline, launch_cli, read_rows, refused_config,
                      strip_timing, tiny_overrides)

from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.errors import UserError

EF = dict(rounds=3, clients__num=6, clients__fraction=0.5, compression__up="topk", compression__ratio=0.1,
          compression__error_feedback="true", compression__down="half", log__tensorboard="false",
          log__progress="false")


def _cfg(tmp_path, name: str, **extra):
    return load_config(None, tiny_overrides(tmp_path, **dict(EF, log__dir=str(tmp_path / name), **extra)), warn=False)


def _run(tmp_path, name: str, **extra) -> list[dict]:
    run_experiment(_cfg(tmp_path, name, **extra))
    return strip_timing(read_rows(tmp_path / name))


def test_a_compressed_run_repeats_and_does_not_depend_on_where_the_sums_were_taken(tmp_path):
    summed = _run(tmp_path, "summed")
    assert _run(tmp_path, "uploads", engine__partial_sums="false") == summed
    assert _run(tmp_path, "groups", engine__sum_group=1) == summed
    assert _run(tmp_path, "again") == summed
    assert _run(tmp_path, "no-feedback", compression__error_feedback="false") != summed  # the residual is used


def test_error_feedback_resumes_with_each_client_s_residual(tmp_path):
    whole = _run(tmp_path, "whole")
    cfg = _cfg(tmp_path, "part")
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)  # round 3's clients add back what their compressors dropped before
    assert strip_timing(read_rows(tmp_path / "part")) == whole


def _float_tensors(tmp_path) -> list[int]:
    from raysim.algorithms.base import live_state
    from raysim.models import build_model

    cfg = load_config(None, tiny_overrides(tmp_path), warn=False)
    model = build_model(cfg, cfg.model.for_client(0), (64,), 10, 0)
    return [v.numel() for v in live_state(model).values() if v.is_floating_point()]


def test_bytes_are_the_encodings(tmp_path):
    sizes = _float_tensors(tmp_path)
    plain = _run(tmp_path, "plain", compression__up="off", compression__error_feedback="false",
                 compression__down="off")
    signs = _run(tmp_path, "sign", compression__up="sign", compression__error_feedback="false",
                 compression__down="off")
    # a client's upload: each float32 tensor as one bit an entry and a float32 scale; 3 clients a round
    assert signs[0]["bytes_up"] == 3 * sum(4 + math.ceil(d / 8) for d in sizes)
    assert plain[0]["bytes_up"] == 3 * sum(4 * d for d in sizes)
    half = _run(tmp_path, "half")
    assert half[0]["bytes_down"] == plain[0]["bytes_down"] // 2  # float16: 2 bytes an entry, 3 clients each


def test_the_simulated_clock_counts_the_encoded_bytes(tmp_path):
    system = dict(system__enabled="true", system__speed__median=50, system__latency__median=0.1,
                  system__up__median=2e4, compression__error_feedback="false", compression__down="off")
    full = _run(tmp_path, "full", compression__up="off", **system)
    top = _run(tmp_path, "top", **system)
    assert top[-1]["sim_time_s"] < full[-1]["sim_time_s"]  # a tenth of the values: the uploads finish sooner


def test_bad_compression_settings_are_one_line(tmp_path):
    for ratio in (0, 1.5):
        refused_config("compression.ratio", *tiny_overrides(tmp_path, compression__up="topk",
                                                            compression__ratio=ratio))
    for bits in (0, 33):
        refused_config("compression.bits", *tiny_overrides(tmp_path, compression__up="qsgd", compression__bits=bits))
    refused_config("compression.bits", *tiny_overrides(tmp_path, compression__up="qsgd", compression__bits=1))
    refused_config("compression.up", *tiny_overrides(tmp_path, compression__up="zip"))
    refused_config("compression.error_feedback", *tiny_overrides(tmp_path, compression__error_feedback="true"))
    with pytest.raises(UserError) as info:  # two keys together: the loader's line (the CLI lists each override's)
        load_config(None, tiny_overrides(tmp_path, compression__up="topk", compression__error_feedback="true",
                                         privacy__enabled="true", privacy__noise_multiplier=1), warn=False)
    assert str(info.value).startswith("config key 'compression.error_feedback'") and "DP-FedAvg" in str(info.value)


def test_compression_off_changes_nothing(tmp_path):
    a = _run(tmp_path, "a", compression__up="off", compression__error_feedback="false", compression__down="off")
    b = _run(tmp_path, "b", compression__up="off", compression__error_feedback="false", compression__down="off",
             compression__ratio=0.5, compression__bits=8)
    assert a == b


@pytest.mark.slow
def test_a_compressed_run_gives_the_same_numbers_on_two_ray_workers_one_killed(ray_cluster, tmp_path):
    """Error feedback's residual is client state: a killed job runs again from it on another worker."""
    rows = killed_worker_matches_inline(tmp_path, compression__up="qsgd", compression__bits=2,
                                        compression__error_feedback="true", compression__down="qsgd")
    assert all(r["bytes_up"] < 10_000 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["compressed", "secure"])
def test_sigkill_then_resume_gives_the_uninterrupted_metrics(tmp_path, cli_env, what):
    """``raysim run`` (in process) SIGKILLed after round 3 of 5, then ``--resume``: a compressed run with error
    feedback (each client's residual from the checkpointed client state store) and a secure-aggregation run."""
    from raysim.cli import main

    extra = {"compressed": dict(compression__up="qsgd", compression__bits=2, compression__error_feedback="true"),
             "secure": dict(secagg__enabled="true", secagg__neighbours=2, compression__up="topk",
                            compression__ratio=0.2)}[what]
    settings = dict(rounds=5, clients__num=6, clients__fraction=0.5, log__tensorboard="false", **extra)
    args = tiny_overrides(tmp_path, log__dir=str(tmp_path / "killed"), **settings)
    kill_group_once(launch_cli(["run", *args], cli_env), "round 3/5")
    assert len(read_rows(tmp_path / "killed")) < 5  # killed before its end
    assert main(["run", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "whole"), **settings),
                               warn=False))
    assert strip_timing(read_rows(tmp_path / "killed")) == strip_timing(read_rows(tmp_path / "whole"))
