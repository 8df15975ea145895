"""A model plugin with its own config section (``model.resmlp.*``): an MLP of residual blocks.

    raysim run experiments/smoke.yaml plugins=[resmlp] model.name=resmlp model.resmlp.blocks=3
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from raysim import register_model
from raysim.config import ConfigError


@dataclass
class ResMLPConfig:
    width: int = 64  # width of every residual block
    blocks: int = 2  # residual blocks between the input layer and the feature layer
    dropout: float = 0.0  # dropout inside each block

    def validate(self) -> None:
        if self.width < 1 or self.blocks < 0 or not 0.0 <= self.dropout < 1.0:
            raise ConfigError("config key 'model.resmlp': need width >= 1, blocks >= 0, dropout in [0, 1)")


class _Block(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout))

    def forward(self, x):
        return x + self.body(x)


@register_model("resmlp", config=ResMLPConfig)
def resmlp(*, input_shape, cfg, **_):
    """MLP of residual blocks (model.resmlp.width / blocks / dropout); an example plugin with its own keys."""
    opts = cfg.resmlp
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), opts.width), nn.ReLU(),
                         *[_Block(opts.width, opts.dropout) for _ in range(opts.blocks)],
                         nn.Linear(opts.width, cfg.feature_dim), nn.ReLU())
