"""The pfl side of benchmarks/pfl.py: FedAvg in pfl 0.6.0, run as pfl's own benchmarks run it.

    PFL_BENCH_BUNDLE=bundle.pt PFL_BENCH_OUT=out.json \
        benchmarks/.pfl-venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/_pfl/pfl_app.py

Built like pfl-research's benchmarks/image_classification/pytorch/train.py: an in-memory ``FederatedDataset`` of
torch tensors, a ``PyTorchModel`` (``torch.optim.SGD`` locally, SGD at learning rate 1.0 on the server, which applies
the average update), ``SimulatedBackend`` with ``WeightByDatapoints``, ``FederatedAveraging`` and central evaluation
through ``CentralEvaluationCallback`` (distributed over the processes). ``torchrun`` gives each process its rank;
pfl shards every cohort over them and all-reduces the updates.

So that pfl computes what raysim and the plain loop compute, three things come from the bundle (written by
benchmarks/pfl.py from raysim's own functions) instead of pfl's defaults: the initial weights; the user sampler,
which yields raysim's cohorts in order (each "user id" is a (round, client) pair, so that the user's dataset can be
made for that job); and each job's seed, which orders the user's samples as raysim's worker does and seeds torch's
global generator (dropout) just before the user trains (pfl makes a user's dataset right before training it).
pfl evaluates the first cohort before and after local training (its iteration 0 is an evaluation iteration
whatever ``evaluation_frequency`` is); the others do not train differently for it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from workloads import WORKLOADS, build_net, job_order, make_data

torch.set_num_threads(1)  # one CPU per process, as each raysim worker has (pfl.py exports OMP_NUM_THREADS=1 too)

from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402 - after the thread count, before pfl's ops start
from pfl.aggregate.weighting import WeightByDatapoints  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.callback.central_evaluation import CentralEvaluationCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402

EVAL_BATCH = 10000  # pfl's benchmark config: central_eval_batch_size


def loss(self: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:  # noqa: A002
    """pfl's image_classification_loss: mean cross-entropy."""
    self.eval() if eval else self.train()
    return F.cross_entropy(self(x), y)


@torch.no_grad()
def metrics(self: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:  # noqa: A002
    """pfl's image_classification_metrics: summed loss and correct predictions, weighted by samples."""
    self.eval() if eval else self.train()
    logits = self(x)
    return {"loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), len(x)),
            "accuracy": Weighted((logits.argmax(-1) == y).float().sum().item(), len(x))}


class FinalCentralEvaluation(CentralEvaluationCallback):
    """pfl's central evaluation once, on the final model (``frequency`` = the last iteration's index), not also
    before training; raysim and the plain loop evaluate once, after the last round."""

    def on_train_begin(self, *, model: Any) -> Metrics:
        return Metrics()


class RoundClock(TrainingProcessCallback):
    """The wall-clock time at the end of every central iteration, and the final accuracy; rank 0 writes them."""

    def __init__(self, out_path: str, rounds: int):
        self.out_path, self.rounds = out_path, rounds
        self.round_ends: list[float] = []
        self.acc: float | None = None

    def after_central_iteration(self, aggregate_metrics: Metrics, model: Any, *,
                                central_iteration: int) -> tuple[bool, Metrics]:
        self.round_ends.append(time.time())
        for name, value in aggregate_metrics:
            if str(name) == "Central val | accuracy":
                self.acc = float(value.overall_value)
        return False, Metrics()

    def on_train_end(self, *, model: Any) -> None:
        if int(os.environ.get("RANK", "0")) == 0:
            with open(self.out_path, "w") as fh:
                json.dump({"round_ends": self.round_ends, "acc": self.acc,
                           "world_size": int(os.environ.get("WORLD_SIZE", "1"))}, fh)


def main() -> None:
    b = torch.load(os.environ["PFL_BENCH_BUNDLE"], weights_only=False)
    torch.random.manual_seed(b["seed"])  # as pfl's train.py does: pfl's own random states agree on every process
    np.random.seed(b["seed"])
    name, rounds = b["workload"], len(b["cohorts"])
    per = WORKLOADS[name].per_client
    x_np, y_np = make_data(name, b["seed"], b["clients"])
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    n_train = b["clients"] * per
    seeds = {(rnd, cid): s for rnd, (cohort, ss) in enumerate(zip(b["cohorts"], b["seeds"]), 1)
             for cid, s in zip(cohort, ss)}

    def make_user(job: tuple[int, int]) -> Dataset:
        """One (round, client) job's dataset, in raysim's sample order; seeds the dropout draws of its training."""
        rnd, cid = job
        seed = seeds[job]
        torch.default_generator.manual_seed(seed)  # CPU only: torch.manual_seed costs ~1 ms a call without CUDA
        order = job_order(per, seed)
        rows = slice(cid * per, (cid + 1) * per)
        return Dataset((x[rows][order], y[rows][order]), user_id=str(cid))

    def jobs() -> Iterator[tuple[int, int]]:
        for rnd, cohort in enumerate(b["cohorts"], 1):
            for cid in cohort:
                yield rnd, cid

    stream = jobs()
    training_data = FederatedDataset(make_user, lambda: next(stream))
    central_data = Dataset((x[n_train:], y[n_train:]))

    net = build_net(name)
    net.load_state_dict(b["initial_state"])
    net.loss = types.MethodType(loss, net)
    net.metrics = types.MethodType(metrics, net)
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), 1.0))
    backend = SimulatedBackend(training_data=training_data, val_data=None, postprocessors=[WeightByDatapoints()])
    params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds,
                               train_cohort_size=len(b["cohorts"][0]), val_cohort_size=0)
    train_params = NNTrainHyperParams(local_learning_rate=b["lr"], local_num_epochs=b["local_epochs"],
                                      local_batch_size=b["batch_size"])
    eval_params = NNEvalHyperParams(local_batch_size=EVAL_BATCH)
    callbacks = [FinalCentralEvaluation(central_data, eval_params, frequency=max(1, rounds - 1)),
                 RoundClock(os.environ["PFL_BENCH_OUT"], rounds)]
    FederatedAveraging().run(algorithm_params=params, backend=backend, model=model, model_train_params=train_params,
                             model_eval_params=eval_params, callbacks=callbacks)
    # pfl 0.6.0 with 2 processes finishes every round and its evaluation, then aborts in C++ teardown at exit
    # ("terminate called without an active exception", SIGABRT) in most runs here, even after
    # destroy_process_group(); the work is done and flushed by then, so leave without the static destructors
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
