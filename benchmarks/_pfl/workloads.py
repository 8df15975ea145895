"""The two workloads of benchmarks/pfl.py, in plain numpy and torch, so that every engine computes the same thing.

raysim (through the ``bench_data`` plugin), pfl (``pfl_app.py``, in its own environment, which has no raysim) and
the plain serial loop (``plain_loop.py``) all build their data and network from this file:

- ``tiny``: 1,000 clients of 50 samples (64 features, 10 classes: Gaussian class blobs), an MLP 64 -> 32 -> 10,
  100 clients a round, SGD at batch size 10, 1 local epoch, 30 rounds;
- ``cnn``: 1,000 clients of 50 CIFAR-10-shaped images (3x32x32, 10 classes: class patterns under Gaussian noise),
  the CNN of pfl's CIFAR-10 benchmark (``simple_cnn`` of pfl-research's benchmarks/model/pytorch/cnn.py: two 3x3
  convolutions, max-pooling, dropout, a 128-unit dense layer; 1.63 M parameters), 50 clients a round, 5 rounds.

Client ``c`` holds training rows ``[c * 50, (c + 1) * 50)``; the test set (``TEST_SAMPLES`` rows from the same
distribution) is held centrally, as pfl's central evaluation holds it (raysim: the official test split).
The initial weights, the sampled cohorts and the per-(client, round) job seeds come from raysim's own functions,
written once into a bundle by benchmarks/pfl.py: this file only draws data and builds the network's layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

NUM_CLASSES = 10
TEST_SAMPLES = 2000
_CHUNK = 4096  # rows per block when adding class patterns, so no second copy of the whole array is made


@dataclass(frozen=True)
class Workload:
    input_shape: tuple[int, ...]
    clients: int  # virtual clients
    per_client: int  # training samples per client
    cohort: int  # clients sampled per round
    rounds: int
    lr: float  # local SGD learning rate (no momentum, no weight decay); the server applies the plain average
    batch_size: int
    local_epochs: int
    signal: float  # scale of the class patterns against unit noise: the final accuracy stays well off 1.0


# learning rates: pfl's CIFAR-10 benchmark config (local_learning_rate 0.1). The signals were set so that the full
# workloads end in mid accuracy, where a difference in computation would show (a hand-written FedAvg reached about
# 0.63 on tiny after 30 rounds and 0.47 on cnn after 5)
WORKLOADS: dict[str, Workload] = {
    "tiny": Workload(input_shape=(64,), clients=1000, per_client=50, cohort=100, rounds=30, lr=0.1,
                     batch_size=10, local_epochs=1, signal=0.25),
    "cnn": Workload(input_shape=(3, 32, 32), clients=1000, per_client=50, cohort=50, rounds=5, lr=0.1,
                    batch_size=10, local_epochs=1, signal=0.5),
}


def make_data(name: str, seed: int, clients: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): float32 inputs and int64 labels, a pure function of (name, seed, clients). The first
    ``clients * per_client`` rows are the clients' training rows, the last ``TEST_SAMPLES`` the test set.

    Each class has a fixed random pattern (standard normal, times ``signal``); a sample is its class's pattern
    plus standard normal noise.
    """
    w = WORKLOADS[name]
    n_train = clients * w.per_client
    n = n_train + TEST_SAMPLES
    dim = int(np.prod(w.input_shape))
    rng = np.random.default_rng([seed, 0x9F1])
    patterns = rng.standard_normal((NUM_CLASSES, dim), dtype=np.float32) * np.float32(w.signal)
    y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int64)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    for start in range(0, n, _CHUNK):
        x[start:start + _CHUNK] += patterns[y[start:start + _CHUNK]]
    return x.reshape((n, *w.input_shape)), y


def pfl_cnn_backbone(input_shape: tuple[int, ...]) -> nn.Sequential:
    """pfl's ``simple_cnn`` up to its last hidden layer (128 features), on channels-first input (raysim's layout;
    pfl's version starts with a transpose from channels-last). Glorot-uniform weights, as pfl initialises them."""
    channels, side = input_shape[0], input_shape[1]
    pooled = (side - 4) // 2
    body = nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=3), nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
        nn.Linear(pooled * pooled * 64, 128), nn.ReLU(), nn.Dropout(0.5),
    )
    for m in body.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    return body


CNN_FEATURES = 128  # pfl_cnn_backbone's output width: raysim's model.feature_dim for the cnn workload
MLP_HIDDEN = 32  # the tiny MLP's hidden width: raysim's mlp with model.hidden=[] and model.feature_dim=32


class Net(nn.Module):
    """A backbone and a linear head, with raysim's parameter names (``backbone.*``, ``head.*``), so that the initial
    weights raysim builds load into it unchanged (``load_state_dict`` is strict: a different layout fails)."""

    def __init__(self, backbone: nn.Module, features: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(features, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def build_net(name: str) -> Net:
    """The workload's network (weights to be loaded from the bundle)."""
    w = WORKLOADS[name]
    if name == "cnn":
        return Net(pfl_cnn_backbone(w.input_shape), CNN_FEATURES)
    dim = int(np.prod(w.input_shape))
    return Net(nn.Sequential(nn.Flatten(), nn.Linear(dim, MLP_HIDDEN), nn.ReLU()), MLP_HIDDEN)


def job_order(n: int, seed: int) -> torch.Tensor:
    """A job's sample order, as raysim's worker draws it for one epoch: ``randperm`` from a generator seeded with the
    job seed. (raysim also seeds torch's global generator with it, which dropout draws from.)"""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def batch_starts(n: int, batch_size: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) batches; raysim's batch policy (a trailing one-sample batch joins the one before)
    gives the same cut for every size used here, which the bundle's writer checks."""
    return [(b, min(b + batch_size, n)) for b in range(0, n, batch_size)]
