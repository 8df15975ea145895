"""Small CPU-friendly backbones: an MLP for tables and tiny images, a two-block CNN for images, the same CNN with
batch norm after each convolution and after the feature layer (``cnn_bn``, for FedBN, whose paper's digits model
normalises every layer the same way), LEAF's character LSTM for Shakespeare.

The MLP and the CNNs are ``StagedSequential``s: their stages (``ClassifierModel.stage_features``) are the outputs of
every Linear layer (MLP), and of the two convolutions and the feature layer (CNN; after their batch norm in
``cnn_bn``), before their ReLU."""

from __future__ import annotations

import math

from torch import nn

from raysim.errors import UserError
from raysim.models import StagedSequential
from raysim.registry import register_model


def staged_mlp(widths: list[int]) -> nn.Module:
    """Flatten, then Linear + ReLU from each width to the next; every Linear is a stage (for FedKD's hidden states)."""
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return StagedSequential(*layers, taps=tuple(i for i, m in enumerate(layers) if isinstance(m, nn.Linear)))


@register_model("mlp")
def mlp(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """Fully connected: flattened input, model.hidden widths, then model.feature_dim."""
    return staged_mlp([math.prod(input_shape), *cfg.hidden, cfg.feature_dim])


mlp.stages = True  # type: ignore[attr-defined]


@register_model("cnn")
def cnn(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """Small CNN for images (model.width base channels), ending in model.feature_dim."""
    if len(input_shape) != 3:
        raise UserError(f"config key 'model.name': cnn needs image inputs [C, H, W], got shape {input_shape}")
    channels, w = input_shape[0], cfg.width
    return StagedSequential(
        nn.Conv2d(channels, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(2 * w * 16, cfg.feature_dim), nn.ReLU(),
        taps=(0, 3, 7),  # conv1, conv2, the feature layer
    )


cnn.stages = True  # type: ignore[attr-defined]


class CharLSTM(nn.Module):
    """Character indices [B, T] -> an embedding per character -> a stacked LSTM -> its output at the last step."""

    def __init__(self, vocab: int, embedding: int, hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)

    def forward(self, x):
        out, _ = self.lstm(self.embed(x.long()))  # the data layer hands indices over as floats
        return out[:, -1, :]


@register_model("char_lstm")
def char_lstm(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """LEAF's Shakespeare model (Caldas et al. 2018, models/shakespeare/stacked_lstm.py): 8-d embeddings of its 80
    characters, two stacked LSTM layers of model.feature_dim units (LEAF: 256), the last step's output as the
    feature; the head maps it to the next character."""
    from raysim.data.leaf import LETTERS

    if len(input_shape) != 1:
        raise UserError(f"config key 'model.name': char_lstm needs character sequences [T], got shape {input_shape}")
    return CharLSTM(vocab=len(LETTERS), embedding=8, hidden=cfg.feature_dim, layers=2)


@register_model("cnn_bn")
def cnn_bn(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """Small CNN with batch norm after both convolutions and the feature layer (FedBN's DigitModel layout).

    ``cnn`` otherwise: model.width base channels, ending in model.feature_dim."""
    if len(input_shape) != 3:
        raise UserError(f"config key 'model.name': cnn_bn needs image inputs [C, H, W], got shape {input_shape}")
    channels, w = input_shape[0], cfg.width
    return StagedSequential(
        nn.Conv2d(channels, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(2 * w * 16, cfg.feature_dim), nn.BatchNorm1d(cfg.feature_dim), nn.ReLU(),
        taps=(1, 5, 10),  # conv1, conv2 and the feature layer, each after its batch norm
    )


cnn_bn.stages = True  # type: ignore[attr-defined]
cnn_bn.batch_norm = True  # type: ignore[attr-defined]  # its layers mix a batch's samples: no DP-SGD
