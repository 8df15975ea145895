"""Models with an explicit backbone/head split.

Every model is ``ClassifierModel(backbone, head)``: the backbone maps an input to a ``model.feature_dim`` vector and
the head is ``Linear(feature_dim, classes)``. Parameter names therefore start with ``backbone.`` or ``head.``,
which is how algorithms choose what to share.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

HEAD_PREFIX = "head."
BACKBONE_PREFIX = "backbone."


class ClassifierModel(nn.Module):
    def __init__(self, backbone: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def init_seed(seed: int, arch_key: str) -> int:
    """Initial weights depend on the run seed and the architecture only, so every worker builds the same start."""
    return int(np.random.SeedSequence([seed, *arch_key.encode()]).generate_state(1)[0])


def build_model(cfg, arch: str, input_shape: tuple[int, ...], num_classes: int, client_id: int = 0,
                algorithm=None) -> ClassifierModel:
    """Build ``arch`` for one client's input shape with deterministic initial weights; ``algorithm.adapt_model``
    then changes it under the same seeded RNG (so workers and driver build the same model)."""
    from raysim.registry import get_model

    factory = get_model(arch)
    torch.manual_seed(init_seed(cfg.seed, f"{arch}:{input_shape}"))
    backbone = factory(input_shape=input_shape, cfg=cfg.model, client_id=client_id, seed=cfg.seed)
    model = ClassifierModel(backbone, cfg.model.feature_dim, num_classes)
    return algorithm.adapt_model(model) if algorithm is not None else model


def model_key(cfg, data, client_id: int) -> tuple:
    """Clients with equal keys share one model object (and one initial state) inside a worker.

    A factory marked ``per_client = True`` (``mlp_hete``: an architecture drawn per client) gets one key per client.
    """
    from raysim.registry import get_model

    arch = cfg.model.for_client(client_id)
    key = (arch, data.input_shape(client_id))
    return key + (client_id,) if getattr(get_model(arch), "per_client", False) else key
