"""The hook contract end to end through tests/plugins/hook_probe.py, in this process and on two Ray workers:
per-client state from init_client_state, per-client payloads counted per client, non-weight uploads, client ids
in aggregation, server-side training on a worker, and payloads that a job cannot change for the next one."""

from __future__ import annotations

import torch

from conftest import read_rows, strip_timing, tiny_overrides
from raysim.config import load_config
from raysim.engine.runner import run_experiment

HEAD_BYTES = (16 * 10 + 10) * 4  # feature_dim 16, 10 classes, float32


def _probe(tmp_path, name: str, **engine) -> list[dict]:
    overrides = tiny_overrides(tmp_path / name, rounds=3, clients__fraction=0.5, engine__jobs_per_worker=1,
                               algorithm__name="hook_probe", plugins="[hook_probe]", **engine)
    run_dir, _, _ = run_experiment(load_config(None, overrides))
    return read_rows(run_dir)


def test_every_hook_of_the_contract_in_process_and_on_two_ray_workers(ray_cluster, tmp_path):
    one = _probe(tmp_path, "inline")  # every job in turn in one process: a payload scribbled on would leak here
    two = _probe(tmp_path, "ray", engine__backend="ray", engine__num_workers=2)
    assert strip_timing(one) == strip_timing(two)
    assert 0 < one[0]["loss_draw"] < 1  # a worker's first job (which builds its model) draws what others would
    assert [r["trained_rounds"] for r in one] == [1, 2, 3]  # server_train ran once a round, its state kept
    assert one[-1]["visits_sum"] == 2 * 3  # 2 of 4 clients a round: each client's visits counted by its own state
    assert len({r["noise"] for r in one}) == 3 and all(r["noise"] > 0 for r in one)
    from raysim.engine.sampling import sample_clients

    for r in one:
        sampled = sample_clients(0, r["round"], 4, 0.5)
        shared = HEAD_BYTES + 3 * 4  # the head and the noise vector, once per sampled client
        assert r["bytes_down"] == len(sampled) * shared + sum((c + 1) * 4 for c in sampled)
        assert r["bytes_up"] == len(sampled) * (HEAD_BYTES + 8 + 10 * 8)  # head, visit count, label counts


def test_payload_changed_in_place_does_not_reach_the_next_job(tmp_path):
    """The client-job core in this process: two jobs of one round share the round's payload object."""
    from raysim.algorithms.base import Algorithm
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import TrainJob
    from raysim.registry import register_algorithm

    @register_algorithm("scribbler")
    class Scribbler(Algorithm):
        def client_loss(self, model, x, y, ctx):
            ctx.payload["model"]["head.bias"].add_(1.0)
            ctx.payload["extra"] = 1
            return super().client_loss(model, x, y, ctx)

    cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="scribbler"))
    from raysim.models import build_model

    jobs = ClientJobs(cfg, build_federated_data(cfg))
    initial = build_model(cfg, "mlp", jobs.data.input_shape(0), 10).state_dict()
    payload = {"model": {k: v.clone() for k, v in initial.items()}}
    job = TrainJob(client_id=0, round=1, payload_ref=None)
    first, _ = jobs.train(job, payload, None, None)
    again, _ = jobs.train(job, payload, None, None)
    assert torch.equal(payload["model"]["head.bias"], initial["head.bias"]) and "extra" not in payload
    assert first.loss == again.loss  # the same job twice on one worker: the same numbers
    assert all(torch.equal(first.upload[k], again.upload[k]) for k in first.upload)
