"""FedBABU: the head never trains (bit for bit), fine-tuning at evaluation changes it, tiny runs on Ray."""

from __future__ import annotations

import pytest
import torch
from conftest import read_rows, refused_config, tiny_overrides

from raysim.config import ConfigError, load_config
from raysim.models import build_model
from raysim.registry import get_algorithm

HEAD_KEYS = ("head.weight", "head.bias")


def test_config_defaults_and_bad_values():
    a = load_config(None, ["algorithm.name=fedbabu"]).algorithm
    assert (a.finetune_epochs, a.finetune_lr) == (5, 0.001)
    for bad, key in [("algorithm.finetune_epochs=-1", "finetune_epochs"), ("algorithm.finetune_lr=0", "finetune_lr")]:
        with pytest.raises(ConfigError, match=f"'algorithm.{key}'"):
            load_config(None, ["algorithm.name=fedbabu", bad])


def test_cli_bad_finetune_epochs_exits_2_with_one_line(tmp_path):
    refused_config("algorithm.finetune_epochs", *tiny_overrides(tmp_path), "algorithm.name=fedbabu",
                   "algorithm.finetune_epochs=-1")


# ---------------------------------------------------------------------------------------------- on Ray
def test_head_is_frozen_in_training_and_fine_tuned_at_evaluation(tmp_path):
    """Real worker jobs in this process: after a client job the live head equals h^0 bit for bit and the upload is
    the body alone; evaluation with fine-tuning moves the head (and is reproducible), without it leaves it."""
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import EvalJob, TrainJob
    from raysim.models import model_key

    def jobs_for(finetune_epochs: int):
        cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="fedbabu", train__local_epochs=2,
                                               algorithm__finetune_epochs=finetune_epochs))
        return cfg, ClientJobs(cfg, data)  # the client-job core, in this process

    cfg0 = load_config(None, tiny_overrides(tmp_path, algorithm__name="fedbabu"))
    data = build_federated_data(cfg0)
    cfg, jobs = jobs_for(5)
    algo = get_algorithm("fedbabu")(cfg)
    initial = build_model(cfg, "mlp", data.input_shape(0), 10, algorithm=algo).state_dict()
    payload = algo.server_payload(algo.init_server_state(initial), 1)
    result, state = jobs.train(TrainJob(client_id=0, round=1, payload_ref=None), payload, None, None)
    live = jobs._models[model_key(cfg, data, 0)][0].state_dict()
    trained_head = {k: live[k].clone() for k in HEAD_KEYS}
    assert all(torch.equal(trained_head[k], initial[k]) for k in HEAD_KEYS)  # h^0, bit for bit
    assert not torch.equal(live["backbone.1.weight"], initial["backbone.1.weight"])  # the body did train
    assert set(result.upload) == {k for k in initial if k.startswith("backbone.")} and state is None

    new_body = algo.server_aggregate([_update(result)], algo.init_server_state(initial), 1)
    eval_payload = algo.eval_payload(new_body)
    job = EvalJob(client_ids=[0], round=1, payload_ref=None)
    accs = [jobs.evaluate(job, eval_payload, [None], [None])[0] for _ in range(2)]
    tuned = jobs._models[model_key(cfg, data, 0)][0].state_dict()
    assert not torch.equal(tuned["head.weight"], initial["head.weight"])  # fine-tuning trains the head too
    assert accs[0] == accs[1]  # seeded per (seed, client, round): the same fine-tuning each time

    cfg_no, jobs_no = jobs_for(0)
    jobs_no.evaluate(job, eval_payload, [None], [None])
    untuned = jobs_no._models[model_key(cfg_no, data, 0)][0].state_dict()
    assert all(torch.equal(untuned[k], initial[k]) for k in HEAD_KEYS)
    assert all(torch.equal(untuned[k], new_body["model"][k]) for k in new_body["model"])


def _update(result):
    from raysim.algorithms.base import ClientUpdate

    return ClientUpdate(client_id=result.client_id, upload=result.upload, num_samples=result.num_samples,
                        loss=result.loss)


def test_fedbabu_run_moves_the_body_only_and_learns(tmp_path):
    from raysim.engine.runner import run_experiment

    cfg = load_config(None, tiny_overrides(tmp_path, algorithm__name="fedbabu", train__local_epochs=2,
                                           train__momentum=0.9, algorithm__finetune_epochs=2))
    run_dir, _, _ = run_experiment(cfg)
    one = read_rows(run_dir)
    assert [r["round"] for r in one] == [1, 2]
    for r in one:
        assert {"acc_mean", "loss", "bytes_up", "bytes_down"} <= set(r) and "acc_global" not in r
        assert r["loss"] == r["loss"]
        # only the body travels: MLP body 64*32 + 32 + 32*16 + 16 floats per client, both ways
        assert r["bytes_up"] == r["bytes_down"] == 4 * (64 * 32 + 32 + 32 * 16 + 16) * 4
    # chance is 0.1; a frozen random head learns slowly, but with momentum 0.9 seeds 0-4 reach 0.80 to 0.88
    assert one[-1]["acc_mean"] > 0.5 and one[-1]["loss"] < one[0]["loss"]
