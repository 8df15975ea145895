"""A test-only algorithm: FedAvg whose clients run out of GPU memory, with torch's own error and words, in round
``$RAYSIM_TEST_OOM_ROUND`` (default 2; 0: never). Ray's workers read the variable as it was when Ray started."""

from __future__ import annotations

import os

import torch

from raysim.algorithms.fedavg import FedAvg
from raysim.registry import register_algorithm

MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
           "1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use.")


@register_algorithm("oom")
class OutOfMemoryFedAvg(FedAvg):
    def client_loss(self, model, x, y, ctx):
        if ctx.round == int(os.environ.get("RAYSIM_TEST_OOM_ROUND", "2")):
            raise torch.OutOfMemoryError(MESSAGE)
        return super().client_loss(model, x, y, ctx)
