"""A million virtual clients on demand, and many clients per Ray call (the killed-worker guarantee under batching is
tests/engine/test_faults.py::test_killed_worker_changes_no_metric; a batched pool run, tests/engine/test_driver.py)."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace


from conftest import tiny_overrides
from raysim.config import load_config
from raysim.engine.driver import eval_cohort
from raysim.engine.pool import Job, WorkerPool
from raysim.engine.runner import run_experiment


def test_million_clients_keep_the_drivers_bookkeeping_small(tmp_path):
    cfg = load_config(None, tiny_overrides(
        tmp_path, data__name="synthetic", clients__num=1_000_000, clients__fraction=1e-5, algorithm__name="partialavg",
        eval__clients=25, data__samples_per_domain=200, log__tensorboard="false"))
    seen: dict = {}

    def on_round(metrics: dict) -> None:
        if metrics["round"] == 2:
            seen.update(seen["driver"].footprint())  # the in-process driver (engine.backend=inline)

    run_dir, rows, _ = run_experiment(cfg, on_start=lambda info: seen.update(driver=info["control"].driver),
                                      on_round=on_round)
    assert [r["round"] for r in rows] == [1, 2] and all(r["clients"] == 10 for r in rows)
    assert seen["client_states"] <= 20 and seen["eval_cohort"] == 25  # the sampled clients, the seeded cohort
    assert seen["data_bytes"] < 4096  # the dataset object holds settings, not a million clients' samples
    assert len(list((run_dir / "checkpoint" / "clients").iterdir())) == seen["client_states"]
    # the cohort's 25 clients never train (10 of a million a round): learning shows on the clients that trained.
    # Evaluated right after their round, their models beat chance (0.1) by far: 0.53 to 0.81 a round on seeds 0-4,
    # where untrained models (train.lr=1e-9) score 0.00 to 0.17
    trained = run_experiment(load_config(None, tiny_overrides(
        tmp_path, log__dir=str(tmp_path / "sampled"), data__name="synthetic", clients__num=1_000_000,
        clients__fraction=1e-5, algorithm__name="partialavg", eval__clients="sampled", data__samples_per_domain=200,
        log__tensorboard="false")))[1]
    assert all(r["acc_mean"] > 0.4 for r in trained), [r["acc_mean"] for r in trained]


def test_eval_cohort_is_fixed_and_today_s_for_small_federations():
    assert eval_cohort(0, 10, "auto") == list(range(10)) == eval_cohort(0, 10, "all") == eval_cohort(0, 10, "50")
    assert eval_cohort(0, 10, "sampled") is None
    big = eval_cohort(0, 1_000_000, "auto")
    assert len(big) == 1000 and big == sorted(set(big)) and big == eval_cohort(0, 1_000_000, "1000")
    assert big != eval_cohort(1, 1_000_000, "auto")


def _pool(setting: str, workers: int = 2, per_worker: int = 2) -> WorkerPool:
    pool = WorkerPool.__new__(WorkerPool)
    pool.cfg = SimpleNamespace(engine=SimpleNamespace(clients_per_call=setting, jobs_per_worker=per_worker))
    pool.workers, pool._client_s = [None] * workers, None
    return pool


def test_clients_per_call_from_measured_job_time():
    pool = _pool("auto")
    assert pool.clients_per_call(100) == 1  # nothing measured yet
    pool._measured(SimpleNamespace(seconds=0.004))
    assert pool.clients_per_call(100) == 5  # ~20 ms of work a call
    assert pool.clients_per_call(8) == 2  # an even share of what is queued over 2 workers x 2 slots
    pool._measured(SimpleNamespace(seconds=0.5))
    assert pool.clients_per_call(100) == 1  # long updates go one per call
    assert _pool("3").clients_per_call(2) == 3


class _FakeWorker:
    """Records the calls the pool makes: ``one`` per unbatchable job, ``train_many`` with num_returns per batch."""

    def __init__(self) -> None:
        self.calls: list = []
        self.one = SimpleNamespace(remote=lambda x: self.calls.append(("one", [x])) or f"ref{x}")
        self.train_many = SimpleNamespace(options=self._options)
        self.train_groups = SimpleNamespace(options=self._group_options)

    def _group_options(self, num_returns: int):
        def remote(groups, *states, stacked=False):
            assert not stacked  # engine.vectorize off: no cohort
            assert len(states) == sum(len(g) for g in groups) and num_returns == len(groups) + len(states)
            self.calls.append(("groups", [list(g) for g in groups]))
            return [f"sum{g[0]}" for g in groups] + [f"state{c}" for g in groups for c in g]
        return SimpleNamespace(remote=remote)

    def _options(self, num_returns: int):
        def remote(works, *states):
            assert len(works) == len(states) and num_returns == 2 * len(works)
            self.calls.append(("many", list(works)))
            return [f"{kind}{w}" for w in works for kind in ("result", "state")]
        return SimpleNamespace(remote=remote)


def test_batches_take_only_batchable_jobs_and_give_each_client_its_refs():
    worker = _FakeWorker()
    jobs = [Job(key=i, submit=lambda w, i=i: w.one.remote(i), clients=[i], round=1,
                batch=(i, None) if i != 2 else None) for i in range(6)]
    queue, pool = deque(jobs), _pool("3")
    outs = []
    while queue:
        group, refs = pool._submit(queue, worker)
        outs.extend(zip([j.key for j in group], refs))
    assert worker.calls == [("many", [0, 1]), ("one", [2]), ("many", [3, 4, 5])]
    assert outs[0] == (0, ["result0", "state0"]) and outs[2] == (2, "ref2") and outs[5] == (5, ["result5", "state5"])


def test_sum_groups_are_batched_whole_and_each_gets_its_sum_and_its_clients_states():
    worker = _FakeWorker()
    groups = [[0, 1], [2, 3], [4, 5], [6]]
    jobs = [Job(key=i, submit=lambda w, i=i: w.one.remote(i), clients=g, round=1, sum_group=(g, [None] * len(g)))
            for i, g in enumerate(groups)]
    queue, pool = deque(jobs), _pool("5")  # at most 5 clients a call: two whole groups of two
    outs = []
    while queue:
        group, refs = pool._submit(queue, worker)
        outs.extend(zip([j.key for j in group], refs))
    assert worker.calls == [("groups", [[0, 1], [2, 3]]), ("groups", [[4, 5], [6]])]
    assert outs[0] == (0, ["sum0", "state0", "state1"]) and outs[1] == (1, ["sum2", "state2", "state3"])
    assert outs[3] == (3, ["sum6", "state6"])
    single = _FakeWorker()
    group, refs = _pool("1")._submit(deque(jobs[:2]), single)  # a group larger than the call: alone, via submit
    assert [j.key for j in group] == [0] and single.calls == [("one", [0])]
