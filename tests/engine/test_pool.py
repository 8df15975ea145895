"""The Ray worker pool (raysim.engine.pool): it only dispatches calls, with the returns they declare, and hands
results back in call order whatever order they finish in; a worker's death is tests/engine/test_faults.py."""

from __future__ import annotations

import os
import random
import time
from types import SimpleNamespace

import ray
import torch

from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.engine.jobs import CentralCall, TrainCall, TrainJob
from raysim.engine.pool import WorkerPool


class _FakeWorker:
    """Records what reaches the worker's one verb: the call, its arguments, the returns asked for."""

    def __init__(self) -> None:
        self.calls: list = []
        self.run = SimpleNamespace(remote=self._remote(1), options=lambda num_returns: SimpleNamespace(
            remote=self._remote(num_returns)))

    def _remote(self, returns: int):
        def remote(call, *args):
            self.calls.append((type(call).__name__, list(args), returns))
            return [f"ref{i}" for i in range(returns)] if returns > 1 else "ref"
        return remote


def test_a_call_goes_to_the_one_verb_with_its_args_and_returns():
    worker = _FakeWorker()
    train = TrainCall(jobs=[TrainJob(client_id=c, round=1, payload_ref="p") for c in (4, 7)], states=["s4", None])
    assert WorkerPool._submit(train, worker) == ["ref0", "ref1", "ref2"]
    assert WorkerPool._submit(CentralCall(train=lambda device: None), worker) == "ref"
    assert worker.calls == [("TrainCall", ["s4", None], 3), ("CentralCall", [], 1)]


def test_pool_runs_many_virtual_clients_on_two_workers(ray_cluster):
    """53 virtual clients (prime), in shuffled order, 4 to a call: each client gets its own result and state
    object, results come back in the calls' order, and ``on_result`` hears of each call once."""
    cfg = load_config(None, ["clients.num=53", "data.partition=dirichlet", "data.min_samples=12",
                             "algorithm.name=local", "engine.num_workers=2", "engine.jobs_per_worker=3"])
    data = build_federated_data(cfg)
    pool = WorkerPool(cfg, ray.put(data))
    try:
        assert len({info["pid"] for info in pool.info()}) == 2
        clients = list(range(53))
        random.Random(0).shuffle(clients)
        payload = ray.put({})
        calls = [TrainCall(jobs=[TrainJob(client_id=c, round=1, payload_ref=payload) for c in clients[i:i + 4]],
                         states=[None] * len(clients[i:i + 4])) for i in range(0, 53, 4)]
        told: list[tuple[int, object]] = []
        done = pool.run(calls, lambda index, value: told.append((index, value)))
        # both workers are up now: two calls go to two workers (breadth first), not both to the first one
        pids = pool.run([CentralCall(train=lambda device: (time.sleep(0.5), os.getpid())[1]) for _ in range(2)])
    finally:
        pool.shutdown()
    assert len(set(pids)) == 2
    # each call's result was told once, as it came in: the same first object the call returns
    assert sorted(i for i, _ in told) == list(range(len(calls))) and all(v is done[i][0] for i, v in told)
    assert len(done) == len(calls)
    seen = []
    for call, (result, state_refs) in zip(calls, done):
        assert [r.client_id for r in result.results] == call.clients and len(state_refs) == len(call.jobs)
        assert result.sums == []  # no groups: uploads (none, for local training) travel per client
        for r in result.results:
            assert r.num_samples == data.num_train(r.client_id)
            seen.append(r.client_id)
    assert sorted(seen) == list(range(53))
    first, second = ray.get([done[0][1][0], done[0][1][1]])
    assert not torch.equal(first["head.weight"], second["head.weight"])


def _pids(tmp_path, name: str, **extra: object) -> tuple[set[int], list[dict]]:
    """A run on two Ray workers: its workers' pids (read at its start) and its metrics."""
    from helpers import strip_timing, tiny_overrides
    from raysim.engine.runner import run_experiment

    pids: set[int] = set()
    cfg = load_config(None, tiny_overrides(tmp_path / name, engine__backend="ray", engine__num_workers=2, **extra))
    _, rows, _ = run_experiment(cfg, on_round=lambda m: None,
                                on_start=lambda s: pids.update(i["pid"] for i in s["control"].worker_info()))
    return pids, strip_timing(rows)


def test_warm_workers_serve_the_next_run_with_a_fresh_workers_numbers(ray_cluster, tmp_path):
    """Inside warm_workers() (the test session is), a run that ended hands its two workers to the next run of the
    same shape: the same processes, reset, compute what fresh ones do (a stateful algorithm with another config);
    a worker of another shape, or a release, ends the kept ones and gives their CPUs back."""
    from helpers import strip_timing, tiny_overrides
    from raysim.engine import pool
    from raysim.engine.runner import run_experiment

    first, _ = _pids(tmp_path, "a")
    assert len(first) == 2 and len(pool._warm["idle"]) == 2
    second, warm = _pids(tmp_path, "b", algorithm__name="scaffold", train__lr=0.05, clients__num=6)
    assert second == first  # the same processes ...
    plain = load_config(None, tiny_overrides(tmp_path / "c", algorithm__name="scaffold", train__lr=0.05,
                                             clients__num=6))
    assert warm == strip_timing(run_experiment(plain)[1])  # ... with a fresh worker's numbers (in process here)
    third, _ = _pids(tmp_path, "d", engine__cpus_per_worker=0.5)  # another share: new workers, the kept ones end
    assert not third & first
    pool.release_warm_workers()
    assert pool._warm["idle"] == []
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2
