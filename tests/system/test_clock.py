"""The synchronous round in simulated time: the deadline and over-selection worked by hand, partial work's step
budget, and runs: unchanged numbers while the system model is neutral, the clock in the metrics, TensorBoard and
the report, resume, and one-line refusals of bad files and of a deadline no client can meet."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import crash_after, read_rows, refused_config, strip_timing, tiny_overrides

import raysim
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.engine.sampling import draw_clients
from raysim.engine.runner import run_experiment
from raysim.system.clock import samples_in_budget, settle

SYSTEM_KEYS = {"round_sim_s", "sim_time_s", "dropouts", "late", "partial", "surplus"}


def test_samples_in_budget_counts_whole_local_steps_worked_by_hand():
    # 70 samples in batches of 32: an epoch's steps take 32, 32 and 6 samples (only a 1-sample batch would join
    # the one before); 65 samples: 32 and 33
    assert samples_in_budget(70, 32, 2, 140) == 140  # both epochs fit
    assert samples_in_budget(70, 32, 2, 139) == 134  # 70, then 32 + 32; the last 6 would make 140
    assert samples_in_budget(70, 32, 2, 101) == 70  # the second epoch's first step would make 102
    assert samples_in_budget(70, 32, 2, 31) == 0  # not even one step
    assert samples_in_budget(65, 32, 1, 64) == 32
    assert samples_in_budget(70, 32, 2, 10_000) == 140  # never more than the job's own epochs


# five trained clients' full job times; client 1 could do partial work that ends at 9 s (50 samples), client 4 not
FULL = {0: 4.0, 1: 12.0, 2: 7.0, 3: 9.5, 4: 15.0}
PARTIAL = {1: (9.0, 50)}


def test_the_deadline_keeps_the_first_k_to_report_worked_by_hand():
    # deadline 10 s: in time are 0 (4 s), 2 (7 s), 1's partial work (9 s) and 3 (9.5 s); 4 (15 s) is late
    two = settle(FULL, PARTIAL, target=2, deadline_s=10.0, idle_s=60.0)
    assert two.reporters == [0, 2] and two.round_s == 7.0  # the round ends at the second report
    assert two.budgets == {} and two.surplus == [1, 3] and two.late == [4]
    three = settle(FULL, PARTIAL, target=3, deadline_s=10.0, idle_s=60.0)
    assert three.reporters == [0, 1, 2] and three.round_s == 9.0 and three.budgets == {1: 50}
    assert three.surplus == [3] and three.late == [4]
    # K = 5 but only four can report by the deadline: the server waits until the deadline
    five = settle(FULL, PARTIAL, target=5, deadline_s=10.0, idle_s=60.0)
    assert five.reporters == [0, 1, 2, 3] and five.round_s == 10.0 and five.late == [4]
    # late clients dropped (no partial work): 3 reports in time instead of 1
    assert settle(FULL, {}, target=3, deadline_s=10.0, idle_s=60.0).reporters == [0, 2, 3]
    # no deadline: every trained client reports, and the round lasts as long as the slowest (15 s)
    assert settle(FULL, PARTIAL, target=2, deadline_s=None, idle_s=60.0).round_s == 15.0
    assert settle({}, {}, target=2, deadline_s=10.0, idle_s=60.0).round_s == 60.0  # nobody to wait for
    assert settle({5: 3.0, 2: 3.0}, {}, target=1, deadline_s=10.0, idle_s=60.0).reporters == [2]  # a tie: lower id


def test_a_step_budget_stops_the_one_local_loop(tmp_path):
    """A job whose step budget (the clock stage's part, raysim.system.stage) is one epoch's samples, of two local
    epochs, is the one-epoch job bit for bit; a budget in the middle of an epoch stops before the step that would
    pass it; every job reports the samples its steps took."""
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import TrainJob
    from raysim.models import build_model
    from raysim.registry import get_algorithm

    def core(epochs: int) -> tuple[ClientJobs, dict]:
        cfg = load_config(None, tiny_overrides(tmp_path, train__local_epochs=epochs, system__enabled="true"))
        alg = get_algorithm(cfg.algorithm.name)(cfg)
        data = build_federated_data(cfg)
        initial = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0, alg)
        return ClientJobs(cfg, data, algorithm=alg), alg.server_payload(alg.init_server_state(initial.state_dict()), 1)

    two, shared = core(2)
    one, _ = core(1)
    n = two.data.num_train(1)
    budgeted, _ = two.train(TrainJob(1, 1, None, stage={"clock": n}), shared, None, None)
    alone, _ = one.train(TrainJob(1, 1, None), shared, None, None)
    assert budgeted.stage["clock"] == alone.stage["clock"] == n
    assert same_tensors(budgeted.upload, alone.upload)
    mid, _ = two.train(TrainJob(1, 1, None, stage={"clock": n + 40}), shared, None, None)
    assert mid.stage["clock"] == n + 32  # batches of 32: the second would pass n + 40
    full, _ = two.train(TrainJob(1, 1, None), shared, None, None)
    assert full.stage["clock"] == 2 * n


def same_tensors(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    return torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------- runs
def run(tmp_path, name: str, **extra) -> list[dict]:
    return raysim.run(None, *tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **extra),
                      progress=False).metrics.to_dict("records")


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "ditto"])
def test_a_neutral_system_model_changes_no_number(tmp_path, algorithm):
    """Always available, no dropout, no deadline: the same clients train the same way; only the clock's metrics
    are added (and with system off there are none)."""
    extra = dict(algorithm__name=algorithm, clients__num=6, clients__fraction=0.5, rounds=2)
    off = run(tmp_path, "off", **extra)
    on = run(tmp_path, "on", system__enabled="true", **extra)
    assert not SYSTEM_KEYS & set(off[0])
    assert strip_timing([{k: v for k, v in r.items() if k not in SYSTEM_KEYS} for r in on]) == strip_timing(off)
    assert on[1]["sim_time_s"] == pytest.approx(on[0]["round_sim_s"] + on[1]["round_sim_s"])


def traits_csv(tmp_path, speeds: list[float]) -> str:
    path = tmp_path / "devices.csv"
    path.write_text("client_id,speed,down,up,latency\n"
                    + "".join(f"{c},{s},1e6,5e5,0.5\n" for c, s in enumerate(speeds)))
    return str(path)


def test_a_round_with_a_deadline_keeps_the_first_k_and_trains_partial_work(tmp_path):
    """Six clients, K = 3, rho = 0.5: ceil(4.5) = 5 start, three of them slow. Each job: 0.5 s latency, the model's
    bytes at 1 MB/s down and 0.5 MB/s up, 2 epochs of its samples at its speed; a slow client's partial work is the
    whole steps (batches of 32) that fit in what the 4 s deadline leaves after latency and transfers. The round
    keeps the first three reports and ends at the third."""
    speeds = [400.0, 20.0, 15.0, 300.0, 15.0, 18.0]
    extra = dict(clients__num=6, clients__fraction=0.5, rounds=2, train__local_epochs=2, system__enabled="true",
                 system__traits="csv", system__csv=traits_csv(tmp_path, speeds), system__deadline_s=4.0,
                 system__over_selection=0.5, system__late="partial")
    rows = run(tmp_path, "dl", **extra)
    cfg = load_config(None, tiny_overrides(tmp_path, **extra))
    data = build_federated_data(cfg)
    for r in rows:
        started = draw_clients(cfg.seed, r["round"], 6, 5)
        assert r["clients"] == 5
        size = r["bytes_down"] // 5  # FedAvg sends every client the model, and each uploads one as big
        transfers = 0.5 + size / 1e6 + size / 5e5
        reports = []  # (time, client, partial)
        for c in started:
            n = data.num_train(c)
            if transfers + 2 * n / speeds[c] <= 4.0:
                reports.append((transfers + 2 * n / speeds[c], c, False))
            else:
                fit = int((4.0 - transfers) * speeds[c])  # samples that fit before the deadline
                budget = samples_in_budget(n, 32, 2, fit)
                assert budget == 32 * (fit // 32) and budget < n  # these slow clients fit part of an epoch
                reports.append((transfers + budget / speeds[c], c, True))
        reports.sort()
        assert r["round_sim_s"] == pytest.approx(reports[2][0])
        assert r["partial"] == sum(p for _, _, p in reports[:3]) >= 1 and r["surplus"] == 2
        assert r["bytes_up"] == 3 * size  # the first three reports
    assert rows[1]["sim_time_s"] == pytest.approx(rows[0]["round_sim_s"] + rows[1]["round_sim_s"])


def test_dropouts_never_report(tmp_path):
    rows = run(tmp_path, "drop", clients__num=6, system__enabled="true", system__dropout=0.5)
    assert sum(r["dropouts"] for r in rows) > 0
    assert all(r["clients"] + r["dropouts"] == 6 for r in rows)


def test_availability_limits_who_is_sampled_and_the_clock_resumes(tmp_path):
    """On/off availability: each round's clients are among those available at its start; a run stopped after two
    rounds and resumed ends with the uninterrupted run's metrics, simulated clock included."""
    extra = dict(clients__num=12, clients__fraction=0.5, rounds=3, system__enabled="true",
                 system__availability__mode="onoff", system__availability__mean_on_s=2.0,
                 system__availability__mean_off_s=2.0, system__speed__spread=10.0)
    full = run(tmp_path, "full", **extra)
    assert [r["round"] for r in full] == [1, 2, 3] and all(r["clients"] <= 6 for r in full)

    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), **extra))
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(full)


