"""The asynchronous modes: FedAsync's and FedBuff's server updates and staleness functions by hand, runs whose
numbers are the config's and the seed's alone (resumed in process, after a SIGKILL, on one and two Ray workers with
one killed), and the algorithms they refuse (the event queue: test_events.py)."""

from __future__ import annotations

import hashlib
import math
import shutil

import pytest
import torch
from conftest import (kill_group_once, killed_worker_matches_inline, launch_cli, read_rows, refused_config,
                      strip_timing, tiny_overrides)

from raysim.cli import main
from raysim.config import load_config
from raysim.engine.asynchronous import buffer_weight, buffered_target, mix, staleness_weight
from raysim.engine.events import EventQueue
from raysim.engine.runner import run_experiment
from raysim.engine.state import checkpoint_dir, content_digest, read_checkpoint, version_file
from raysim.errors import UserError

ASYNC = dict(asynchronous__mode="fedbuff", asynchronous__buffer_size=2, asynchronous__concurrency=3,
             clients__num=6, train__local_epochs=2, data__partition="dirichlet")


# ---------------------------------------------------------------------------------------------- the math by hand
def test_staleness_functions_by_hand():
    assert staleness_weight("constant", 7, 0.5, 4) == 1.0
    # polynomial, a = 0.5: (t − τ + 1)^−a; staleness 3: 4^−0.5 = 0.5; staleness 0: 1
    assert staleness_weight("polynomial", 3, 0.5, 4) == 0.5 and staleness_weight("polynomial", 0, 0.5, 4) == 1.0
    # hinge, a = 10, b = 4: 1 up to staleness 4; staleness 6: 1/(10·(6 − 4) + 1) = 1/21
    assert staleness_weight("hinge", 4, 10, 4) == 1.0
    assert staleness_weight("hinge", 6, 10, 4) == pytest.approx(1 / 21, abs=1e-15)
    # FedBuff: 1/√(1 + staleness): staleness 3 gives 1/2; off: 1
    assert buffer_weight(3, True) == 0.5 and buffer_weight(3, False) == 1.0


def test_fedasync_mix_by_hand():
    # x = (0, 4), x_new = (2, 0), α_t = 0.25: (1 − 0.25)·x + 0.25·x_new = (0.5, 3); an integer buffer is rounded:
    # 2·0.5 + 5·0.5 = 3.5 -> 4 (round half to even)
    x = {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor(2)}
    new = {"w": torch.tensor([2.0, 0.0]), "n": torch.tensor(5)}
    out = mix(x, new, 0.25)
    assert out["w"].tolist() == [0.5, 3.0] and out["w"].dtype == torch.float32
    assert mix(x, new, 0.5)["n"].item() == 4 and out["n"].dtype == torch.int64


