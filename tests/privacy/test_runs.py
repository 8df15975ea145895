"""DP-FedAvg in whole runs (in process, tiny digits): clipping before partial sums (the same metrics with
engine.partial_sums on and off, in any sum groups, inline and on two Ray workers), runs that repeat exactly,
resume with the adaptive clip norm, ε in every round, the budget's stop and warn, and one-line refusals."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import crash_after, read_rows, refused_config, strip_timing, tiny_overrides

from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.errors import UserError

pytest.importorskip("dp_accounting")

PRIVATE = dict(rounds=3, clients__num=12, clients__fraction=0.5, privacy__enabled="true",
               privacy__noise_multiplier=0.8, privacy__clip=0.5, privacy__adaptive_clip="true",
               privacy__count_noise=1.0, privacy__sampling="poisson", log__tensorboard="false",
               log__progress="false")


def _run(tmp_path, name: str, **extra) -> list[dict]:
    settings = dict(PRIVATE, log__dir=str(tmp_path / name))
    settings.update(extra)
    run_experiment(load_config(overrides=tiny_overrides(tmp_path, **settings), warn=False))
    return strip_timing(read_rows(tmp_path / name))


def test_metrics_do_not_depend_on_where_the_sums_were_taken(tmp_path):
    summed = _run(tmp_path, "summed")
    assert _run(tmp_path, "uploads", engine__partial_sums="false") == summed
    assert _run(tmp_path, "groups", engine__sum_group=2, engine__num_workers=2) == summed
    assert _run(tmp_path, "again") == summed  # noise from (seed, round): the run repeats exactly
    assert _run(tmp_path, "seed", seed=1) != summed
    assert all(r["epsilon"] > 0 and "privacy/clip" in r for r in summed)
    assert [r["epsilon"] for r in summed] == sorted(r["epsilon"] for r in summed)
    assert summed[1]["privacy/clip"] != summed[0]["privacy/clip"]  # adaptive: the clip norm moved


def test_resume_gives_the_whole_run_s_numbers(tmp_path):
    whole = _run(tmp_path, "whole")
    cfg = load_config(overrides=tiny_overrides(tmp_path, **dict(PRIVATE, log__dir=str(tmp_path / "part"))),
                      warn=False)
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)  # round 3 needs round 2's adapted clip norm, from the checkpoint
    assert strip_timing(read_rows(tmp_path / "part")) == whole


def test_fixed_size_sampling_a_server_optimiser_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = _run(tmp_path, "fedadam", privacy__sampling="fixed", privacy__adaptive_clip="false",
                algorithm__name="fedadam", rounds=2, log__tensorboard="true")
    assert rows[-1]["epsilon"] > rows[0]["epsilon"] > 0 and rows[0]["clients"] == 6
    acc = EventAccumulator(str(tmp_path / "fedadam"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("privacy/epsilon")] == pytest.approx([r["epsilon"] for r in rows])


def test_the_budget_stops_the_run_or_warns(tmp_path, capsys):
    # z = 0.8 spends ε of about 3.8 by round 1 and 5.4 by round 2 (δ = 0.01/12): a budget of 5 allows one round
    rows = _run(tmp_path, "stop", privacy__target_epsilon=5.0)
    assert [r["round"] for r in rows] == [1] and rows[0]["epsilon"] <= 5.0
    assert "privacy.on_budget=stop" in capsys.readouterr().err
    rows = _run(tmp_path, "warn", privacy__target_epsilon=5.0, privacy__on_budget="warn")
    assert len(rows) == 3 and rows[-1]["epsilon"] > 5.0
    assert capsys.readouterr().err.count("privacy.on_budget=warn") == 1


def _refused(tmp_path, key: str, **extra) -> str:
    """The config loader's one-line refusal naming ``key`` (the CLI's exit 2 is checked for three of them)."""
    with pytest.raises(UserError) as info:
        load_config(overrides=tiny_overrides(tmp_path, **extra), warn=False)
    line = str(info.value)
    assert line.startswith(f"config key '{key}'") and "\n" not in line, line
    return line


def test_bad_privacy_settings_are_one_line(tmp_path, monkeypatch):
    on = dict(privacy__enabled="true")
    refused_config("privacy.noise_multiplier", *tiny_overrides(tmp_path, **on, privacy__noise_multiplier=0))
    _refused(tmp_path, "privacy.noise_multiplier", **on, privacy__noise_multiplier=-1)
    _refused(tmp_path, "privacy.noise_multiplier", **on)  # neither z nor a target ε
    line = refused_config("privacy.enabled", *tiny_overrides(tmp_path, **on, privacy__noise_multiplier=1,
                                                             algorithm__name="scaffold"))
    assert "scaffold" in line and "Uploads.stats" in line
    assert "Uploads.mean" in _refused(tmp_path, "privacy.enabled", **on, privacy__noise_multiplier=1,
                                      algorithm__name="fedbn")
    _refused(tmp_path, "algorithm.weighting", **on, privacy__noise_multiplier=1, algorithm__weighting="samples")
    _refused(tmp_path, "privacy.enabled", **on, privacy__noise_multiplier=1, asynchronous__mode="fedasync")
    # a robust rule is not the sum the noise is calibrated to, and an attack on the uploads would go unsummed
    assert "not a sum" in _refused(tmp_path, "aggregator.name", **on, privacy__noise_multiplier=1,
                                   aggregator__name="median")
    _refused(tmp_path, "attack.name", **on, privacy__noise_multiplier=1, attack__name="sign_flip",
             attack__fraction=0.2)
    _refused(tmp_path, "engine.vectorize", privacy__dpsgd="true", engine__vectorize=4)
    _refused(tmp_path, "privacy.dpsgd_noise", privacy__dpsgd="true", privacy__dpsgd_noise=0)
    _refused(tmp_path, "privacy.dpsgd", privacy__dpsgd="true", algorithm__name="moon")  # its loss is not vmapped
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("dp_accounting", "opacus") else real(name, *a))
    line = refused_config("privacy.enabled", *tiny_overrides(tmp_path, **on, privacy__noise_multiplier=1))
    assert "raysim[privacy]" in line
    assert "raysim[privacy]" in _refused(tmp_path, "privacy.dpsgd", privacy__dpsgd="true")


def test_privacy_off_changes_nothing(tmp_path):
    plain = dict(rounds=2, log__tensorboard="false", log__progress="false")
    a = strip_timing(read_rows(_dir(tmp_path, "a", plain)))
    b = strip_timing(read_rows(_dir(tmp_path, "b", dict(plain, privacy__clip=0.01, privacy__target_epsilon=1))))
    assert a == b and "epsilon" not in a[0]


def _dir(tmp_path, name, settings):
    run_experiment(load_config(overrides=tiny_overrides(tmp_path, **dict(settings, log__dir=str(tmp_path / name))),
                               warn=False))
    return tmp_path / name


@pytest.mark.slow
def test_two_ray_workers_give_the_inline_numbers(tmp_path, ray_cluster):
    """The one Ray test: DP-FedAvg (Poisson sampling, adaptive clipping, the audit's canaries) and DP-SGD (Poisson
    batches) together, two workers (each its own sum groups) against inline."""
    both = dict(rounds=2, privacy__dpsgd="true", engine__sum_group=3, privacy__audit_canaries=8)
    inline = _run(tmp_path, "inline", **both)
    assert _run(tmp_path, "ray", **both, engine__backend="ray", engine__num_workers=2) == inline
    assert all("audit/epsilon" in r and r["dpsgd/epsilon_max"] > 0 for r in inline)


def test_a_checkpoint_from_before_the_privacy_section_resumes(tmp_path):
    """A run checkpointed before ``privacy.*`` existed records none of its keys: absent equals off, so it resumes."""
    import torch

    from raysim.engine.state import content_digest, read_checkpoint, server_file

    plain = dict(rounds=2, log__tensorboard="false", log__progress="false", log__dir=str(tmp_path / "old"))
    cfg = load_config(overrides=tiny_overrides(tmp_path, **plain), warn=False)
    crash_after(cfg, 1)
    ckpt = read_checkpoint(tmp_path / "old")
    ckpt["config"] = {k: v for k, v in ckpt["config"].items() if not k.startswith("privacy.")}
    ckpt["sha256"] = content_digest(ckpt)
    torch.save(ckpt, server_file(tmp_path / "old"))
    run_experiment(cfg, resume=True)
    assert [r["round"] for r in read_rows(tmp_path / "old")] == [1, 2]


def test_a_poisson_round_without_clients_still_releases_the_noise(tmp_path):
    rows = _run(tmp_path, "empty", clients__num=4, clients__fraction=0.05, privacy__adaptive_clip="false")
    assert [r["nonprivate/clients"] for r in rows] == [0, 0, 0]  # Poisson sampling's cohort: a diagnostic
    assert len({r["acc_mean"] for r in rows}) > 1  # the noise alone moved the model


def _refused_at_start(capsys, tmp_path, key: str, **extra) -> str:
    """``raysim run`` refuses before round 1 (after the data are prepared): exit 2, one line naming ``key``."""
    from raysim.cli import main as cli_main

    args = tiny_overrides(tmp_path, log__progress="false", **extra)
    assert cli_main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    line = err.splitlines()[-1]  # after what preparing the data said (FAPD's offline teacher)
    assert line.startswith(f"raysim: error: config key '{key}'") and "Traceback" not in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_rows(tmp_path / "run")
    return line


def test_a_batch_norm_model_is_refused(tmp_path, capsys):
    # DP-FedAvg: before round 1, from the shared entries themselves (a head-only upload keeps its backbone's)
    err = _refused_at_start(capsys, tmp_path, "model.name", model__name="cnn_bn", privacy__enabled="true",
                            privacy__noise_multiplier=1)
    assert "running_mean" in err and "normalisation" in err
    refused_config("privacy.dpsgd", *tiny_overrides(tmp_path, model__name="cnn_bn", privacy__dpsgd="true"))


def test_fapd_s_server_steps_on_client_data_are_refused(tmp_path, capsys):
    on = dict(algorithm__name="fapd", privacy__enabled="true", privacy__noise_multiplier=1)
    # its PCA on a split of the clients' training data that the config does not name (the default carve)
    _refused(tmp_path, "algorithm.teacher.calibration_fraction", **on)
    named = dict(on, data__server_holdout=0.1)
    # its consensus curriculum on acc_global pooled over the clients' test samples
    assert "acc_global" in _refused(tmp_path, "algorithm.curriculum", **named, data__test_split="pooled")
    # data.test_split=official, but the digits have no official test split: refused once the data are known
    _refused_at_start(capsys, tmp_path, "algorithm.curriculum", **named, algorithm__teacher__epochs=1,
                      algorithm__teacher__cache_dir=str(tmp_path / "cache"))
    _refused(tmp_path, "algorithm.teacher.calibration_fraction", algorithm__name="fapd", privacy__dpsgd="true")
    # named public splits and a curriculum that reads no accuracy: accepted
    load_config(overrides=tiny_overrides(tmp_path, **named, algorithm__curriculum="linear"), warn=False)


def test_an_explicit_delta_of_at_least_one_over_n_warns(tmp_path):
    from raysim.checks import config_warnings

    def notes(**extra):
        cfg = load_config(overrides=tiny_overrides(tmp_path, privacy__enabled="true", privacy__noise_multiplier=1,
                                                   **extra), warn=False)
        return [w for w in config_warnings(cfg) if w.startswith("privacy.delta")]

    assert notes() == [] and notes(privacy__delta=1e-4) == []  # the default 0.01 / 4, and one well below 1/4
    assert "1 / clients.num = 0.25" in notes(privacy__delta=0.25)[0]
