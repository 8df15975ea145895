"""The system model: hand-worked job durations, traits and availability from (seed, client[, time]) alone, the
files it reads (and the one-line refusals of bad ones), and no storage per client at a million clients."""

from __future__ import annotations

import json
import math
import pickle
import tracemalloc

import numpy as np
import pytest

from raysim.config import ConfigError
from raysim.sections.system import AvailabilityConfig, SystemConfig, TierConfig, TraitConfig, selected_count
from raysim.system.model import DROPOUT, ClientTraits, SystemModel, job_duration, lognormal_sigma, uniforms


def system(**fields) -> SystemConfig:
    cfg = SystemConfig(enabled=True, **fields)
    cfg.validate()
    return cfg


def test_a_jobs_duration_is_latency_plus_transfers_plus_compute_worked_by_hand():
    # latency 0.5 s; 2,000,000 bytes down at 1,000,000 B/s = 2 s; 300 samples x 2 epochs at 150 samples/s = 4 s;
    # 500,000 bytes up at 250,000 B/s = 2 s: 0.5 + 2 + 4 + 2 = 8.5 s
    traits = ClientTraits(speed=150.0, down=1e6, up=2.5e5, latency=0.5)
    assert job_duration(traits, 2_000_000, 500_000, 300 * 2) == 8.5
    # every client the same (spread 1): the model gives the medians, and the same 8.5 s for any client
    model = SystemModel(system(speed=TraitConfig(150.0), down=TraitConfig(1e6), up=TraitConfig(2.5e5),
                               latency=TraitConfig(0.5)), seed=0, num_clients=10)
    assert model.traits(7) == traits
    assert model.duration(7, 2_000_000, 500_000, 600) == 8.5
    # a 10 s deadline leaves 10 - 0.5 - 2 - 2 = 5.5 s to train: 5.5 x 150 = 825 samples
    assert model.samples_within(7, 2_000_000, 500_000, 10.0) == 825
    assert model.samples_within(7, 2_000_000, 500_000, 4.0) == 0  # the transfers alone take 4.5 s


def test_over_selection_starts_ceil_k_times_one_plus_rho():
    assert selected_count(10, 0.3) == 13  # 10 x 1.3 = 13 exactly (no float rounding up to 14)
    assert selected_count(10, 0.25) == 13  # 12.5 -> 13
    assert selected_count(7, 0.0) == 7


def test_lognormal_traits_have_the_median_and_spread_asked_for_and_one_client_equals_many():
    model = SystemModel(system(speed=TraitConfig(100.0, 10.0)), seed=3, num_clients=200_000)
    speeds = model.traits_many(np.arange(200_000))[:, 0]
    assert np.median(speeds) == pytest.approx(100.0, rel=0.02)
    p10, p90 = np.percentile(speeds, [10, 90])
    assert p90 / p10 == pytest.approx(10.0, rel=0.05)
    assert lognormal_sigma(10.0) == pytest.approx(math.log(10) / (2 * 1.2815515655446004))
    for cid in (0, 17, 199_999):  # a client alone, in any batch, in any order: its own numbers
        assert model.traits(cid).speed == speeds[cid]
    assert np.array_equal(model.traits_many(np.array([5, 3, 5]))[:, 0], speeds[[5, 3, 5]])
    other = SystemModel(system(speed=TraitConfig(100.0, 10.0)), seed=4, num_clients=10)
    assert other.traits(0) != model.traits(0)  # another seed, other draws


def test_the_traits_kept_for_recent_clients_are_their_own_and_bounded(monkeypatch):
    from raysim.system import model as system_model

    monkeypatch.setattr(system_model, "TRAITS_KEPT", 3)
    model = SystemModel(system(speed=TraitConfig(100.0, 10.0)), seed=3, num_clients=1_000)
    table = model.traits_many(np.arange(1_000))
    for cid in (7, 7, 8, 9, 10, 7, 11, 999, 7):  # asked again, and after the kept ones were dropped
        assert model.traits(cid) == ClientTraits(*table[cid].tolist())
        assert len(model._traits_seen) <= 3
    assert model.traits(7) is model.traits(7)  # kept: the same object, not drawn again


