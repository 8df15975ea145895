"""Models with an explicit backbone/head split.

Every model is ``ClassifierModel(backbone, head)``: the backbone maps an input to a ``model.feature_dim`` vector and
the head is ``Linear(feature_dim, classes)``. Parameter names therefore start with ``backbone.`` or ``head.``,
which is how algorithms choose what to share.

Stage features. ``model.forward_stages(x)`` returns ``(logits, stages)`` in one pass, and ``model.stage_features(x)``
the stages alone: one ``[B, C_s]`` tensor per stage of the backbone, each the stage's output before its final ReLU,
averaged over space for feature maps (what FedRCL's multi-level contrastive loss uses; the logits equal
``model(x)``). Stages: ``mlp``/``mlp_hete``, each Linear layer (hidden layers, then the feature layer); ``cnn`` and
``cnn_bn``, the two convolutions and the feature layer; ``resnet10``/``resnet18``, the stem (conv1+bn1) and
``layer1``..``layer4``; ``mobilenet_v2``, the last block of each resolution and the final 1x1 convolution.
A backbone declares them by having ``forward_stages(x) -> (output, stages)`` (``StagedSequential`` gives a Sequential
one); the factory of such a backbone is marked ``stages = True`` (``has_stages(arch)``). Other models
(``mobilenet_v3_small``, ``vgg11_bn``, or a backbone an algorithm replaced) raise a UserError when asked.
"""

from __future__ import annotations

import torch
from torch import nn

from raysim.errors import UserError
from raysim.models.pooling import deterministic_pooling
from raysim.seeds import derive_seed

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

    def forward_stages(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(logits, per-stage features) in one pass; the logits are ``forward(x)``'s (see the module docstring)."""
        staged = getattr(self.backbone, "forward_stages", None)
        out, stages = staged(x) if staged is not None else (None, [])
        if not stages:
            raise UserError(f"config key 'model.name': this model's backbone ({type(self.backbone).__name__}) exposes "
                            f"no stage features; use one of mlp, mlp_hete, cnn, cnn_bn, resnet10, resnet18, "
                            f"mobilenet_v2")
        return self.head(out), stages

    def stage_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """One ``[B, C_s]`` tensor per backbone stage: its output before the final ReLU, averaged over space."""
        return self.forward_stages(x)[1]


def pooled(x: torch.Tensor) -> torch.Tensor:
    """A stage's output as ``[B, C]``: feature maps averaged over their spatial dimensions, vectors as they are."""
    return x.flatten(2).mean(dim=2) if x.dim() > 2 else x


class StagedSequential(nn.Sequential):
    """``nn.Sequential`` (same parameters, names and forward) that also knows its stages: the outputs of the modules
    at ``taps``, and the stages of any child that has ``forward_stages`` (a wrapped, staged body)."""

    def __init__(self, *modules: nn.Module, taps: tuple[int, ...] = ()):
        super().__init__(*modules)
        self.taps = tuple(taps)

    def forward_stages(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        stages: list[torch.Tensor] = []
        for i, module in enumerate(self):
            staged = getattr(module, "forward_stages", None)
            if staged is not None:
                x, inner = staged(x)
                stages.extend(inner)
            else:
                x = module(x)
            if i in self.taps:
                stages.append(pooled(x))
        return x, stages


def has_stages(arch: str) -> bool:
    """True when ``arch``'s backbone exposes stage features (its factory is marked ``stages = True``)."""
    from raysim.registry import get_model

    return bool(getattr(get_model(arch), "stages", False))


def init_seed(seed: int, arch_key: str) -> int:
    """Initial weights depend on the run seed and the architecture only, so every worker builds the same start."""
    return derive_seed(seed, *arch_key.encode())


def build_model(cfg, arch: str, input_shape: tuple[int, ...], num_classes: int, client_id: int = 0,
                algorithm=None) -> ClassifierModel:
    """Build ``arch`` for one client's input shape with deterministic initial weights; ``algorithm.adapt_model``
    then changes it under the same seeded RNG (so workers and driver build the same model)."""
    from raysim.registry import get_model

    factory = get_model(arch)
    # the CPU generator only (modules are built on the CPU): torch.manual_seed would also reseed every CUDA device
    torch.default_generator.manual_seed(init_seed(cfg.seed, f"{arch}:{input_shape}"))
    backbone = factory(input_shape=input_shape, cfg=cfg.model, client_id=client_id, seed=cfg.seed)
    weights = cfg.model.weights_for(client_id) if hasattr(cfg.model, "weights_for") else None
    if weights:
        load_backbone_weights(backbone, weights, arch, tuple(input_shape))
    model = ClassifierModel(backbone, cfg.model.feature_dim, num_classes)
    # what the model was built for, so that adapt_model can build more modules for it (FedKD's mentor)
    model.input_shape, model.client_id = tuple(input_shape), client_id
    # adaptive pooling that a GPU run with engine.deterministic can train through (raysim.models.pooling)
    return deterministic_pooling(algorithm.adapt_model(model) if algorithm is not None else model)


def load_backbone_weights(backbone: nn.Module, path: str, arch: str, input_shape: tuple[int, ...]) -> None:
    """Load a torchvision-format state dict (``model.weights``) into ``backbone``, or raise a one-line UserError.

    Keys are the backbone's own, or torchvision's (without the ``0.`` of a backbone wrapped in its linear adapter to
    ``model.feature_dim``); keys the backbone lacks (an ImageNet classifier ``fc.*``) are ignored; the adapter may be
    absent from the file (it keeps its initial weights); any other missing key or a shape mismatch is an error."""
    key = "config key 'model.weights'"
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any load failure: one line naming the key
        raise UserError(f"{key}: {path} is not a torch state dict ({type(exc).__name__})") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"{key}: {path} holds no state dict of tensors")
    own = backbone.state_dict()
    mapped = {}
    for k, v in sd.items():
        if k in own:
            mapped[k] = v
        elif f"0.{k}" in own:
            mapped[f"0.{k}"] = v
    if not mapped:
        raise UserError(f"{key}: none of the {len(sd)} keys of {path} is a key of the {arch} backbone "
                        f"(e.g. {next(iter(own), '?')!r})")
    for k, v in mapped.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise UserError(f"{key}: {path}: {k!r} has shape {list(v.shape)}, but {arch} built for input "
                            f"{list(input_shape)} expects {list(own[k].shape)}")
    adapter = (isinstance(backbone, nn.Sequential) and len(backbone) == 2 and isinstance(backbone[1], nn.Linear))
    missing = [k for k in own if k not in mapped and not (adapter and k.startswith("1."))]
    if missing:
        raise UserError(f"{key}: {path} lacks {missing[0]!r}" + (f" and {len(missing) - 1} more keys"
                        if len(missing) > 1 else "") + f" of the {arch} backbone")
    backbone.load_state_dict(mapped, strict=False)


def model_key(cfg, data, client_id: int) -> tuple:
    """Clients with equal keys share one model object (and one initial state) inside a worker.

    A factory marked ``per_client = True`` (``mlp_hete``: an architecture drawn per client) gets one key per client.
    """
    from raysim.registry import get_model

    arch = cfg.model.for_client(client_id)
    key = (arch, data.input_shape(client_id))
    if isinstance(getattr(cfg.model, "weights", None), list) and len(cfg.model.weights) > 1:
        key += (cfg.model.weights_for(client_id),)  # clients with their own pretrained weights
    return key + (client_id,) if getattr(get_model(arch), "per_client", False) else key
