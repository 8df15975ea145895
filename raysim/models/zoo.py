"""The seed papers' image backbones from torchvision (built with ``weights=None``: nothing is downloaded), adapted
to small inputs, plus per-client random MLPs for UNIDEAL-HETE on tables.

Every backbone maps ``[C, H, W]`` (any channel count) to a ``model.feature_dim`` vector, through a linear adapter
where the network's natural width differs, so heads stay shape-compatible across architectures. Inputs up to 64 px
get the CIFAR-style stem (3x3 stride-1 first convolution, no stem max-pool), which keeps enough spatial
resolution for 28-32 px digits; larger inputs keep the ImageNet stem.

ResNets, MobileNetV2 and the HETE MLPs expose stage features (``ClassifierModel.stage_features``): ResNet's stem
(conv1+bn1) and ``layer1``..``layer4``, each before its final ReLU and averaged over space (FedRCL's five levels);
MobileNetV2's last block per resolution and its final convolution; every Linear layer of an MLP. MobileNetV3 and VGG
expose none.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision import models as tvm
from torchvision.models.resnet import BasicBlock, ResNet

from raysim.errors import UserError
from raysim.models import StagedSequential, pooled
from raysim.models.small import staged_mlp
from raysim.registry import register_model

SMALL_INPUT = 64  # largest side that still gets the small-input stem
HETE_WIDTHS = (32, 64, 128, 256)  # hidden widths mlp_hete draws from
HETE_DEPTHS = (1, 2, 3)  # hidden layer counts mlp_hete draws from


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise UserError(f"config key 'model.name': {name} needs image inputs [C, H, W], got shape {input_shape}")
    return input_shape  # type: ignore[return-value]


def _with_adapter(body: nn.Module, natural: int, feature_dim: int) -> nn.Module:
    """``body`` ends in a flat ``natural``-wide vector; add a linear map to ``feature_dim`` when they differ (a staged
    body keeps its stages through the adapter)."""
    if natural == feature_dim:
        return body
    wrap = StagedSequential if hasattr(body, "forward_stages") else nn.Sequential
    return wrap(body, nn.Linear(natural, feature_dim))


def _pre_relu(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A torchvision BasicBlock/Bottleneck's output before its final ReLU (its forward is ReLU of this)."""
    identity = x if block.downsample is None else block.downsample(x)
    out = block.relu(block.bn1(block.conv1(x)))
    out = block.bn2(block.conv2(out))
    if hasattr(block, "conv3"):
        out = block.bn3(block.conv3(block.relu(out)))
    return out + identity


