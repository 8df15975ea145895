"""The robust stages (raysim.robust.rule_stage, attack_stage): the rule on the attacked rows by hand on five updates,
the data attacks where clients train, in process runs (resume, partial sums), and one small Ray run (the malicious
set on two workers)."""

from __future__ import annotations

import pytest
import torch

from conftest import crash_after, read_rows, strip_timing, tiny_overrides
from raysim.algorithms.base import ClientUpdate
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.robust.attacks import malicious_clients
from raysim.robust.rule_stage import CENTER_KEY
from raysim.stages import RoundContext, build_stages


def config(tmp_path, **extra):
    return load_config(None, tiny_overrides(tmp_path, **extra), warn=False)


def robust_mean(cfg, updates, state, rnd=1, malicious=None):
    """The round's mean as the robust stages give it: the rule stage's reduction of the rows the attack changed."""
    stages = build_stages(cfg)
    if malicious is not None:
        stages.by_name["attack"].malicious = frozenset(malicious)
    ctx = RoundContext(round=rnd, updates=updates, total=None, clients=[u.client_id for u in updates],
                       server_state=state, shared={}, weighting="samples", sum_group=1, stages=stages)
    return stages.by_name["aggregator"].reduce(ctx)()


def five_updates() -> list[ClientUpdate]:
    # deltas from the global w = 0: 1, 2, 3, 4, 5; an integer entry n (num_batches_tracked's kind) 10 ... 50
    return [ClientUpdate(client_id=c, upload={"w": torch.tensor([float(c + 1)]), "n": torch.tensor(10 * (c + 1))},
                         num_samples=1) for c in range(5)]


GLOBAL = {"w": torch.tensor([0.0]), "n": torch.tensor(0)}


def test_the_step_poisons_the_malicious_update_then_aggregates_by_hand(tmp_path):
    cfg = config(tmp_path, clients__num=5, aggregator__name="median", attack__name="sign_flip")
    attack = build_stages(cfg).by_name["attack"]
    assert attack.malicious == set(malicious_clients(cfg.seed, 5, 0.2)) and len(attack.malicious) == 1
    # client 4's delta 5 becomes -5: 1, 2, 3, 4, -5 -> median 2
    out = robust_mean(cfg, five_updates(), {"model": dict(GLOBAL)}, malicious={4})
    assert out["w"].tolist() == [2.0] and out["w"].dtype == torch.float32
    assert int(out["n"]) == 30  # the integer entry: the plain mean of 10 ... 50
    assert list(out) == ["w", "n"]
    # the mean with that attack: (1 + 2 + 3 + 4 - 5) / 5 = 1
    mean_cfg = config(tmp_path, clients__num=5, attack__name="sign_flip")
    assert robust_mean(mean_cfg, five_updates(), {"model": dict(GLOBAL)}, malicious={4})["w"].tolist() == [1.0]


def test_centered_clipping_keeps_its_centre_in_the_server_state(tmp_path):
    cfg = config(tmp_path, clients__num=5, aggregator__name="centered_clip", aggregator__tau=1.0,
                 aggregator__iterations=1)
    state = {"model": dict(GLOBAL)}
    # τ = 1 from 0: every delta clipped to 1 -> 1
    assert robust_mean(cfg, five_updates(), state, 1)["w"].tolist() == [1.0]
    assert state[CENTER_KEY].tolist() == [1.0]
    # next round from the centre 1: 0, 1, 1, 1, 1 -> 1 + 4/5
    assert robust_mean(cfg, five_updates(), state, 2)["w"].tolist() == pytest.approx([1.8])


def test_too_few_updates_for_f_use_the_largest_f_they_allow(tmp_path, capsys):
    cfg = config(tmp_path, clients__num=5, aggregator__name="trimmed_mean", aggregator__f=2)
    # four updates (one skipped): 2f < 4 allows f = 1: 2, 3 -> 2.5
    assert robust_mean(cfg, five_updates()[:4], {"model": dict(GLOBAL)})["w"].tolist() == [2.5]
    assert capsys.readouterr().err.count("notice") == 1


def test_label_flipping_changes_only_the_malicious_clients_data(tmp_path):
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import TrainJob

    cfg = config(tmp_path, clients__num=5, attack__name="label_flip", attack__fraction=0.4)
    data = build_federated_data(cfg)
    core = ClientJobs(cfg, data)
    malicious = core.stages.by_name["attack"].malicious
    assert malicious == frozenset(malicious_clients(cfg.seed, 5, 0.4)) and len(malicious) == 2
    for cid in range(5):
        started = core.start(TrainJob(client_id=cid, round=1, payload_ref=None), {}, None, None)
        y = data.tensors(cid, "train")[1]
        flipped = started.ctx.train_data[1]
        assert torch.equal(flipped, 9 - y) if cid in malicious else torch.equal(flipped, y)


def test_a_data_attack_keeps_the_sums_and_a_robust_rule_turns_them_off(tmp_path, monkeypatch):
    import raysim.engine.driver as driver

    groups: list[int] = []
    real = driver.plan_round

    def spy(jobs, states, **kwargs):
        groups.append(kwargs["sum_group"])
        return real(jobs, states, **kwargs)

    monkeypatch.setattr(driver, "plan_round", spy)
    run_experiment(config(tmp_path, rounds=1, attack__name="label_flip", log__dir=str(tmp_path / "a")))
    run_experiment(config(tmp_path, rounds=1, aggregator__name="median", log__dir=str(tmp_path / "b")))
    assert groups[0] > 0 and groups[1] == 0


def test_a_resumed_backdoor_run_equals_the_whole_run_and_logs_the_success_rate(tmp_path):
    """Scaling (the backdoor boosted on the driver) against centered clipping, whose centre is server state."""
    extra = dict(rounds=3, clients__num=6, aggregator__name="centered_clip", attack__name="scaling",
                 attack__fraction=0.34, log__tensorboard="true")
    full, _, _ = run_experiment(config(tmp_path, log__dir=str(tmp_path / "full"), **extra))
    rows = read_rows(full)
    assert all(0.0 <= r["attack/asr"] <= 1.0 for r in rows)
    from raysim.runlog import format_round

    assert f"asr {rows[0]['attack/asr']:.4f}" in format_round(rows[0], 3)
    cfg = config(tmp_path, log__dir=str(tmp_path / "part"), **extra)
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(rows)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(full), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("attack/asr")] == pytest.approx([r["attack/asr"] for r in rows])


@pytest.mark.slow
def test_the_same_numbers_on_two_ray_workers(ray_cluster, tmp_path):
    """The malicious set (label flipping where clients train) and the robust rule on two Ray workers give the
    in-process run's metrics."""
    extra = dict(clients__num=6, aggregator__name="trimmed_mean", aggregator__f=1, attack__name="label_flip",
                 attack__fraction=0.34)
    inline = read_rows(run_experiment(config(tmp_path, log__dir=str(tmp_path / "inline"), **extra))[0])
    on_ray = read_rows(run_experiment(config(tmp_path, log__dir=str(tmp_path / "ray"), engine__backend="ray",
                                             engine__num_workers=2, **extra))[0])
    assert strip_timing(on_ray) == strip_timing(inline)
