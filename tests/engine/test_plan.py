"""The round's plan (raysim.engine.plan): a pure function of the clients and the settings; sum groups and stacks
from the config alone, calls sized by measurement without changing the work, the auto groups' bytes against every
fixed size, and the round's one sum, the same bits whatever order the calls end in."""

from __future__ import annotations

import pytest
import torch

from raysim.engine.jobs import TrainJob
from raysim.engine.plan import clients_per_call, group_size, plan_round


def _jobs(clients: list[int]) -> list[TrainJob]:
    return [TrainJob(client_id=c, round=3, payload_ref="payload") for c in clients]


def _shape(calls) -> list[tuple]:
    return [([j.client_id for j in c.jobs], c.groups, c.stacked) for c in calls]


def test_clients_per_call_from_measured_time():
    assert clients_per_call("auto", None, 100, 4) == 1  # nothing measured yet
    assert clients_per_call("auto", 0.004, 100, 4) == 5  # ~20 ms of work a call
    assert clients_per_call("auto", 0.004, 8, 4) == 2  # an even share of the round over 2 workers x 2 slots
    assert clients_per_call("auto", 0.5, 100, 4) == 1  # long updates go one per call
    assert clients_per_call("auto", 1e-6, 10_000, 1) == 64  # never more than MAX_CLIENTS_PER_CALL
    assert clients_per_call("3", None, 2, 4) == 3


def test_groups_are_fixed_in_id_order_and_calls_take_them_whole():
    jobs = _jobs([9, 2, 5, 7, 1, 4, 8])  # any order in: id order out
    states = [f"s{j.client_id}" for j in jobs]
    calls = plan_round(jobs, states, sum_group=2, stack=1, per_call=5)
    assert _shape(calls) == [([1, 2, 4, 5], (2, 2), False), ([7, 8, 9], (2, 1), False)]
    assert calls[0].states == ["s1", "s2", "s4", "s5"] and calls[0].returns == 5
    # a group larger than a call travels whole, alone
    assert _shape(plan_round(jobs, states, sum_group=3, stack=1, per_call=1)) == [
        ([1, 2, 4], (3,), False), ([5, 7, 8], (3,), False), ([9], (1,), False)]


def test_without_sums_every_client_is_its_own_unit():
    jobs = _jobs([3, 1, 2])
    assert _shape(plan_round(jobs, [None] * 3, sum_group=0, stack=1, per_call=2)) == [
        ([1, 2], (), False), ([3], (), False)]


def test_cohorts_are_runs_of_whole_groups_whatever_the_call_size():
    jobs = _jobs(list(range(7)))
    stacked = plan_round(jobs, [None] * 7, sum_group=2, stack=5, per_call=1)
    assert _shape(stacked) == [([0, 1, 2, 3], (2, 2), True), ([4, 5, 6], (2, 1), True)]
    assert _shape(plan_round(jobs, [None] * 7, sum_group=0, stack=3, per_call=64)) == [
        ([0, 1, 2], (), True), ([3, 4, 5], (), True), ([6], (), True)]
    # a group larger than the stack is a call of its own that stacks at most a stack at once (ClientJobs.run_call)
    big = plan_round(jobs, [None] * 7, sum_group=4, stack=3, per_call=1)
    assert _shape(big) == [([0, 1, 2, 3], (4,), True), ([4, 5, 6], (3,), True)] and {c.stack for c in big} == {3}


def _summed_groups(calls) -> list[list[int]]:
    out = []
    for call in calls:
        ids, at = [j.client_id for j in call.jobs], 0
        for size in call.groups:
            out.append(ids[at:at + size])
            at += size
    return out


def test_the_work_does_not_depend_on_the_call_size():
    """Whatever the measured call size, the same groups are summed, in the same order."""
    jobs = _jobs(list(range(50)))
    expect = [list(range(5 * i, 5 * i + 5)) for i in range(10)]  # sum_group=auto: 50 clients in 10 groups of 5
    for size in (1, 3, 7, 50):
        calls = plan_round(jobs, [None] * 50, sum_group=group_size("auto", 50), stack=1, per_call=size)
        assert _summed_groups(calls) == expect
        assert all(sum(c.groups) <= max(size, 5) for c in calls)


def _bytes_moved(calls) -> int:
    """What a round's uploads cost the object store, in parameters' worth of float32: a summed group of two or
    more is a float64 buffer (2), a group of one and an upload of a split group travel as they are (1)."""
    return sum(len(c.jobs) if c.part_of is not None else sum(1 if g == 1 else 2 for g in c.groups) for c in calls)