class StagedResNet(ResNet):
    """torchvision's ResNet (same construction, parameters and forward) with ``forward_stages``: the stem and the four
    layers, each before its final ReLU, averaged over space."""

    def forward_stages(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = self.bn1(self.conv1(x))
        stages = [pooled(out)]
        out = self.maxpool(F.relu(out))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in layer[:-1]:
                out = block(out)
            out = _pre_relu(layer[-1], out)
            stages.append(pooled(out))
            out = F.relu(out)
        return self.fc(torch.flatten(self.avgpool(out), 1)), stages


def _resnet(name: str, net: ResNet, input_shape: tuple[int, ...], feature_dim: int) -> nn.Module:
    channels, h, w = _image_shape(name, input_shape)
    if min(h, w) <= SMALL_INPUT:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    else:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    natural = net.fc.in_features
    net.fc = nn.Identity()  # torchvision's forward ends with avgpool -> flatten -> fc
    return _with_adapter(net, natural, feature_dim)


@register_model("resnet18")
def resnet18(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """torchvision's ResNet-18, stem adapted to small inputs."""
    # = tvm.resnet18(weights=None), which builds ResNet(BasicBlock, [2, 2, 2, 2]): same draws, same weights
    return _resnet("resnet18", StagedResNet(BasicBlock, [2, 2, 2, 2]), input_shape, cfg.feature_dim)


@register_model("resnet10")
def resnet10(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """ResNet-18's layout with one BasicBlock per stage (FAPD's configs)."""
    return _resnet("resnet10", StagedResNet(BasicBlock, [1, 1, 1, 1]), input_shape, cfg.feature_dim)


resnet18.stages = resnet10.stages = True  # type: ignore[attr-defined]


@register_model("mobilenet_v3_small")
def mobilenet_v3_small(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """torchvision's MobileNetV3-Small, stem adapted to small inputs."""
    channels, h, w = _image_shape("mobilenet_v3_small", input_shape)
    net = tvm.mobilenet_v3_small(weights=None)
    stem = net.features[0][0]
    net.features[0][0] = nn.Conv2d(channels, stem.out_channels, kernel_size=3,
                                   stride=1 if min(h, w) <= SMALL_INPUT else 2, padding=1, bias=False)
    natural = net.classifier[0].in_features  # 576: the last feature map's channels, before the classifier MLP
    return _with_adapter(nn.Sequential(net.features, net.avgpool, nn.Flatten()), natural, cfg.feature_dim)


@register_model("mobilenet_v2")
def mobilenet_v2(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """torchvision's MobileNetV2 (weights=None), stem adapted to small inputs: a stride-1 first convolution up to
    64 px keeps a 32 px image at 4x4 before the final pooling (Tiny-ImageNet's 64 px: 8x8). Stages (FedRCL): the
    last block of each resolution (16, 24, 32, 96 channels; linear bottlenecks, so no ReLU to strip) and the final
    1x1 convolution (1280)."""
    channels, h, w = _image_shape("mobilenet_v2", input_shape)
    net = tvm.mobilenet_v2(weights=None)
    stem = net.features[0][0]
    net.features[0][0] = nn.Conv2d(channels, stem.out_channels, kernel_size=3,
                                   stride=1 if min(h, w) <= SMALL_INPUT else 2, padding=1, bias=False)
    body = StagedSequential(*net.features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), taps=(1, 3, 6, 13, 18))
    return _with_adapter(body, net.last_channel, cfg.feature_dim)  # 1280 -> model.feature_dim


mobilenet_v2.stages = True  # type: ignore[attr-defined]


@register_model("vgg11_bn")
def vgg11_bn(*, input_shape: tuple[int, ...], cfg, **_: object) -> nn.Module:
    """VGG-11 with batch norm; max-pools that would shrink the map below 1x1 are dropped (28 px keeps four)."""
    channels, h, w = _image_shape("vgg11_bn", input_shape)
    features = tvm.vgg11_bn(weights=None).features
    first = features[0]
    features[0] = nn.Conv2d(channels, first.out_channels, kernel_size=3, padding=1)
    side = min(h, w)
    for i, layer in enumerate(features):
        if isinstance(layer, nn.MaxPool2d):
            if side >= 2:
                side //= 2
            else:
                features[i] = nn.Identity()
    body = nn.Sequential(features, nn.AdaptiveAvgPool2d(1), nn.Flatten())  # not 7x7 -> 4096: that is 100M weights
    return _with_adapter(body, 512, cfg.feature_dim)


def hete_widths(seed: int, client_id: int) -> list[int]:
    """The hidden widths of client ``client_id``'s MLP: a reproducible draw from (seed, client id) alone."""
    rng = np.random.default_rng([seed, client_id, 0x4D4C50])
    depth = int(rng.choice(HETE_DEPTHS))
    return [int(rng.choice(HETE_WIDTHS)) for _ in range(depth)]


@register_model("mlp_hete")
def mlp_hete(*, input_shape: tuple[int, ...], cfg, client_id: int, seed: int, **_: object) -> nn.Module:
    """UNIDEAL-HETE on tables: each client's MLP has its own depth and widths, drawn from the seed."""
    return staged_mlp([math.prod(input_shape), *hete_widths(seed, client_id), cfg.feature_dim])


mlp_hete.stages = True  # type: ignore[attr-defined]
mlp_hete.per_client = True  # type: ignore[attr-defined]  # model_key separates clients: one architecture each

# torchvision's batch norm layers mix the samples of a batch: no per-sample gradient for DP-SGD
for _factory in (resnet18, resnet10, mobilenet_v3_small, mobilenet_v2, vgg11_bn):
    _factory.batch_norm = True  # type: ignore[attr-defined]
