"""Per-sample gradients for DP-SGD (privacy.dpsgd): torch.func's vmap(grad) against Opacus's GradSampleModule.

    .venv/bin/python benchmarks/per_sample_grads.py [--batch 32] [--repeats 20]

For each model, one batch: the per-sample gradients of the cross-entropy of every parameter, by
``raysim.privacy.dpsgd.per_sample_grads`` (what the clients use: ``vmap(grad_and_value)`` of the algorithm's
``client_loss`` through ``functional_call``) and by Opacus 1.6's ``GradSampleModule`` (hooks on each layer, one
forward and backward), and the two compared: the largest absolute difference and the largest relative one over
every gradient entry. Times are medians of ``--repeats`` runs after a warm-up, one torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


def models(in_dim: int = 64, classes: int = 10) -> dict[str, nn.Module]:
    return {
        "mlp 64-32-10": nn.Sequential(nn.Linear(in_dim, 32), nn.ReLU(), nn.Linear(32, classes)),
        "mlp 784-200-200-10": nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                                            nn.Linear(200, classes)),
        "cnn 1x28x28 (2 conv)": nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                              nn.Flatten(), nn.Linear(32 * 7 * 7, classes)),
    }


def inputs(name: str, batch: int) -> torch.Tensor:
    if name.startswith("cnn"):
        return torch.randn(batch, 1, 28, 28)
    return torch.randn(batch, 784 if "784" in name else 64)


def torch_func(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    from raysim.privacy.dpsgd import per_sample_grads

    class Ctx:
        sample_idx = None

    grads, _, _ = per_sample_grads(model, list(model.parameters()),
                                   lambda m, xb, yb, ctx: (F.cross_entropy(m(xb), yb), {}), x, y,
                                   torch.arange(len(y)), Ctx())
    return grads


def opacus(gsm: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    gsm.zero_grad(set_to_none=True)
    for p in gsm.parameters():
        p.grad_sample = None
    # Opacus's loss_reduction="mean" scales grad_sample by the batch: sum the losses to get each sample's own
    F.cross_entropy(gsm(x), y, reduction="sum").backward()
    return [p.grad_sample for p in gsm.parameters()]


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    from opacus import GradSampleModule

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | batch | torch.func ms | Opacus ms | max abs diff | max rel diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, model in models().items():
        torch.manual_seed(0)
        x, y = inputs(name, args.batch), torch.randint(0, 10, (args.batch,))
        import copy

        gsm = GradSampleModule(copy.deepcopy(model), loss_reduction="sum")  # hooks on a copy of its own
        a = torch_func(model, x, y)
        b = opacus(gsm, x, y)
        abs_diff = max(float((u - v).abs().max()) for u, v in zip(a, b))
        rel = max(float(((u - v).abs() / v.abs().clamp(min=1e-6)).max()) for u, v in zip(a, b))
        t_func = timed(lambda m=model, a=x, b=y: torch_func(m, a, b), args.repeats)
        t_opacus = timed(lambda g=gsm, a=x, b=y: opacus(g, a, b), args.repeats)
        print(f"| {name} | {args.batch} | {t_func * 1e3:.2f} | {t_opacus * 1e3:.2f} | {abs_diff:.1e} | {rel:.1e} |")


if __name__ == "__main__":
    main()
