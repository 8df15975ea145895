"""The driver's share of aggregation per round: every upload to the driver against sums taken where clients trained.

    .venv/bin/python benchmarks/aggregation.py [--clients 50] [--models cnn,resnet18] [--repeats 5] [--no-wait]

What the driver does with a round of FedAvg uploads, timed in one process (no Ray: what is timed is the driver's own
work, which Ray's transfers only add to): each object deserialised (pickle 5 with raysim's tensor reducer, as from
Ray's object store), then averaged.

- ``per-tensor``: the driver's aggregation before issue 30: Σ_i u_i·(n_i/Σn), one Python loop per tensor.
- ``flat``: the same formula on one flat buffer per upload (``raysim.algorithms.base.weighted_average`` now, for
  algorithms that need every upload).
- ``partial``: what the driver does when a weighted-sum algorithm's uploads are summed where the clients trained
  (``raysim.algorithms.aggregation``): ``engine.sum_group=auto`` groups (at most 32), one float64 sum each to
  deserialise
  and add. The workers' share (flattening and adding their clients' uploads) is reported beside it: it runs in
  parallel on the workers, while the clients of the next group train.

Models: ``cnn`` has the size of pfl's CIFAR-10 CNN (1.7 M parameters, 10 tensors), ``resnet18`` is raysim's
ResNet-18 (11.2 M parameters, 124 tensors with batch-norm buffers).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import fmt, machine_info, save_json, summary, wait_quiet  # noqa: E402


def pfl_cnn_shapes() -> dict[str, tuple[int, ...]]:
    """Parameter shapes of a CIFAR-10 CNN of pfl's size (three 3x3 convolutions and two dense layers, 1.7 M
    parameters in 10 tensors): what the driver's work depends on is the size and the tensor count, not the network."""
    return {"c1.weight": (32, 3, 3, 3), "c1.bias": (32,), "c2.weight": (64, 32, 3, 3), "c2.bias": (64,),
            "c3.weight": (64, 64, 3, 3), "c3.bias": (64,), "d1.weight": (512, 3136), "d1.bias": (512,),
            "d2.weight": (10, 512), "d2.bias": (10,)}


def model_state(name: str) -> dict:
    import torch

    if name == "cnn":
        g = torch.Generator().manual_seed(0)
        return {k: torch.randn(s, generator=g) for k, s in pfl_cnn_shapes().items()}
    from raysim.config import load_config
    from raysim.models import build_model

    cfg = load_config(None, [f"model.name={name}"])
    return {k: v.detach().clone() for k, v in build_model(cfg, name, (3, 32, 32), 10).state_dict().items()}


def per_tensor_average(uploads: list[dict], weights: list[float]) -> dict:
    """The driver's weighted average as it was before issue 30 (one Python loop per tensor)."""
    import torch

    total = float(sum(weights))
    out = {}
    for key, first in uploads[0].items():
        acc = torch.zeros_like(first, dtype=torch.float64)
        for upload, w in zip(uploads, weights):
            acc.add_(upload[key].to(torch.float64), alpha=w / total)
        out[key] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return summary(times)


def measure(model: str, clients: int, repeats: int) -> dict[str, Any]:
    import ray.cloudpickle as cloudpickle
    import torch

    from raysim.algorithms.base import weighted_average
    from raysim.engine.jobs import TrainResult
    from raysim.algorithms.aggregation import UploadSum, fixed_groups

    def merged(sums):
        out = UploadSum()
        for total in sums:
            out.merge(total)
        return out
    from raysim.engine.plan import group_size
    from raysim.engine.worker import enable_fast_tensor_serialization

    torch.set_num_threads(1)  # the driver works on one thread
    enable_fast_tensor_serialization()
    base = model_state(model)
    g = torch.Generator().manual_seed(1)
    uploads = [{k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
                for k, v in base.items()} for _ in range(clients)]
    weights = [float(100 + 7 * i) for i in range(clients)]
    blobs = [cloudpickle.dumps(u, protocol=5) for u in uploads]
    size = group_size("auto", clients)
    groups = fixed_groups(range(clients), size)

    def worker_sums() -> list:
        return [UploadSum().add_results([TrainResult(c, 1, uploads[c], int(weights[c]), True, 0.0) for c in grp])
                for grp in groups]

    sums = worker_sums()
    sum_blobs = [cloudpickle.dumps(s, protocol=5) for s in sums]
    out = {"model": model, "parameters": sum(v.numel() for v in base.values()), "tensors": len(base),
           "clients": clients, "groups": len(groups), "group_size": size,
           "upload_mb": len(blobs[0]) / 1e6, "sum_mb": len(sum_blobs[0]) / 1e6}  # as pickled for the store
    out["per_tensor_s"] = timed(lambda: per_tensor_average([pickle.loads(b) for b in blobs], weights), repeats)
    out["flat_s"] = timed(lambda: weighted_average([pickle.loads(b) for b in blobs], weights), repeats)
    out["partial_driver_s"] = timed(lambda: merged(pickle.loads(b) for b in sum_blobs).mean(), repeats)
    out["partial_workers_s"] = timed(worker_sums, repeats)  # spread over the workers in a run
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--models", default="cnn,resnet18")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-wait", action="store_true")
    args = p.parse_args(argv)
    info = machine_info()
    print(f"[aggregation] {info}", flush=True)
    results = []
    for model in args.models.split(","):
        wait_quiet(enabled=not args.no_wait)
        r = measure(model, args.clients, args.repeats)
        results.append(r)
        print(f"[aggregation] {model} ({r['parameters'] / 1e6:.1f} M parameters, {r['tensors']} tensors), "
              f"{args.clients} clients, {r['groups']} groups of {r['group_size']}: driver s/round per-tensor "
              f"{fmt(r['per_tensor_s'])}, flat {fmt(r['flat_s'])}, partial {fmt(r['partial_driver_s'])}; workers' "
              f"sums {fmt(r['partial_workers_s'])} in all", flush=True)
    path = save_json("aggregation", {"machine": info, "args": vars(args), "results": results})
    print(f"[aggregation] results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
