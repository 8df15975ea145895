"""Privacy through a resume: the noise multiplier and the spent budget come back from the checkpoint (a resume with
more rounds under target_epsilon is never recalibrated, so ε never decreases and the budget stop fires), a changed
mechanism key is refused in one line (exit 2), and checkpoints accounted under an older default are continued or
refused honestly."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import read_rows, tiny_overrides

from raysim.cli import main as cli_main
from raysim.config import load_config
from raysim.engine.runner import run_experiment

pytest.importorskip("dp_accounting")

BUDGET = dict(clients__num=12, clients__fraction=0.5, privacy__enabled="true", privacy__clip=0.5,
              privacy__target_epsilon=5, log__tensorboard="false", log__progress="false")


def _cfg(tmp_path, name, **extra):
    return load_config(overrides=tiny_overrides(tmp_path, **{**BUDGET, "log__dir": str(tmp_path / name), **extra}),
                       warn=False)


def test_a_resume_with_more_rounds_keeps_the_noise_and_the_spent_budget(tmp_path, capsys):
    run_experiment(_cfg(tmp_path, "stop", rounds=3))  # z calibrated for 3 rounds: ε(3) = 5
    first = read_rows(tmp_path / "stop")
    z = first[-1]["privacy/noise_multiplier"]
    assert first[-1]["epsilon"] == pytest.approx(5, rel=1e-3) and first[-1]["epsilon"] <= 5
    capsys.readouterr()
    run_experiment(_cfg(tmp_path, "stop", rounds=6), resume=True)  # recalibrating for 6 would lower z and ε(3)
    assert read_rows(tmp_path / "stop") == first  # round 4 would overspend: the run stops before it
    assert "round 4 would bring ε" in capsys.readouterr().err

    run_experiment(_cfg(tmp_path, "warn", rounds=3, privacy__on_budget="warn"))
    run_experiment(_cfg(tmp_path, "warn", rounds=5, privacy__on_budget="warn"), resume=True)
    rows = read_rows(tmp_path / "warn")
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    assert {r["privacy/noise_multiplier"] for r in rows} == {z}  # the checkpoint's z, never recalibrated
    spent = [r["epsilon"] for r in rows]
    assert spent == sorted(spent) and len(set(spent)) == 5 and spent[-1] > 5  # never smaller, past the budget
    whole = _cfg(tmp_path, "whole", rounds=5, privacy__on_budget="warn", privacy__noise_multiplier=z,
                 privacy__target_epsilon="null")
    run_experiment(whole)  # the same z given from the start: the same five rounds
    assert [r["epsilon"] for r in read_rows(tmp_path / "whole")] == spent


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Two finished two-round runs to resume with other settings: DP-FedAvg (with the audit) and DP-SGD."""
    base = tmp_path_factory.mktemp("finished")
    runs = {}
    for name, extra in (("central", dict(privacy__enabled="true", privacy__noise_multiplier=1.0,
                                         privacy__audit_canaries=4)),
                        ("dpsgd", dict(privacy__dpsgd="true"))):
        cfg = load_config(overrides=tiny_overrides(base, rounds=2, log__tensorboard="false", log__progress="false",
                                                   log__dir=str(base / name), **extra), warn=False)
        run_experiment(cfg)
        runs[name] = base / name
    return runs


@pytest.mark.parametrize("run,key,value", [
    ("central", "privacy.clip", 0.7), ("central", "privacy.noise_multiplier", 2.0), ("central", "privacy.delta", 1e-6),
    ("central", "privacy.sampling", "poisson"), ("central", "privacy.accountant", "pld"),
    ("central", "privacy.target_epsilon", 3), ("central", "privacy.audit_canaries", 8),
    ("dpsgd", "privacy.dpsgd_clip", 0.5), ("dpsgd", "privacy.dpsgd_noise", 2.0), ("dpsgd", "privacy.dpsgd_delta", 1e-6),
    ("dpsgd", "privacy.dpsgd_sampling", "shuffle")])
def test_a_changed_mechanism_key_is_refused_on_resume(finished, tmp_path, capsys, run, key, value):
    run_dir = tmp_path / run
    shutil.copytree(finished[run], run_dir)
    before = read_rows(run_dir)
    assert cli_main(["run", "--resume", str(run_dir), "rounds=3", f"{key}={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and key in err and "Traceback" not in err, err
    assert read_rows(run_dir) == before


def _rewrite_checkpoint(run_dir, change) -> None:
    from raysim.engine.state import content_digest, read_checkpoint, server_file

    ckpt = read_checkpoint(run_dir)
    change(ckpt)
    ckpt["sha256"] = content_digest(ckpt)
    torch.save(ckpt, server_file(run_dir))


def test_a_checkpoint_from_the_older_delta_default_goes_on_at_its_delta(finished, tmp_path, capsys):
    # made before δ's default was 0.01 / N: no δ recorded, so it was accounted at 1 / N = 1/4 (tiny: 4 clients)
    run_dir = tmp_path / "old"
    shutil.copytree(finished["central"], run_dir)
    _rewrite_checkpoint(run_dir, lambda ckpt: ckpt["privacy"].pop("delta"))
    assert cli_main(["run", "--resume", str(run_dir), "rounds=3", "--quiet"]) == 0
    assert "accounted its rounds at δ=0.25" in capsys.readouterr().err
    from raysim.privacy.accounting import RoundAccountant

    old = RoundAccountant(load_config(run_dir / "config.yaml", warn=False), 1.0)
    old.delta = 0.25
    rows = read_rows(run_dir)
    assert rows[-1]["privacy/delta"] == 0.25 and rows[-1]["epsilon"] == old.after(3) > old.after(2)


def test_a_dpsgd_checkpoint_from_before_its_sampling_is_refused(finished, tmp_path, capsys):
    run_dir = tmp_path / "old"
    shutil.copytree(finished["dpsgd"], run_dir)
    _rewrite_checkpoint(run_dir, lambda ckpt: (ckpt.pop("dpsgd_mechanism"), ckpt.pop("dpsgd_epochs")))
    assert cli_main(["run", "--resume", str(run_dir), "rounds=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'privacy.dpsgd'" in err and "start a new run" in err, err