def test_fedbuff_step_by_hand():
    # x = (1, 1). Arrival 1: y = (3, 1) from x_τ = (1, 1), staleness 0 (w = 1): Δ = (2, 0).
    #            Arrival 2: y = (0, 2) from x_τ = (0, 0), staleness 3 (w = 1/2): Δ = (0, 2).
    # K = 2, η_g = 1: x + (1/2)·(1·(2, 0) + ½·(0, 2)) = (1, 1) + (1, 0.5) = (2, 1.5); η_g = 0.5: (1.5, 1.25)
    x = {"w": torch.tensor([1.0, 1.0])}
    buffered = [({"w": torch.tensor([3.0, 1.0])}, {"w": torch.tensor([1.0, 1.0])}, buffer_weight(0, True)),
                ({"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([0.0, 0.0])}, buffer_weight(3, True))]
    assert buffered_target(x, buffered, 1.0, 2)["w"].tolist() == [2.0, 1.5]
    assert buffered_target(x, buffered, 0.5, 2)["w"].tolist() == [1.5, 1.25]
    # fresh updates and η_g = 1 from one model: the mean of the clients' models (FedAvg's, uniformly)
    fresh = [({"w": torch.tensor([3.0, 1.0])}, x, 1.0), ({"w": torch.tensor([1.0, 5.0])}, x, 1.0)]
    assert buffered_target(x, fresh, 1.0, 2)["w"].tolist() == [2.0, 3.0]



def test_fedbuff_step_is_the_same_whether_updates_share_their_start_model_or_not():
    # buffered_target flattens each start model once (by identity): one shared start and equal copies must agree
    x = {"w": torch.tensor([1.0, -2.0, 0.5]), "n": torch.tensor(3)}
    start = {"w": torch.tensor([0.5, -1.0, 0.0]), "n": torch.tensor(1)}
    ups = [{"w": torch.tensor([1.5, 0.0, 2.0]), "n": torch.tensor(4)},
           {"w": torch.tensor([-1.0, 3.0, 1.0]), "n": torch.tensor(2)},
           {"w": torch.tensor([0.25, -0.5, 0.75]), "n": torch.tensor(5)}]
    weights = [buffer_weight(s, True) for s in (0, 2, 5)]
    shared = buffered_target(x, [(u, start, w) for u, w in zip(ups, weights)], 0.7, 3)
    copies = buffered_target(x, [(u, {k: v.clone() for k, v in start.items()}, w) for u, w in zip(ups, weights)],
                             0.7, 3)
    for key in x:
        assert torch.equal(shared[key], copies[key]), key
    # by hand: x + 0.7 / 3 · Σ w_i (y_i − start) on w
    expected = [x["w"][j].item() + 0.7 / 3 * sum(w * (u["w"][j].item() - start["w"][j].item())
                                                 for u, w in zip(ups, weights)) for j in range(3)]
    assert shared["w"].tolist() == pytest.approx(expected, abs=1e-6)

def test_fedbuff_step_is_its_float64_formula_bit_for_bit():
    # each term (y_i − x_τ)·w_i rounded in float64 (a weight of 1 multiplies by nothing), summed in arrival order,
    # its mean times η_g·Σw/K added to x in float64, cast back (integers rounded): a plain reference, bit for bit
    from raysim.algorithms.aggregation import layout_and_leaves, unflatten_leaves

    g = torch.Generator().manual_seed(3)
    shapes = {"body.w": (7, 5), "body.b": (7,), "n": ()}
    def model(offset: int) -> dict:
        return {k: torch.randn(s, generator=g) if k != "n" else torch.tensor(offset) for k, s in shapes.items()}
    x, starts = model(4), [model(1), model(2)]
    ups = [{k: v + 0.01 * torch.randn(v.shape, generator=g) if k != "n" else v + i for k, v in starts[i % 2].items()}
           for i in range(5)]
    weights = [buffer_weight(s, True) for s in (0, 1, 0, 3, 8)]  # w = 1 (fresh) among the stale ones
    got = buffered_target(x, [(u, starts[i % 2], w) for i, (u, w) in enumerate(zip(ups, weights))], 0.8, 5)
    layout, xs = layout_and_leaves(x)
    total = None
    for i, (u, w) in enumerate(zip(ups, weights)):
        terms = [(a.double().reshape(-1) - b.double().reshape(-1)) * w
                 for a, b in zip(layout_and_leaves(u)[1], layout_and_leaves(starts[i % 2])[1])]
        total = terms if total is None else [t + d for t, d in zip(total, terms)]
    scale = 0.8 * sum(weights) / 5
    want = unflatten_leaves(layout, [a.double().reshape(-1) + (t / sum(weights)) * scale for a, t in zip(xs, total)])
    for key in x:
        assert torch.equal(got[key], want[key]) and got[key].dtype == x[key].dtype, key


# ---------------------------------------------------------------------------------------------- runs
def _run(tmp_path, name, **extra):
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), log__tensorboard="false",
                                           **{**ASYNC, **extra}))
    return run_experiment(cfg)[1]


def test_fedbuff_run_steps_every_k_arrivals_in_time_order_and_resumes(tmp_path):
    rows = _run(tmp_path, "full", rounds=5)
    assert [r["clients"] for r in rows] == [2] * 5  # K = 2 arrivals a step
    times = [r["sim_time_s"] for r in rows]
    assert times == sorted(times) and times[0] > 0
    assert [r["round_sim_s"] for r in rows] == pytest.approx([times[0]] + [b - a for a, b in zip(times, times[1:])])
    assert rows[0]["staleness_max"] == 0 and max(r["staleness_max"] for r in rows) >= 1  # 3 in flight, 2 a step
    assert all(r["staleness_mean"] <= r["staleness_max"] for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    # the checkpoint holds the queue: 3 jobs in flight, and the payload of every version they downloaded
    record = read_checkpoint(tmp_path / "full")["asynchronous"]
    flights = EventQueue.from_record(record["queue"]).flights()
    assert len(flights) == 3 and {f.version for f in flights} == set(record["versions"]) | {record["derived"]}
    # the newest version (the last step's model) is the checkpointed server state's payload: no file of its own
    assert record["derived"] == 5 and not version_file(checkpoint_dir(tmp_path / "full"), 5).exists()
    # 3 rounds, then --resume to 5: the same numbers as the run that was never stopped
    first = _run(tmp_path, "part", rounds=3)
    assert strip_timing(first) == strip_timing(rows[:3])
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), log__tensorboard="false",
                                           **{**ASYNC, "rounds": 5}))
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(rows)


