"""The server as deployed (issue 55): a round that waits for its report timeout, rounds abandoned for too few
reports, clients that leave mid-job, compute from the model's FLOPs and FedScale's device-capacity trace, worked by
hand; the same numbers in process, on two Ray workers and after a resume; one-line refusals, and no hang where no
client can ever report."""

from __future__ import annotations

import json
import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch
from conftest import crash_after, read_rows, refused_config, strip_timing, tiny_overrides

import raysim
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.engine.runner import run_experiment
from raysim.engine.state import read_checkpoint
from raysim.errors import UserError
from raysim.system.clock import settle
from raysim.sections.system import AvailabilityConfig, SystemConfig, TraitConfig
from raysim.system.model import SystemModel
from raysim.system.presence import DROPPED, LATE, LEFT, job_fate, stays_available

FULL = {0: 4.0, 1: 12.0, 2: 7.0, 3: 9.5, 4: 15.0}  # five trained clients' job times, seconds


# ---------------------------------------------------------------------------------------------- the timeout by hand
def test_a_round_waits_for_its_report_timeout_worked_by_hand():
    # one started client dropped out: all five trained clients report by 15 s, but the server cannot know that the
    # sixth never will and waits until the 20 s timeout; the oracle (no timeout) ends at the slowest report, 15 s
    waits = settle(FULL, {}, target=6, deadline_s=None, idle_s=60.0, timeout_s=20.0, missing=1)
    assert waits.round_s == 20.0 and waits.reporters == [0, 1, 2, 3, 4] and waits.late == []
    assert settle(FULL, {}, target=6, deadline_s=None, idle_s=60.0, missing=1).round_s == 15.0
    # nobody missing: the round ends at its last report, as before
    assert settle(FULL, {}, target=5, deadline_s=None, idle_s=60.0, timeout_s=20.0).round_s == 15.0
    # a 10 s timeout cuts off clients 1 (12 s) and 4 (15 s): the round lasts 10 s with three reports
    cut = settle(FULL, {}, target=5, deadline_s=None, idle_s=60.0, timeout_s=10.0)
    assert cut.round_s == 10.0 and cut.reporters == [0, 2, 3] and cut.late == [1, 4]
    # every started client dropped out: the timeout; no client started at all: the idle wait
    assert settle({}, {}, target=2, deadline_s=None, idle_s=60.0, timeout_s=20.0, missing=2).round_s == 20.0
    assert settle({}, {}, target=2, deadline_s=None, idle_s=60.0, timeout_s=20.0).round_s == 60.0


def test_a_round_with_too_few_reports_is_abandoned_worked_by_hand():
    # the 10 s timeout leaves three reports: a round that needs four is abandoned, one that needs three is not
    assert settle(FULL, {}, target=5, deadline_s=None, idle_s=60.0, timeout_s=10.0, needed=4).abandoned
    assert not settle(FULL, {}, target=5, deadline_s=None, idle_s=60.0, timeout_s=10.0, needed=3).abandoned
    # with a 10 s deadline and K = 3: clients 0, 2, 3 report by 9.5 s; needing all five abandons it at the deadline
    late = settle(FULL, {}, target=5, deadline_s=10.0, idle_s=60.0, needed=5)
    assert late.abandoned and late.round_s == 10.0


# ---------------------------------------------------------------------------------------------- runs
def traits_csv(tmp_path, speeds: list[float], name: str = "devices.csv") -> str:
    """Every client 0.5 s latency, 1 MB/s down, 0.5 MB/s up; its speed from ``speeds``."""
    path = tmp_path / name
    path.write_text("client_id,speed,down,up,latency\n"
                    + "".join(f"{c},{s},1e6,5e5,0.5\n" for c, s in enumerate(speeds)))
    return str(path)


def rows_of(tmp_path, name: str, **extra) -> list[dict]:
    return raysim.run(None, *tiny_overrides(tmp_path, log__dir=str(tmp_path / name), log__tensorboard="false",
                                            **extra), progress=False).metrics.to_dict("records")