def test_auto_groups_move_near_the_fewest_bytes_on_two_to_sixteen_workers():
    """sum_group=auto (about √(2n) groups) against every fixed group size, with the plan's split tail: within 1.5×
    of the fewest bytes a round can move, for 10-1,000 clients on 2-16 workers ("at most 32 groups": 2.5×)."""
    for n in (10, 20, 50, 100, 200, 300, 500, 1000):
        jobs = _jobs(list(range(n)))
        for workers in (2, 4, 8, 16):
            cost = {g: _bytes_moved(plan_round(jobs, [None] * n, sum_group=g, stack=1, per_call=1, workers=workers))
                    for g in range(1, min(n, 100) + 1)}  # the fewest lie far below 100 clients a group
            assert cost[group_size("auto", n)] <= 1.5 * min(cost.values()), (n, workers)


def test_the_server_test_split_is_shared_out_in_whole_blocks():
    from raysim.engine.plan import plan_server_test

    def bounds(rows: int, chunk: int, workers: int) -> list[tuple[int, int]]:
        return [c.job.rows for c in plan_server_test(-1, rows, chunk, workers, 3, "payload")]

    assert bounds(13, 4, 2) == [(0, 8), (8, 13)]  # blocks [0,4) [4,8) | [8,12) [12,13)
    assert bounds(13, 4, 1) == [(0, 13)]
    assert bounds(13, 1024, 8) == [(0, 13)]  # one block: one call, however many workers
    assert bounds(10, 2, 3) == [(0, 2), (2, 6), (6, 10)]
    calls = plan_server_test(7, 10, 2, 3, 3, "payload")
    assert all(c.job.client_ids == [7] and c.job.round == 3 and c.job.payload_ref == "payload" for c in calls)


def test_the_last_groups_train_one_client_a_call_on_several_workers():
    from raysim.algorithms.aggregation import UploadSum

    def merged(sums):
        out = UploadSum()
        for total in sums:
            out.merge(total)
        return out
    from raysim.engine.jobs import CallResult, TrainResult
    from raysim.engine.plan import RoundSum

    jobs = _jobs(list(range(10)))
    calls = plan_round(jobs, [None] * 10, sum_group=2, stack=1, per_call=1, workers=2)
    # five groups; the last two (clients 6-7 and 8-9) as one call a client, each naming its group
    assert [(c.clients, c.groups, c.part_of) for c in calls] == [
        ([0, 1], (2,), None), ([2, 3], (2,), None), ([4, 5], (2,), None),
        ([6], (), 3), ([7], (), 3), ([8], (), 4), ([9], (), 4)]
    assert [c.part_of for c in plan_round(jobs, [None] * 10, sum_group=2, stack=1, per_call=1)] == [None] * 5
    assert [c.part_of for c in plan_round(jobs, [None] * 10, sum_group=2, stack=4, per_call=1, workers=2)] == \
        [None] * 3  # stacks keep their groups whole

    def result(c: int) -> TrainResult:
        g = torch.Generator().manual_seed(c)
        return TrainResult(client_id=c, round=1, upload={"w": torch.randn(3, generator=g)}, num_samples=c + 1,
                           finite=True, loss=0.0, seconds=0.1)

    # the workers' results: whole groups summed where they trained, the split ones' uploads as they came, in
    # any order: the round's sum is that of every group summed and then added in group order, bit for bit
    def output(call) -> CallResult:
        if call.part_of is not None:
            return CallResult(results=[result(c) for c in call.clients])
        return CallResult(results=[], sums=[UploadSum().add_results([result(c) for c in call.clients])])

    pairs = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
    expected = merged(UploadSum().add_results([result(a), result(b)]) for a, b in pairs)
    for arrival in ([0, 1, 2, 3, 4, 5, 6], [6, 4, 3, 5, 0, 2, 1], [4, 3, 2, 6, 5, 1, 0]):
        total = RoundSum(calls)
        for index in arrival:
            total.add(index, output(calls[index]))
        got = total.total()
        assert got.clients == expected.clients and got.weight == expected.weight
        assert torch.equal(got.total, expected.total)
    unfinished = RoundSum(calls)
    unfinished.add(1, output(calls[1]))  # call 0 is still out: nothing folded, and no sum to hand on
    with pytest.raises(RuntimeError, match="0 of 7"):
        unfinished.total()