def test_device_tiers_follow_their_shares():
    tiers = [TierConfig(share=3, speed=10.0, down=1e5, up=1e5, latency=1.0),
             TierConfig(share=1, speed=100.0, down=1e6, up=1e6, latency=0.1)]
    model = SystemModel(system(traits="tiers", tiers=tiers), seed=0, num_clients=40_000)
    speeds = model.traits_many(np.arange(40_000))[:, 0]
    assert set(np.unique(speeds)) == {10.0, 100.0}
    assert np.mean(speeds == 10.0) == pytest.approx(0.75, abs=0.01)
    fast = int(np.flatnonzero(speeds == 100.0)[0])
    assert model.traits(fast) == ClientTraits(100.0, 1e6, 1e6, 0.1)  # the tier's traits together


def test_onoff_availability_is_the_two_state_process_with_its_mean_durations():
    on, off = 600.0, 1800.0  # available a quarter of the time; P(on at t+d | on at t) = 1/4 + 3/4 exp(-d/450)
    model = SystemModel(system(availability=AvailabilityConfig(mode="onoff", mean_on_s=on, mean_off_s=off)),
                        seed=1, num_clients=50_000)
    clients = np.arange(50_000)
    now = model.available_many(clients, 10_000.0)
    assert now.mean() == pytest.approx(0.25, abs=0.01)
    later = model.available_many(clients, 10_000.0 + 450.0)
    assert later[now].mean() == pytest.approx(0.25 + 0.75 * math.exp(-1.0), abs=0.02)
    assert later[~now].mean() == pytest.approx(0.25 * (1 - math.exp(-1.0)), abs=0.02)
    assert model.available_many(clients, 0.0).mean() == pytest.approx(0.25, abs=0.01)  # stationary from the start
    for cid in (0, 9, 49_999):  # one client at a time gives the vectorised answer
        assert model.available(cid, 10_000.0) == now[cid]


def test_diurnal_availability_is_on_for_its_share_of_each_day_at_a_phase_per_client():
    model = SystemModel(system(availability=AvailabilityConfig(mode="diurnal", period_s=86400.0, on_share=0.25)),
                        seed=0, num_clients=20_000)
    clients = np.arange(20_000)
    assert model.available_many(clients, 5_000.0).mean() == pytest.approx(0.25, abs=0.015)
    hours = np.array([model.available(11, h * 3600.0) for h in range(48)])
    assert hours[:24].sum() == 6 and np.array_equal(hours[:24], hours[24:])  # 6 of 24 hours, the same each day


def test_dropout_is_a_bernoulli_per_client_and_round():
    model = SystemModel(system(dropout=0.2), seed=0, num_clients=100)
    draws = [model.dropped(c, r) for c in range(100) for r in range(1, 101)]
    assert np.mean(draws) == pytest.approx(0.2, abs=0.02)
    assert model.dropped(5, 3) == model.dropped(5, 3)
    assert not SystemModel(system(), seed=0, num_clients=3).dropped(0, 1)


def test_one_clients_scalar_draws_are_the_vectorised_ones():
    """uniform, available and dropped (the event queue's one-at-a-time path) give exactly the numbers of uniforms
    and available_many."""
    from raysim.system.model import uniform

    clients = np.arange(500)
    assert [uniform(99, int(c), 4) for c in clients] == uniforms(99, clients, 4).tolist()
    for mode in ("always", "diurnal", "onoff"):
        model = SystemModel(system(availability=AvailabilityConfig(mode=mode), dropout=0.3), seed=1, num_clients=500)
        for t in (0.0, 3_600.5, 90_000.0):
            assert [model.available(int(c), t) for c in clients] == model.available_many(clients, t).tolist(), (mode, t)
        key = model._keys[DROPOUT]
        assert [model.dropped(int(c), 7) for c in clients] == (uniforms(key, clients, 7) < 0.3).tolist()


def test_hash_int_folds_so_a_shared_prefix_is_hashed_once():
    from raysim.system.model import hash_int, uniform

    assert hash_int(hash_int(11, 3, 4), 5) == hash_int(11, 3, 4, 5)
    assert uniform(hash_int(11, 3, 4), 5) == uniform(11, 3, 4, 5) == uniforms(11, 3, 4, np.array([5]))[0]


def test_draw_client_takes_the_first_available_candidate_of_its_hash_stream():
    """Candidate i of a draw is floor(u_i x num) for u_i the JOB_DRAW stream's uniform of (draw, i); the first one
    available and not skipped is the client, on the scalar (always, diurnal) and the vectorised (onoff) paths."""
    from raysim.system.model import DRAW_CANDIDATES, JOB_DRAW, hash_int

    num = 300
    for mode in ("always", "diurnal", "onoff"):
        model = SystemModel(system(availability=AvailabilityConfig(mode=mode)), seed=4, num_clients=num)
        skip = set(range(0, num, 3))
        for seq, attempt, t in ((1, 0, 0.0), (2, 0, 5_000.0), (17, 3, 40_000.0), (99, 1, 86_399.0)):
            prefix = hash_int(model._keys[JOB_DRAW], seq, attempt)
            candidates = (uniforms(prefix, np.arange(DRAW_CANDIDATES)) * num).astype(np.int64)
            ok = model.available_many(candidates, t)
            expected = next(int(c) for c, a in zip(candidates, ok) if a and int(c) not in skip)
            assert model.draw_client((seq, attempt), t, skip) == expected, (mode, seq)
            assert model.draw_client((seq, attempt), t, skip) == expected  # a pure function of its inputs