SPEEDS = [400.0, 200.0, 100.0, 300.0]
# seed 1: the rounds' dropouts (SystemModel.dropped) are 0, 1, 2 and 1 of the four clients
DROPPING = dict(seed=1, clients__num=4, rounds=4, system__enabled="true", system__traits="csv", system__dropout=0.3)


def job_seconds(n: int, size: int, speed: float) -> float:
    """0.5 s latency + the model down at 1 MB/s and up at 0.5 MB/s + one epoch of n samples at ``speed``."""
    return 0.5 + size / 1e6 + n / speed + size / 5e5


def test_a_round_with_a_dropped_client_lasts_its_report_timeout(tmp_path):
    """Four clients, each dropping out of a round with probability 0.3 (the model's draw); with a 30 s timeout a
    round with a dropout lasts 30 s, one without lasts as long as its slowest job, and the oracle's rounds always
    last as long as their slowest job."""
    csv = traits_csv(tmp_path, SPEEDS)
    honest = rows_of(tmp_path, "honest", **DROPPING, system__csv=csv, system__report_timeout_s=30)
    oracle = rows_of(tmp_path, "oracle", **DROPPING, system__csv=csv)
    cfg = load_config(None, tiny_overrides(tmp_path, **DROPPING, system__csv=csv))
    data, model = build_federated_data(cfg), SystemModel(cfg.system, cfg.seed, 4)
    seen = set()
    for h, o in zip(honest, oracle):
        dropped = [c for c in range(4) if model.dropped(c, h["round"])]
        size = h["bytes_down"] // h["clients"]  # FedAvg sends each client the model and each uploads one as big
        slowest = max(job_seconds(data.num_train(c), size, SPEEDS[c]) for c in range(4) if c not in dropped)
        assert h["dropouts"] == o["dropouts"] == len(dropped)
        assert o["round_sim_s"] == pytest.approx(slowest)
        assert h["round_sim_s"] == (30.0 if dropped else pytest.approx(slowest))
        seen.add(len(dropped))
    assert 1 in seen and 0 in seen  # a round with one dropped client, and one without