def test_each_version_is_a_file_written_once_and_a_damaged_one_refuses_to_resume(tmp_path):
    """server.pt names the file and sha256 of every version a job in flight holds; a step writes only the new
    version (older files keep their bytes and times), the files of versions no job holds are gone, a stray file is
    removed on resume, and a damaged version file stops ``--resume`` with one line."""
    _run(tmp_path, "v", rounds=3)
    ckpt = tmp_path / "v" / "checkpoint"
    record = read_checkpoint(tmp_path / "v")["asynchronous"]
    names = {name for name, _ in record["versions"].values()}
    assert {f.name for f in (ckpt / "versions").iterdir()} == names
    assert all(hashlib.sha256((ckpt / "versions" / name).read_bytes()).hexdigest() == digest
               for name, digest in record["versions"].values())
    before = {f.name: f.stat().st_mtime_ns for f in (ckpt / "versions").iterdir()}
    (ckpt / "versions" / "v999999.pt").write_bytes(b"left by a crash")
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "v"), log__tensorboard="false",
                                           **{**ASYNC, "rounds": 4}))
    run_experiment(cfg, resume=True)
    after = read_checkpoint(tmp_path / "v")["asynchronous"]["versions"]
    on_disk = {f.name: f.stat().st_mtime_ns for f in (ckpt / "versions").iterdir()}
    assert set(on_disk) == {name for name, _ in after.values()} and "v999999.pt" not in on_disk
    kept = set(before) & set(on_disk)  # versions that jobs still held across the resumed step
    assert kept and all(on_disk[name] == before[name] for name in kept)  # kept, not rewritten
    victim = ckpt / "versions" / sorted(on_disk)[0]
    victim.write_bytes(victim.read_bytes()[:-1] + b"x")
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "v"), log__tensorboard="false",
                                           **{**ASYNC, "rounds": 5}))
    metrics = (tmp_path / "v" / "metrics.jsonl").read_bytes()
    with pytest.raises(UserError, match=f"{victim.name} fails its sha256 checksum"):
        run_experiment(cfg, resume=True)
    assert (tmp_path / "v" / "metrics.jsonl").read_bytes() == metrics  # refused before anything changed


def test_the_newest_version_file_is_written_while_the_next_step_trains_and_dropped_if_no_checkpoint_names_it(
        tmp_path):
    """After each checkpoint but the last, the newest version's file is written in a thread and named by the next
    checkpoint (if a job still holds it); a run that stops after a checkpoint (here an error in the round callback
    after round 2 of 4) leaves only the files its server.pt names; a resume from there derives the newest version
    from the server state and ends with the uninterrupted run's metrics."""
    rows = _run(tmp_path, "whole", rounds=4)
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "cut"), log__tensorboard="false",
                                           **{**ASYNC, "rounds": 4}))

    def stop_after_two(metrics: dict) -> None:
        if metrics["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, on_round=stop_after_two)
    record = read_checkpoint(tmp_path / "cut")["asynchronous"]
    ckpt = checkpoint_dir(tmp_path / "cut")
    assert record["derived"] == 2 and read_checkpoint(tmp_path / "cut")["round"] == 2
    assert {f.name for f in (ckpt / "versions").iterdir()} == {name for name, _ in record["versions"].values()}
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "cut")) == strip_timing(rows)


def test_a_malformed_asynchronous_record_with_a_valid_checksum_is_one_line(tmp_path):
    """A server.pt whose queue or derived version is malformed, re-signed with its own sha256 (so only its
    structure is wrong), stops ``--resume`` with one line naming the file, before metrics.jsonl changes."""
    from raysim.engine.state import atomic_save, safe_load, server_file

    _run(tmp_path, "good", rounds=2)
    for name, damage in (("derived", lambda a: a.update(derived="abc")),
                         ("queue", lambda a: a["queue"].update(flights=torch.zeros(3, 2, dtype=torch.int64)))):
        run_dir = tmp_path / name
        shutil.copytree(tmp_path / "good", run_dir)
        record = safe_load(server_file(run_dir))
        record.pop("sha256")
        damage(record["asynchronous"])
        atomic_save({**record, "sha256": content_digest(record)}, server_file(run_dir))
        metrics = (run_dir / "metrics.jsonl").read_bytes()
        cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(run_dir), log__tensorboard="false",
                                               **{**ASYNC, "rounds": 3}))
        with pytest.raises(UserError, match="asynchronous record .* is malformed .* the checkpoint is damaged"):
            run_experiment(cfg, resume=True)
        assert (run_dir / "metrics.jsonl").read_bytes() == metrics, name


