"""The Flower side of benchmarks/flower.py; runs inside benchmarks/.flwr-venv (flwr[simulation] 1.42, ray 2.55).

    FLWR_BENCH_BUNDLE=bundle.pt FLWR_BENCH_OUT=out.json python -c "import _flower_app; _flower_app.main()"

The bundle (written by flower.py from raysim's own builders) holds every client's training tensors, the pooled
test set, the initial weights and the hyperparameters; the model class, job seeds and the local loop are raysim's
(imported from the repository root on PYTHONPATH), so both engines compute the same FedAvg. Only the aggregation
differs: Flower averages in float32 in arrival order, raysim in float64 in client-id order.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

torch.set_num_threads(1)  # one CPU per client actor, as each raysim worker has (engine.cpus_per_worker=1)

_BUNDLE: dict | None = None
_MODEL: torch.nn.Module | None = None


def bundle() -> dict:
    """Loaded once per process (each Flower actor keeps it, as a Flower user's client_fn would cache its data)."""
    global _BUNDLE
    if _BUNDLE is None:
        _BUNDLE = torch.load(os.environ["FLWR_BENCH_BUNDLE"], weights_only=False)
    return _BUNDLE


def model() -> torch.nn.Module:
    """raysim's ClassifierModel with the raysim backbone, built once per process."""
    global _MODEL
    if _MODEL is None:
        from raysim.models import ClassifierModel
        from raysim.models.small import cnn, mlp

        b = bundle()
        spec = SimpleNamespace(**b["model_cfg"])
        backbone = {"cnn": cnn, "mlp": mlp}[b["arch"]](input_shape=tuple(b["input_shape"]), cfg=spec)
        _MODEL = ClassifierModel(backbone, spec.feature_dim, b["num_classes"])
    return _MODEL


def local_train(cid: int, rnd: int, state: dict) -> tuple[dict, int, float]:
    """raysim's FedAvg client job (worker.train), step for step."""
    from raysim.engine.core import job_seed
    from raysim.algorithms.training import batch_bounds

    b = bundle()
    seed = job_seed(b["seed"], cid, rnd)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = model()
    net.load_state_dict(state)
    net.train()
    t = b["train"]
    opt = torch.optim.SGD(net.parameters(), lr=t["lr"], momentum=t["momentum"], weight_decay=t["weight_decay"])
    x, y = b["clients"][cid]
    n = len(y)
    loss_sum = torch.zeros((), dtype=torch.float64)
    for _ in range(t["local_epochs"]):
        order = torch.randperm(n, generator=gen)
        for s, e in batch_bounds(n, t["batch_size"]):
            bi = order[s:e]
            loss = F.cross_entropy(net(x[bi]), y[bi])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach().double() * len(bi)
    return ({k: v.detach().clone() for k, v in net.state_dict().items()}, n,
            float(loss_sum) / (n * t["local_epochs"]))


def _client_app() -> Any:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        state, n, loss = local_train(cid, rnd, msg.content["arrays"].to_torch_state_dict())
        content = RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": n,
                                                                                     "train_loss": loss})})
        return Message(content=content, reply_to=msg)

    return app


client_app = _client_app()


def _server_app() -> Any:
    from flwr.app import ArrayRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        b = bundle()
        n = len(b["clients"])
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
        t0 = time.perf_counter()
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(b["initial_state"]), num_rounds=b["rounds"])
        rounds_s = time.perf_counter() - t0
        net = model()
        net.load_state_dict(result.arrays.to_torch_state_dict())
        net.eval()
        x, y = b["test"]
        with torch.no_grad():
            acc = float((net(x).argmax(1) == y).float().mean())
        losses = {int(r): float(m["train_loss"]) for r, m in result.train_metrics_clientapp.items()}
        out = {"rounds_s": rounds_s, "acc_global": acc, "losses": losses}
        with open(os.environ["FLWR_BENCH_OUT"], "w") as fh:
            json.dump(out, fh)

    return app


def main() -> None:
    from flwr.simulation import run_simulation

    b = bundle()
    run_simulation(server_app=_server_app(), client_app=client_app, num_supernodes=len(b["clients"]),
                   backend_config={"client_resources": {"num_cpus": b["cpus_per_client"], "num_gpus": 0.0},
                                   "init_args": {"num_cpus": b["num_cpus"], "include_dashboard": False}})