def test_draw_client_is_uniform_and_scans_the_population_when_candidates_run_out():
    from scipy.stats import chisquare

    model = SystemModel(system(), seed=0, num_clients=50)
    counts = np.bincount([model.draw_client((seq, 0), 0.0, {}) for seq in range(20_000)], minlength=50)
    assert chisquare(counts).pvalue > 1e-3  # 400 a client expected
    big = SystemModel(system(), seed=0, num_clients=200_000)
    skip = set(range(200_000)) - {7, 123_456}  # 512 candidates miss both with probability 0.995
    drawn = {big.draw_client((seq, 0), 0.0, skip) for seq in range(40)}
    assert drawn == {7, 123_456}
    assert big.draw_client((1, 0), 0.0, set(range(200_000))) is None


def test_uniforms_are_a_pure_function_of_their_counters():
    a = uniforms(123, np.arange(1000), 7)
    assert np.all((a > 0) & (a < 1)) and len(np.unique(a)) == 1000
    assert np.array_equal(a[[10, 3]], uniforms(123, np.array([10, 3]), 7))
    assert not np.array_equal(a, uniforms(123, np.arange(1000), 8))


def test_sampling_takes_only_available_clients_uniformly():
    model = SystemModel(system(availability=AvailabilityConfig(mode="onoff", mean_on_s=900, mean_off_s=2700)),
                        seed=2, num_clients=1000)
    picked = model.sample_available(round=4, t=5000.0, count=50)
    assert len(picked) == 50 and picked == sorted(set(picked))
    assert model.available_many(np.array(picked), 5000.0).all()
    assert picked == model.sample_available(round=4, t=5000.0, count=50)  # a pure function of (seed, round, t)
    everyone = np.flatnonzero(model.available_many(np.arange(1000), 5000.0)).tolist()
    assert model.sample_available(round=4, t=5000.0, count=900) == everyone  # fewer available: all of them


def test_a_million_clients_cost_no_memory_per_client():
    """Traits and on/off availability at a million clients: the model object holds a few keys, and a scan of the
    population in chunks peaks at a chunk's arrays, not the population's."""
    cfg = system(speed=TraitConfig(100.0, 10.0), availability=AvailabilityConfig(mode="onoff"))
    tracemalloc.start()
    model = SystemModel(cfg, seed=0, num_clients=1_000_000)
    size = len(pickle.dumps(model))
    assert size < 4096, size
    picked = model.sample_available(round=1, t=7200.0, count=100)
    model.traits(0)  # scipy.special imported before the peak is measured
    samples = np.full(1_000_000, 50.0)
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    best, who = model.fastest(samples, 1000, 1000)  # every client's traits, chunk by chunk
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    assert len(picked) == 100 and 0 <= who < 1_000_000 and best > 0
    assert peak < 12 * 2 ** 20, peak  # a chunk's temporaries (~7 MB); the population's traits alone: 32 MB


# ---------------------------------------------------------------------------------------------------- files
def write(path, text: str):
    path.write_text(text)
    return str(path)


def test_traits_from_a_csv(tmp_path):
    path = write(tmp_path / "dev.csv", "client_id,speed,down,up,latency\n1,50,1e6,5e5,0.2\n0,100,2e6,1e6,0\n")
    model = SystemModel(system(traits="csv", csv=path), seed=0, num_clients=2)
    assert model.traits(0) == ClientTraits(100.0, 2e6, 1e6, 0.0)
    assert model.duration(1, 1e6, 5e5, 100) == 0.2 + 1 + 2 + 1


