"""What a private run logs: every key is either released (a function of the noised aggregate, of the mechanism's
public parameters, or of data outside the guarantee) or a non-private diagnostic under ``nonprivate/``, in
``metrics.jsonl`` and on TensorBoard. Each run's keys are listed in full, so that a new key must be classified here
(and in docs/reference.md, *What the metrics release*)."""

from __future__ import annotations

import pytest
from conftest import read_rows, tiny_overrides

from raysim.config import load_config
from raysim.engine.runner import run_experiment

pytest.importorskip("dp_accounting")

# released: the round; the released model's accuracy on held-out test samples that nothing in training, the
# mechanism or a server step reads (the experimenter's measurement, as a DP paper reports test accuracy); the clip
# norm (moved only by the noised count); the mechanism's public parameters and the accountant's ε; the audit (the
# released model against public random canaries); timings and the engine's own choices
RELEASED = {"round", "acc_mean", "acc_global", "acc_weighted", "privacy/clip", "privacy/noise_multiplier",
            "privacy/delta", "epsilon", "wall_s", "wall_s_total"}
ADAPTIVE = {"privacy/unclipped"}  # the noised unclipped share that adaptive clipping spends budget on
AUDIT = {"audit/epsilon", "audit/cosine_mean", "audit/cosine_std", "audit/null_mean", "audit/null_std"}
# fixed-size sampling: the cohort's size and its bytes are fixed by the config
FIXED_COHORT = {"clients", "bytes_up", "bytes_down", "bytes_up_total", "bytes_down_total"}
# computed from un-noised client data: the clients' training loss and its parts, the exact unclipped share;
# under Poisson sampling, who took part (the cohort's size and the bytes that follow it)
LOSS = {"nonprivate/loss", "nonprivate/loss_ce", "nonprivate/loss_prox"}
POISSON_COHORT = {f"nonprivate/{k}" for k in FIXED_COHORT}


def _keys(tmp_path, name, **extra) -> list[set]:
    algorithm = {} if "algorithm__name" in extra else dict(algorithm__name="fedprox", algorithm__mu=0.1)
    settings = dict(rounds=2, clients__num=12, clients__fraction=0.5, **algorithm, privacy__enabled="true",
                    privacy__noise_multiplier=1.0, privacy__clip=0.5, log__progress="false",
                    log__dir=str(tmp_path / name))
    settings.update(extra)
    run_experiment(load_config(overrides=tiny_overrides(tmp_path, **settings), warn=False))
    return [set(r) - {"vectorize"} for r in read_rows(tmp_path / name)]  # the engine's setting, where logged


def test_poisson_sampling_adaptive_clipping_and_the_audit(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    keys = _keys(tmp_path, "poisson", privacy__sampling="poisson", privacy__adaptive_clip="true",
                 privacy__count_noise=1.0, privacy__audit_canaries=4, clients__fraction=0.9)
    assert keys[-1] == RELEASED | ADAPTIVE | AUDIT | LOSS | POISSON_COHORT | {"nonprivate/unclipped"}
    acc = EventAccumulator(str(tmp_path / "poisson"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"nonprivate/loss", "nonprivate/clients", "nonprivate/unclipped", "privacy/epsilon",
            "audit/epsilon"} <= tags
    assert not {"loss/train", "loss/ce", "metrics/clients", "comm/bytes_up"} & tags


def test_fixed_size_sampling_with_skipped_updates(tmp_path):
    keys = _keys(tmp_path, "fixed", engine__on_nonfinite="skip")
    # a dropped non-finite update is the client's data speaking, and the uploads that reached the server count it
    moved = {"nonprivate/bytes_up", "nonprivate/bytes_up_total"}
    assert keys[-1] == RELEASED | LOSS | (FIXED_COHORT - {"bytes_up", "bytes_up_total"}) | moved | {
        "nonprivate/unclipped"}


def test_dpsgd_alone(tmp_path):
    keys = _keys(tmp_path, "dpsgd", privacy__enabled="false", privacy__dpsgd="true")
    released = {"round", "acc_mean", "acc_global", "acc_weighted", "wall_s", "wall_s_total", "dpsgd/epsilon_max",
                "dpsgd/epsilon_mean"}
    assert keys[-1] == released | LOSS | FIXED_COHORT


def test_an_algorithm_s_own_diagnostic(tmp_path):
    # FAPD on a named server split with a curriculum that reads no accuracy; its offline teacher's accuracy is
    # measured on the clients' samples
    keys = _keys(tmp_path, "fapd", algorithm__name="fapd", data__server_holdout=0.1, algorithm__curriculum="linear",
                 algorithm__teacher__epochs=1, algorithm__teacher__cache_dir=str(tmp_path / "cache"), rounds=1,
                 log__tensorboard="false")
    assert "nonprivate/curriculum/teacher_acc" in keys[-1] and "curriculum/teacher_acc" not in keys[-1]
    assert {"k", "curriculum/explained_variance", "curriculum/k_next"} <= keys[-1]  # of the public split