def test_a_checkpoint_with_its_versions_inline_still_resumes(tmp_path):
    """A checkpoint written before version files (each version's payload inside server.pt) resumes to the numbers
    of the run that was never stopped."""
    rows = _run(tmp_path, "full", rounds=4)
    _run(tmp_path, "old", rounds=2)
    ckpt = tmp_path / "old" / "checkpoint"
    server = torch.load(ckpt / "server.pt", weights_only=True)
    server.pop("sha256")
    versions = server["asynchronous"]["versions"]
    server["asynchronous"]["versions"] = {v: torch.load(ckpt / "versions" / name, weights_only=True)
                                          for v, (name, _) in versions.items()}
    torch.save({**server, "sha256": content_digest(server)}, ckpt / "server.pt")
    shutil.rmtree(ckpt / "versions")
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "old"), log__tensorboard="false",
                                           **{**ASYNC, "rounds": 4}))
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "old")) == strip_timing(rows)


def test_with_a_system_model_jobs_start_on_available_clients_and_some_drop(tmp_path):
    """Diurnal availability (each client on for half of a 30 s day), lognormal speeds with a 10x spread, dropout
    0.3: every job in flight started on a client available at its start, not already in flight, and the dropped
    jobs are counted; the simulated clock runs on the system model's durations."""
    from raysim.system.model import SystemModel

    system = dict(system__enabled="true", system__availability__mode="diurnal", system__availability__period_s=30,
                  system__speed__median=50, system__speed__spread=10, system__dropout=0.3, system__wait_s=1)
    rows = _run(tmp_path, "sys", rounds=4, **system)
    assert sum(r["dropouts"] for r in rows) > 0 and all(r["clients"] == 2 for r in rows)
    cfg = load_config(None, tiny_overrides(tmp_path, **{**ASYNC, **system}))
    model = SystemModel(cfg.system, cfg.seed, cfg.clients.num)
    queue = EventQueue.from_record(read_checkpoint(tmp_path / "sys")["asynchronous"]["queue"])
    flights = queue.flights()
    assert len(queue) == 3 and len({f.client for f in flights}) == len(flights)  # 3 slots (some may wait); distinct
    for f in flights:
        assert model.available(f.client, f.start) and f.dropped == model.dropped(f.client, f.seq)
        assert f.finish - f.start == pytest.approx(model.duration(f.client, f.bytes_down, f.bytes_up,
                                                                  2 * _train_count(cfg, f.client)))


def _train_count(cfg, client):
    from raysim.data import build_federated_data

    return build_federated_data(cfg).num_train(client)


def test_fedasync_mixes_every_arrival(tmp_path):
    rows = _run(tmp_path, "fa", rounds=6, asynchronous__mode="fedasync", asynchronous__staleness="hinge")
    assert [r["clients"] for r in rows] == [1] * 6 and rows[-1]["loss"] < rows[0]["loss"]
    assert [r["staleness_max"] for r in rows][:1] == [0] and max(r["staleness_max"] for r in rows) >= 2


def test_an_algorithm_without_a_model_average_is_refused(tmp_path):
    line = refused_config("asynchronous.mode", *tiny_overrides(tmp_path, algorithm__name="scaffold",
                                                                asynchronous__mode="fedbuff"))
    assert "scaffold uploads named statistics, not a model" in line
    assert not (tmp_path / "run").exists()  # nothing written
    line = refused_config("asynchronous.mode", *tiny_overrides(tmp_path, algorithm__name="fednova",
                                                                asynchronous__mode="fedasync"))
    assert "fednova uploads a weighted mean, not a model" in line
    refused_config("asynchronous.concurrency", *tiny_overrides(tmp_path, asynchronous__mode="fedasync",
                                                                asynchronous__concurrency=9))


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_metrics(tmp_path, cli_env):
    """``raysim run`` (in process, engine.backend=inline) SIGKILLed after round 3 of 6, then ``--resume``."""
    args = tiny_overrides(tmp_path, log__dir=str(tmp_path / "killed"), log__tensorboard="false",
                          **{**ASYNC, "rounds": 6})
    kill_group_once(launch_cli(["run", *args], cli_env), "round 3/6")
    assert main(["run", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    plain = _run(tmp_path, "plain", rounds=6)
    assert strip_timing(read_rows(tmp_path / "killed")) == strip_timing(plain)


@pytest.mark.slow
def test_the_same_numbers_in_process_and_on_two_ray_workers_with_one_killed(ray_cluster, tmp_path):
    """In process (one worker), then on two Ray workers with one SIGKILLed mid-job (``killed_worker_matches_inline``:
    the killed job runs again elsewhere): FedBuff's metrics are the same."""
    extra = {k: v for k, v in ASYNC.items() if k not in ("clients__num", "train__local_epochs", "data__partition")}
    rows = killed_worker_matches_inline(tmp_path, log__tensorboard="false", **extra)
    assert [r["clients"] for r in rows] == [2, 2, 2]