@pytest.mark.parametrize("text, why", [
    ("client_id,speed,down,up,latency\n0,-5,1e6,1e6,0\n1,5,1e6,1e6,0\n", "line 2: speed must be > 0, got -5"),
    ("client_id,speed,down,up,latency\n0,5,1e6,1e6\n", "line 2 has 4 fields, the header 5"),
    ("id,speed\n0,5\n", "the first row must be the header client_id,speed,down,up,latency"),
    ("client_id,speed,down,up,latency\n0,fast,1e6,1e6,0\n", "line 2: speed must be a number, got 'fast'"),
    ("client_id,speed,down,up,latency\n0,5,1e6,1e6,0\n7,5,1e6,1e6,0\n", "client id 7 is not a client"),
    ("client_id,speed,down,up,latency\n0,5,1e6,1e6,0\n", "lists 1 of the 2 clients (client 1 is missing)"),
    ("client_id,speed,down,up,latency\n0,5,1e6,1e6,0\n0,5,1e6,1e6,0\n", "client 0 is listed twice"),
])
def test_a_bad_traits_csv_is_refused_in_one_line(tmp_path, text, why):
    path = write(tmp_path / "dev.csv", text)
    with pytest.raises(ConfigError, match="config key 'system.csv'") as err:
        SystemModel(system(traits="csv", csv=path), seed=0, num_clients=2)
    assert why in str(err.value) and "\n" not in str(err.value)


def fedscale_trace() -> dict:
    """FedScale's client_behave_trace layout: client 0 on in [10, 20] and [50, 60] of every 100 s; client 2 on in
    [0, 5] of every 30 s (client 1 is not in the trace: never available)."""
    return {0: {"duration": 20, "active": [10, 50], "inactive": [20, 60], "finish_time": 100, "model": "x"},
            2: {"duration": 5, "active": [0], "inactive": [5], "finish_time": 30, "model": "y"}}


def check_trace(model: SystemModel) -> None:
    at = lambda t: model.available_many(np.arange(3), t).tolist()  # noqa: E731
    assert at(15.0) == [True, False, False]
    assert at(3.0) == [False, False, True]
    assert at(157.0) == [True, False, False]  # client 0: 157 mod 100 = 57 in [50, 60]; client 2: 157 mod 30 = 7
    assert at(62.0) == [False, False, True]  # client 2's every 30 s: 62 mod 30 = 2


def test_a_fedscale_trace_as_pickle_or_json(tmp_path):
    pkl = tmp_path / "trace.pkl"
    pkl.write_bytes(pickle.dumps(fedscale_trace()))
    check_trace(SystemModel(system(availability=AvailabilityConfig(mode="trace", trace=str(pkl))), 0, 3))
    js = write(tmp_path / "trace.json", json.dumps(fedscale_trace()))
    check_trace(SystemModel(system(availability=AvailabilityConfig(mode="trace", trace=js)), 0, 3))


def test_the_shipped_test_trace_reads_as_csv(tmp_path):
    from conftest import ROOT

    path = ROOT / "tests" / "system" / "data" / "availability_trace.csv"  # 20 clients, 1-3 stretches a day
    model = SystemModel(system(availability=AvailabilityConfig(mode="trace", trace=str(path), period_s=86400)),
                        seed=0, num_clients=20)
    owners = {int(line.split(",")[0]) for line in path.read_text().splitlines()[1:]}
    assert owners <= set(range(20))
    on = [model.available_many(np.arange(20), h * 3600.0).mean() for h in range(24)]
    assert 0 < min(on) and max(on) < 1  # some clients on, some off, every hour


@pytest.mark.parametrize("name, content, why", [
    ("t.csv", "client_id,start_s,end_s\n0,10,20\n5,0,10\n", "client id 5 is not a client"),
    ("t.json", json.dumps({"9": {"active": [0], "inactive": [5], "finish_time": 30}}), "client id 9 is not a client"),
    ("t.csv", "client_id,start_s,end_s\n0,30,20\n", "an interval needs 0 <= start_s <= end_s"),
    ("t.json", json.dumps({"0": {"active": [0, 1], "inactive": [5], "finish_time": 30}}), "as many active as"),
    ("t.pkl", "not a pickle", "is not a trace"),
])
def test_a_bad_trace_is_refused_in_one_line(tmp_path, name, content, why):
    path = write(tmp_path / name, content)
    with pytest.raises(ConfigError, match="config key 'system.availability.trace'") as err:
        SystemModel(system(availability=AvailabilityConfig(mode="trace", trace=path)), seed=0, num_clients=3)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_a_trace_pickle_may_hold_only_plain_data(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({0: {"active": [0], "inactive": [1], "finish_time": np.float64(2.0)}}))
    with pytest.raises(ConfigError, match="names numpy"):
        SystemModel(system(availability=AvailabilityConfig(mode="trace", trace=str(path))), seed=0, num_clients=3)
