"""The client-job core (raysim.engine.core): one client's local training through the one loop, worked by hand;
one call runs its clients one at a time or stacked and sums each group where they trained; jobs are pure
functions of their inputs."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from conftest import tiny_overrides
from raysim.algorithms.aggregation import UploadSum
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.engine.core import ClientJobs, job_seed
from raysim.engine.jobs import TrainCall, TrainJob
from raysim.models import build_model
from raysim.registry import get_algorithm


def _core(tmp_path: Path, **extra: object) -> tuple[ClientJobs, dict]:
    cfg = load_config(None, tiny_overrides(tmp_path, clients__num=6, data__partition="dirichlet", **extra))
    alg = get_algorithm(cfg.algorithm.name)(cfg)
    data = build_federated_data(cfg)
    initial = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0, alg)
    return ClientJobs(cfg, data, algorithm=alg), alg.server_payload(alg.init_server_state(initial.state_dict()), 1)


def _job(c: int) -> TrainJob:
    return TrainJob(client_id=c, round=1, payload_ref=None)


def test_one_client_is_plain_sgd_on_its_own_batches(tmp_path):
    """FedAvg's local training, redone by hand: the payload's model, the client's permutation from (seed, client,
    round), batches of 32 with a trailing single sample joined, cross-entropy and SGD (lr 0.1, momentum 0.9,
    inherited from the tiny config's defaults): the upload equals it bit for bit, and the loss is the mean over
    the samples seen."""
    core, shared = _core(tmp_path, train__local_epochs=2)
    result, _ = core.train(_job(2), shared, None, None)

    model = core.model(2)  # a fresh copy at the initial weights, then the payload, as client_setup loads it
    model.load_state_dict(shared["model"])
    x, y, _ = core.data.tensors(2, "train")
    gen = torch.Generator().manual_seed(job_seed(core.cfg.seed, 2, 1))
    t = core.cfg.train
    opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    model.train()
    total, seen = 0.0, 0
    for _ in range(2):
        order = torch.randperm(len(y), generator=gen)
        bounds = [(b, min(b + t.batch_size, len(y))) for b in range(0, len(y), t.batch_size)]
        if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
            bounds[-2:] = [(bounds[-2][0], len(y))]
        for b, e in bounds:
            bi = order[b:e]
            loss = F.cross_entropy(model(x[bi]), y[bi])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach().double()) * len(bi)
            seen += len(bi)
    assert result.finite and result.num_samples == len(y)
    for key, value in model.state_dict().items():
        assert torch.equal(result.upload[key], value), key
    assert abs(result.loss - total / seen) < 1e-12


def test_a_call_sums_each_group_where_its_clients_trained(tmp_path):
    """Groups of 2 and 1 in one call: each group's sum equals the UploadSum of its clients' own uploads (trained
    alone, in id order, weighted by samples), the results travel without uploads, and the states come back in
    call order."""
    core, shared = _core(tmp_path, algorithm__name="partialavg")
    alone = {c: core.train(_job(c), shared, None, None) for c in (1, 3, 4)}
    call = TrainCall(jobs=[_job(c) for c in (1, 3, 4)], states=[None] * 3, groups=(2, 1))
    result, kept = core.run_call(call, shared, [None] * 3, [None] * 3)
    assert [r.client_id for r in result.results] == [1, 3, 4] and all(r.upload == {} for r in result.results)
    assert all(r.upload_bytes > 0 for r in result.results)  # counted, though summed
    for members, total in zip(([1, 3], [4]), result.sums):
        expect = UploadSum()
        for c in members:
            expect.add(c, alone[c][0].upload, alone[c][0].num_samples)
        assert total.clients == members and total.weight == expect.weight
        got, want = total.mean(), expect.mean()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    for c, state in zip((1, 3, 4), kept):  # partialavg keeps the body: each client's own
        assert all(torch.equal(state[k], alone[c][1][k]) for k in state)


def test_a_stacked_call_gives_the_one_at_a_time_numbers(tmp_path):
    """The same call stacked: equal losses, and weights within float32 rounding (this MLP's first layer is 64
    wide, yet its stack's weights differ from one client's alone by up to 3e-8: measured the same before and
    after the engine's rebuild, so ``engine.vectorize`` is within rounding here, not bit for bit)."""
    core, shared = _core(tmp_path)
    jobs = [_job(c) for c in range(4)]
    one, _ = core.run_call(TrainCall(jobs=jobs, states=[None] * 4), shared, [None] * 4, [None] * 4)
    stacked, _ = core.run_call(TrainCall(jobs=jobs, states=[None] * 4, stacked=True), shared, [None] * 4, [None] * 4)
    for a, b in zip(one.results, stacked.results):
        assert a.client_id == b.client_id and a.loss == b.loss
        assert all(torch.allclose(a.upload[k], b.upload[k], rtol=0, atol=1e-7) for k in a.upload)


def test_a_sum_group_larger_than_the_cohort_trains_cohort_by_cohort(tmp_path, monkeypatch):
    """A stacked call of one group of 5 with ``stack=2`` stacks clients (0, 1), (2, 3), then (4): never more at
    once than the stack the probe chose; the group's sum is that of the same clients stacked two by two."""
    import raysim.engine.core as core_module

    core, shared = _core(tmp_path)
    stacks: list[list[int]] = []
    train_stack = core_module.train_stack
    monkeypatch.setattr(core_module, "train_stack", lambda c, jobs, *a: stacks.append(
        [j.client_id for j in jobs]) or train_stack(c, jobs, *a))
    jobs = [_job(c) for c in range(5)]
    result, _ = core.run_call(TrainCall(jobs=jobs, states=[None] * 5, stacked=True, stack=2, groups=(5,)), shared,
                              [None] * 5, [None] * 5)
    assert stacks == [[0, 1], [2, 3], [4]] and [r.client_id for r in result.results] == [0, 1, 2, 3, 4]
    expect = UploadSum()
    for pair in ([0, 1], [2, 3], [4]):
        done, _ = core.run_call(TrainCall(jobs=[_job(c) for c in pair], states=[None] * len(pair), stacked=True),
                                shared, [None] * len(pair), [None] * len(pair))
        for r in done.results:
            expect.add(r.client_id, r.upload, r.num_samples)
    got, want = result.sums[0].mean(), expect.mean()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_job_is_a_pure_function_of_its_inputs(tmp_path):
    """The same job twice, with another client's job in between, in the same process: the same bits (the model
    object is reset, the payload copied, the seed taken from (seed, client, round))."""
    core, shared = _core(tmp_path)
    first, _ = core.train(_job(0), shared, None, None)
    core.train(_job(5), shared, None, None)
    again, _ = core.train(_job(0), shared, None, None)
    assert first.loss == again.loss and all(torch.equal(first.upload[k], again.upload[k]) for k in first.upload)