def test_an_abandoned_round_keeps_the_server_state_and_counts_as_a_round(tmp_path):
    """SCAFFOLD (server model and control variate), a round needing all four reports: a round with a dropout is
    abandoned at the 30 s timeout, logs abandoned: 1, applies no upload, and leaves the server state bit for bit as
    the round before left it; the run still has its four rounds."""
    extra = dict(DROPPING, algorithm__name="scaffold", system__csv=traits_csv(tmp_path, SPEEDS),
                 system__report_timeout_s=30, system__min_reports=4)
    rows = rows_of(tmp_path, "all", **extra)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert all(r["abandoned"] == int(r["dropouts"] > 0) for r in rows)
    gone = [r["round"] for r in rows if r["abandoned"]]
    assert gone and gone[0] > 1, "the seed must give an abandoned round after the first"
    k = gone[0]
    assert rows[k - 1]["round_sim_s"] == 30.0 and rows[k - 1]["bytes_up"] == 0
    before = rows_of(tmp_path, "before", **{**extra, "rounds": k - 1})
    after = rows_of(tmp_path, "after", **{**extra, "rounds": k})
    assert same_rows(after, rows[:k]) and same_rows(before, rows[:k - 1])
    old, new = (read_checkpoint(tmp_path / name)["server_state"] for name in ("before", "after"))
    assert same_tree(old, new)
    assert rows[k - 1]["acc_global"] == rows[k - 2]["acc_global"]  # the same model, evaluated again


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Equal metrics but wall-clock times; an abandoned round's loss, NaN in the run's rows and null in
    metrics.jsonl, is equal to itself here."""
    def plain(rows: list[dict]) -> str:
        return json.dumps([{k: None if isinstance(v, float) and v != v else v for k, v in r.items()}
                           for r in strip_timing(rows)], sort_keys=True)

    return plain(a) == plain(b)


def same_tree(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tree(a[k], b[k]) for k in a)
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


# ---------------------------------------------------------------------------------------------- leaving mid-job
def trace_model(tmp_path, rows: str, num: int = 3, period: float = 100.0, whole_job: bool = True) -> SystemModel:
    path = tmp_path / "trace.csv"
    path.write_text("client_id,start_s,end_s\n" + rows)
    cfg = SystemConfig(enabled=True, availability=AvailabilityConfig(mode="trace", trace=str(path), period_s=period,
                                                                     whole_job=whole_job))
    cfg.validate()
    return SystemModel(cfg, seed=0, num_clients=num)


def test_a_client_leaves_when_its_availability_ends_before_its_upload_worked_by_hand(tmp_path):
    # client 0: on in [0, 10] of every 100 s; client 1: [0, 10] and [10, 20] (touching: one stretch to 20);
    # client 2: [90, 100] and [0, 5] (a stretch over the period's end, from 90 to 105)
    model = trace_model(tmp_path, "0,0,10\n1,0,10\n1,10,20\n2,90,100\n2,0,5\n")
    ids = np.arange(3)
    assert stays_available(model, ids, 2.0, 10.0).tolist() == [True, True, False]  # 2 is off at 2 s
    assert stays_available(model, ids, 2.0, 10.5).tolist() == [False, True, False]  # 0 left at 10 s
    assert stays_available(model, ids, 2.0, 20.0).tolist() == [False, True, False]
    assert stays_available(model, ids, 2.0, 20.5).tolist() == [False, False, False]
    assert stays_available(model, ids, 195.0, 205.0).tolist() == [False, False, True]  # 195 mod 100 = 95, to 105
    assert stays_available(model, ids, 195.0, 205.5).tolist() == [False, False, False]
    # an asynchronous job of client 0 started at 2 s: 8 s reports; 9 s leaves (freed at its finish, or at a 12 s
    # timeout); a 13 s job that client 1 (on to 20) stays for passes a 12 s timeout: cut off at 2 + 12 = 14 s
    assert job_fate(model, 0, 1, 2.0, 8.0, None) == (10.0, 0)
    assert job_fate(model, 0, 1, 2.0, 9.0, None) == (11.0, LEFT)
    assert job_fate(model, 0, 1, 2.0, 9.0, 12.0) == (14.0, LEFT)
    assert job_fate(model, 1, 1, 2.0, 13.0, 12.0) == (14.0, LATE)
    assert job_fate(model, 1, 1, 2.0, 8.0, 12.0) == (10.0, 0)
    assert DROPPED not in (LEFT, LATE, 0)


@pytest.mark.parametrize("mode", ["onoff", "diurnal"])
def test_staying_available_agrees_with_availability_at_every_instant(mode):
    """Over many spans: a client that stays is available at every instant of a fine grid of the span; one that does
    not is unavailable at some instant of it (off stretches are long next to the grid's step)."""
    av = AvailabilityConfig(mode=mode, mean_on_s=50.0, mean_off_s=50.0, period_s=200.0, on_share=0.5,
                            whole_job=True)
    model = SystemModel(SystemConfig(enabled=True, availability=av), seed=3, num_clients=40)
    ids = np.arange(40)
    stayed = left = 0
    for t0, length in [(0.0, 30.0), (123.4, 60.0), (1000.0, 5.0), (777.7, 120.0)]:
        stays = stays_available(model, ids, t0, t0 + length)
        grid = np.linspace(t0, t0 + length, 601)
        on = np.array([model.available_many(ids, t) for t in grid])
        assert np.array_equal(stays, on.all(axis=0))
        stayed, left = stayed + int(stays.sum()), left + int((on[0] & ~stays).sum())
    assert stayed > 10 and left > 10


def test_a_client_that_leaves_mid_job_never_reports_and_counts_as_a_dropout(tmp_path):
    """Client 1 is available for the first second of the day only; its round-1 job takes longer, so it leaves
    mid-job: it does not report (three uploads), counts as dropouts_left, and (no timeout) the oracle round lasts
    as long as the slowest of the others; at round 2 it is no longer available and is not sampled."""
    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,start_s,end_s\n0,0,86400\n1,0,1\n2,0,86400\n3,0,86400\n")
    extra = dict(clients__num=4, rounds=2, system__enabled="true", system__traits="csv",
                 system__csv=traits_csv(tmp_path, SPEEDS), system__availability__mode="trace",
                 system__availability__trace=str(trace), system__availability__whole_job="true")
    rows = rows_of(tmp_path, "leave", **extra)
    data = build_federated_data(load_config(None, tiny_overrides(tmp_path, **extra)))
    first, second = rows
    size = first["bytes_down"] // 4
    assert job_seconds(data.num_train(1), size, SPEEDS[1]) > 1.0  # longer than client 1's availability
    assert first["clients"] == 4 and first["dropouts"] == first["dropouts_left"] == 1
    assert first["bytes_up"] == 3 * size
    assert first["round_sim_s"] == pytest.approx(max(job_seconds(data.num_train(c), size, SPEEDS[c])
                                                     for c in (0, 2, 3)))
    assert second["clients"] == 3 and second["dropouts_left"] == 0 and second["bytes_up"] == 3 * size
    # with a report timeout, the server waits for client 1 until it
    timed = rows_of(tmp_path, "timed", **extra, system__report_timeout_s=40)
    assert timed[0]["round_sim_s"] == 40.0 and timed[0]["dropouts_left"] == 1


# ---------------------------------------------------------------------------------------------- FLOPs
def test_a_jobs_compute_time_from_the_models_flops_worked_by_hand(tmp_path):
    """The tiny MLP 64 -> 32 -> 16, head 16 -> 10: forward 2 x (64x32 + 32x16 + 16x10) = 2 x 2720 = 5440 FLOPs a
    sample; backward, the weights' gradients as much again, and the inputs' gradients of all but the first layer
    2 x (32x16 + 16x10) = 1344: 12,224 FLOPs a trained sample. At 1,222,400 FLOP/s a client trains 100 samples a
    second: its job is 0.5 s + 1 MB at 1 MB/s + 300 samples x 2 epochs / 100 + 0.5 MB at 0.5 MB/s = 8.5 s."""
    from raysim.registry import get_algorithm
    from raysim.system.flops import training_flops_per_sample

    cfg = load_config(None, tiny_overrides(tmp_path))
    data = build_federated_data(cfg)
    assert training_flops_per_sample(cfg, data, get_algorithm("fedavg")(cfg), 0) == 12224.0
    system = SystemConfig(enabled=True, speed_unit="flops", speed=TraitConfig(1222400.0), down=TraitConfig(1e6),
                          up=TraitConfig(5e5), latency=TraitConfig(0.5))
    system.validate()
    model = SystemModel(system, seed=0, num_clients=4)
    model.sample_cost = 12224.0
    assert model.duration(2, 1_000_000, 500_000, 600) == pytest.approx(8.5)
    assert model.samples_within(2, 1_000_000, 500_000, 8.5) == 600  # (8.5 - 0.5 - 1 - 1) s x 100 samples/s
    # a run: every round's time is its slowest job at FLOP/s speeds of [4, 2, 1, 3] x 1,222,400
    csv = traits_csv(tmp_path, [s * 12224.0 for s in SPEEDS], "flops.csv")
    rows = rows_of(tmp_path, "flops", clients__num=4, rounds=2, system__enabled="true", system__traits="csv",
                   system__csv=csv, system__speed_unit="flops")
    for r in rows:
        size = r["bytes_down"] // 4
        assert r["round_sim_s"] == pytest.approx(max(job_seconds(data.num_train(c), size, SPEEDS[c])
                                                     for c in range(4)))


# ---------------------------------------------------------------------------------------------- FedScale's capacity
def capacity(num: int) -> dict:
    """FedScale's client_device_capacity layout; client c: 10 (c + 1) ms per sample of inference, 800 kbit/s."""
    return {c: {"computation": 10.0 * (c + 1), "communication": 800.0} for c in range(num)}


def test_fedscales_capacity_trace_gives_the_traits_worked_by_hand(tmp_path):
    # client 0: a trained sample costs 3 x 10 ms = 30 ms: 1000 / 30 samples/s; 800 kbit/s = 800 x 1024 / 8 =
    # 102,400 B/s each way; FedScale has no latency. Client 2: 3 x 30 ms: 1000 / 90 samples/s. Clients past the
    # federation (FedScale's trace holds ~500,000 devices) are not read.
    for name, write in (("cap.pkl", lambda p: p.write_bytes(pickle.dumps(capacity(5)))),
                        ("cap.json", lambda p: p.write_text(json.dumps(capacity(5))))):
        path = tmp_path / name
        write(path)
        system = SystemConfig(enabled=True, traits="fedscale", capacity=str(path))
        system.validate()
        model = SystemModel(system, seed=0, num_clients=3)
        t0, t2 = model.traits(0), model.traits(2)
        assert (t0.speed, t0.down, t0.up, t0.latency) == pytest.approx((1000 / 30, 102400.0, 102400.0, 0.0))
        assert t2.speed == pytest.approx(1000 / 90)


class Payload:
    """Pickled, a call of os.system that would create ``path`` when unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("content, why", [
    (lambda _: {0: {"computation": 5.0, "communication": 10.0}}, "names 1 of the 2 clients (client 1 is missing)"),
    (lambda pwned: {0: {"computation": 5.0, "communication": 10.0}, 1: Payload(pwned)}, "it names posix.system"),
    (lambda _: {0: {"computation": np.float64(5.0), "communication": 10.0}}, "it names numpy"),
    (lambda _: OrderedDict({0: {"computation": 5.0, "communication": 10.0}}), "it names collections.OrderedDict"),
    (lambda _: {0: {"computation": 0.0, "communication": 10.0}, 1: {}}, "a finite number > 0"),
    (None, "is not a capacity trace"),
])
def test_a_bad_capacity_trace_is_refused_in_one_line_without_running_it(tmp_path, content, why):
    path, pwned = tmp_path / "cap.pkl", tmp_path / "pwned"
    path.write_bytes(pickle.dumps(content(pwned)) if content is not None else b"not a pickle")
    line = refused_config("system.capacity", *tiny_overrides(tmp_path, clients__num=2, system__enabled="true",
                                                             system__traits="fedscale", system__capacity=str(path)))
    assert why in line and not pwned.exists() and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- determinism
HONEST = dict(clients__num=8, clients__fraction=0.5, rounds=4, system__enabled="true", system__dropout=0.2,
              system__speed__median=50, system__speed__spread=10, system__latency__median=0.5,
              system__availability__mode="onoff", system__availability__mean_on_s=8,
              system__availability__mean_off_s=4, system__availability__whole_job="true",
              system__report_timeout_s=12, system__min_reports=3)
HONEST_ASYNC = {**{k: v for k, v in HONEST.items() if k != "system__min_reports"}, "asynchronous__mode": "fedbuff",
                "asynchronous__concurrency": 4, "asynchronous__buffer_size": 2, "system__report_timeout_s": 6}


@pytest.mark.parametrize("extra", [HONEST, HONEST_ASYNC], ids=["sync", "fedbuff"])
def test_departures_and_abandoned_rounds_resume_to_the_same_numbers(tmp_path, extra):
    rows = rows_of(tmp_path, "full", **extra)
    assert sum(r["dropouts_left"] for r in rows) > 0  # some clients left mid-job
    if "system__min_reports" in extra:
        assert 0 < sum(r["abandoned"] for r in rows) < len(rows)
    else:
        assert sum(r["late"] for r in rows) > 0
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), **extra))
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)
    assert same_rows(read_rows(tmp_path / "part"), rows)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [HONEST, HONEST_ASYNC], ids=["sync", "fedbuff"])
def test_departures_and_abandoned_rounds_are_the_same_on_two_ray_workers(ray_cluster, tmp_path, extra):
    inline = rows_of(tmp_path, "one", **extra)
    on_ray = rows_of(tmp_path, "two", **extra, engine__backend="ray", engine__num_workers=2)
    assert same_rows(on_ray, inline)


# ---------------------------------------------------------------------------------------------- refusals, no hang
@pytest.mark.parametrize("key, extra, why", [
    ("system.report_timeout_s", dict(system__report_timeout_s=0), "must be a number of seconds > 0"),
    ("system.report_timeout_s", dict(system__report_timeout_s=10, system__deadline_s=10), "set one of the two"),
    ("system.min_reports", dict(system__min_reports=5), "5 is above the round's cohort of 4 clients"),
    ("system.min_reports", dict(system__min_reports=1.5), "a share in (0, 1]"),
    ("system.min_reports", dict(system__min_reports=2, asynchronous__mode="fedasync"), "no rounds to abandon"),
    ("system.speed.median", dict(system__speed_unit="flops", system__speed__median=-1), "FLOP/s > 0, got -1"),
    ("system.speed_unit", dict(system__speed_unit="ops"), "must be one of samples, flops"),
    ("system.capacity", dict(system__traits="fedscale"), "needs FedScale's device capacity file"),
])
def test_bad_values_are_refused_in_one_line(tmp_path, key, extra, why):
    line = refused_config(key, *tiny_overrides(tmp_path, system__enabled="true", **extra))
    assert why in line and not (tmp_path / "run").exists()


@pytest.mark.parametrize("key, extra, why", [
    ("system.report_timeout_s", dict(system__report_timeout_s=0.2), "no client can meet a 0.2 s report timeout"),
    ("system.report_timeout_s", dict(system__report_timeout_s=0.2, asynchronous__mode="fedasync"),
     "no client can meet a 0.2 s report timeout"),
    ("system.availability.whole_job", dict(system__availability__mode="diurnal", system__availability__period_s=2,
                                           system__availability__whole_job="true"),
     "the longest any client is available without a break is 1 s"),
    ("system.availability.whole_job", dict(system__availability__mode="onoff", system__availability__mean_on_s=0.05,
                                           system__availability__mean_off_s=0.05, asynchronous__mode="fedasync",
                                           system__availability__whole_job="true"), "< 1e-06"),
])
def test_a_run_in_which_no_client_can_ever_report_is_one_line_not_a_hang(tmp_path, key, extra, why):
    # every tiny job takes over a second (0.05 s latency, the model's bytes, 360 samples at 100 a second)
    line = refused_config(key, *tiny_overrides(tmp_path, system__enabled="true", **extra))
    assert why in line and not (tmp_path / "run").exists()


def test_asynchronous_jobs_that_all_fail_stop_the_run_in_one_line(tmp_path, monkeypatch):
    """On/off stretches of 0.4 s on average against jobs of over a second: a job outlasts its client with a chance
    of about exp(-9), above the 1e-6 refused before round 1, so the run starts; its jobs then fail one after
    another, and after MAX_SILENT of them in a row (20 here, 10,000 in a run) it stops in one line."""
    from raysim.engine import asynchronous

    monkeypatch.setattr(asynchronous, "MAX_SILENT", 20)
    with pytest.raises(UserError, match="no job reported in 20 jobs in a row"):
        rows_of(tmp_path, "silent", system__enabled="true", asynchronous__mode="fedasync",
                system__availability__mode="onoff", system__availability__mean_on_s=0.4,
                system__availability__mean_off_s=0.4, system__availability__whole_job="true")


def test_flops_are_counted_once_a_process_and_leave_the_random_state_alone(tmp_path):
    from raysim.registry import get_algorithm
    from raysim.system import flops

    cfg = load_config(None, tiny_overrides(tmp_path, model__hidden="[48]"))
    data = build_federated_data(cfg)
    state = torch.random.get_rng_state()
    first = flops.training_flops_per_sample(cfg, data, get_algorithm("fedavg")(cfg), 0)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert len([k for k in flops._MEASURED if k[0] == repr(cfg.model)]) == 1
    assert flops.training_flops_per_sample(cfg, data, get_algorithm("fedavg")(cfg), 1) == first


def test_without_the_new_keys_nothing_changes_their_metrics_are_absent(tmp_path):
    rows = rows_of(tmp_path, "plain", **{k: v for k, v in DROPPING.items()}, system__csv=traits_csv(tmp_path, SPEEDS))
    assert not {"abandoned", "dropouts_left"} & set(rows[0])
    with pytest.raises(UserError, match="system.min_reports"):
        load_config(None, tiny_overrides(tmp_path, system__enabled="true", system__min_reports=0))