def test_tensorboard_and_the_report_put_accuracy_on_simulated_time(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raysim.report import make_report

    rows = run(tmp_path, "tb", log__tensorboard="true", system__enabled="true", system__speed__spread=10.0)
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    points = [(e.step, e.value) for e in acc.Scalars("sim_time/acc_mean")]
    assert [s for s, _ in points] == [round(r["sim_time_s"]) for r in rows]
    assert [v for _, v in points] == pytest.approx([r["acc_mean"] for r in rows])
    assert "time/round_sim_s" in acc.Tags()["scalars"]
    make_report([tmp_path / "tb"], tmp_path / "out", target=0.0)
    assert (tmp_path / "out" / "acc_vs_sim_h.png").is_file()
    header, line = (tmp_path / "out" / "comm.csv").read_text().splitlines()[:2]
    assert header.endswith("sim_h_to_target_mean,sim_h_to_target_std")
    # target 0: reached at the first round
    assert float(line.split(",")[-2]) == pytest.approx(rows[0]["sim_time_s"] / 3600, rel=1e-5)
    assert "simulated h to target" in (tmp_path / "out" / "report.md").read_text()


# ---------------------------------------------------------------------------------------------------- refusals
def refused_and_nothing_written(tmp_path, key: str, **extra) -> str:
    line = refused_config(key, *tiny_overrides(tmp_path, system__enabled="true", **extra))
    assert not (tmp_path / "run").exists()
    return line


def test_a_negative_speed_is_refused(tmp_path):
    line = refused_and_nothing_written(tmp_path, "system.speed.median", system__speed__median=-3)
    assert "must be a finite number > 0, got -3" in line
    path = traits_csv(tmp_path, [10.0, -1.0, 10.0, 10.0])
    line = refused_and_nothing_written(tmp_path, "system.csv", system__traits="csv", system__csv=path)
    assert "line 3: speed must be > 0, got -1" in line


def test_a_malformed_csv_is_refused(tmp_path):
    path = tmp_path / "devices.csv"
    path.write_text("client_id,speed,down,up,latency\n0,10,1e6,1e6\n")
    line = refused_and_nothing_written(tmp_path, "system.csv", system__traits="csv", system__csv=str(path))
    assert "line 2 has 4 fields, the header 5" in line


def test_a_trace_with_unknown_client_ids_is_refused(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("client_id,start_s,end_s\n0,0,100\n4,0,100\n")  # the tiny run has clients 0-3
    line = refused_and_nothing_written(tmp_path, "system.availability.trace", system__availability__mode="trace",
                                       system__availability__trace=str(path))
    assert "client id 4 is not a client of this federation (ids 0 to 3)" in line


def test_a_deadline_no_client_can_meet_is_refused_naming_the_fastest_client_time(tmp_path):
    # every client: latency 0.5 s and ~0.05 s of transfers before any sample: no job ends within 0.3 s
    path = traits_csv(tmp_path, [100.0, 200.0, 50.0, 400.0])
    line = refused_and_nothing_written(tmp_path, "system.deadline_s", system__traits="csv", system__csv=path,
                                       system__deadline_s=0.3)
    assert "no client can meet a 0.3 s deadline: the fastest possible client time" in line
    assert "(client 3," in line  # the fastest device
    fastest = float(line.split("client time for a round's job is ")[1].split(" s")[0])
    assert 0.5 < fastest < 3.0 and np.isfinite(fastest)
