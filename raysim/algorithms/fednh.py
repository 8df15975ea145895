"""FedNH (Dai et al., AAAI 2023): a classifier of fixed, uniformly spread class prototypes that the server slowly
infuses with class semantics.

Paper: Y. Dai, Z. Chen, J. Li, S. Heinecke, L. Sun, R. Xu, "Tackling Data Heterogeneity in Federated Learning with
Class Prototypes", AAAI 2023 (arXiv:2212.02758), Algorithm 1. Authors' code: github.com/Yutong-Dai/FedNH
(``src/flbase/strategies/FedNH.py`` ``FedNHClient._estimate_prototype`` and ``FedNHServer.aggregate``;
``src/flbase/strategies/FedUH.py`` ``FedUHClient._initialize_model`` (prototype init, frozen prototypes, scaling)
and ``training`` (gradient clipping); ``src/flbase/models/CNN.py`` ``Conv2CifarNH`` (the cosine classifier);
``main.py`` and ``experiments/Cifar10_Conv2Cifar.yaml`` (defaults)).

Model (``adapt_model``): the head becomes ``PrototypeHead``: rows W_c of a [classes, feature_dim] matrix of unit
norm (``head.prototype``, a buffer: never trained by a client) and a scalar s (``head.scale``),

    logits_c(x) = s · <f(x)/‖f(x)‖, W_c>        (f = the backbone; ‖W_c‖ = 1, so this is s · cos(f(x), W_c))

Client k in round t loads the global body θ^t, s^t and W^t, and minimises plain cross-entropy over its data,

    min_{θ, s}  (1/n_k) Σ_i CE(logits(x_i; θ, s, W^t), y_i)          (W^t fixed)

with SGD, clipping the gradient norm of the trained parameters to ``clip_grad`` (10) before each step
(``clip_grad_norm``, applied by the worker). It then uploads θ, s and, for every class c it holds (n_kc samples),
the count-scaled normalised class mean of its normalised features on the trained model (eval mode):

    μ_kc = n_kc · normalize( (1/n_kc) Σ_{i: y_i = c} f(x_i)/‖f(x_i)‖ )        (0 for absent classes), and n_kc.

Server: θ^{t+1}, s^{t+1} = FedAvg of the clients' θ, s (weighted by training samples); for every class c

    μ_c = normalize( Σ_k μ_kc / Σ_k n_kc ),      W_c^{t+1} = normalize( ρ · W_c^t + (1 − ρ) · μ_c )

(a class no participant holds has μ_c = 0 and keeps W_c^t). ``smooth_prototypes`` is this computation.

Defaults and where they come from:

* ``rho`` = 0.9: the smoothing ρ (``main.py --FedNH_smoothing 0.9``; the paper's choice).
* Initial prototypes: the authors' ``FedNH_head_init: orthogonal``: ``torch.nn.init.orthogonal_`` on a [classes, d]
  matrix, i.e. a random orthogonal frame whose rows are unit vectors spread uniformly on the sphere and mutually
  orthogonal (the paper's "uniformly distributed" prototypes). Rows are renormalised, which changes nothing when
  classes ≤ d and makes them unit vectors when classes > d (orthogonal_ then gives orthonormal columns).
  Drawn under the model's seeded RNG, so every client and the server start from the same W.
* ``learn_scale`` = true: the authors' default (``FedNH_fix_scaling: False``): s is an ``nn.Parameter`` trained by the
  clients and averaged with the body. ``scale`` = 30 is its starting value: the value the authors' code names as the
  paper's ("30.0 is a common choice in the paper", ``FedUH.py``) and the one it uses with ``FedNH_fix_scaling:
  True`` (``learn_scale: false`` here); their own models start a learned s at 1.0 (``Conv2CifarNH``) or 20.0
  (``ResNetModNH``): ``algorithm.scale=1.0`` is the authors' choice for their CNN.
* ``clip_grad`` = 10: ``torch.nn.utils.clip_grad_norm_(..., max_norm=10)`` in ``FedUHClient.training`` (0: off).
* ``body_average`` = samples: the body and s are averaged as raysim's FedAvg, weighted by training samples (the
  paper's Algorithm 1, and the table's fedavg row). ``uniform`` is the authors' code: ``FedNHServer.aggregate``
  adds server_lr / num_participants times the summed updates (server_lr 1), an unweighted mean over participants.
* Variants not reproduced: the "adv" prototype aggregation (``FedNH_{client,server}_adv_prototype_agg``, off by
  default).

Evaluation: the global model (θ, s, W after the round) on each client's test split, so ``acc_global`` is the global
model's pooled accuracy and ``acc_mean`` its mean per-client accuracy (FedNH's generic model; the paper's
personalised figures use each client's locally trained model, which raysim does not keep).

Logged per round: ``scale``, the global s after aggregation.

Bytes: up = the body + s (float32) + the [classes, d] float32 scaled prototypes + [classes] int32 counts; down = the
global body, s and W.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import (Algorithm, eval_features, ClientContext, ClientUpdate,
                                    split_state, weighted_average)
from raysim.algorithms.configs.fednh import FedNHConfig
from raysim.registry import register_algorithm

PROTO_KEY = "head.prototype"
SCALE_KEY = "head.scale"
_CHUNK = 1024  # samples per forward pass when estimating prototypes


# ---------------------------------------------------------------------------------------------- the math
def client_prototypes(features: torch.Tensor, labels: torch.Tensor,
                      num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's upload (``_estimate_prototype``): per class c, n_c · normalize(mean of f/‖f‖ over class c)
    as [classes, d] float32 (zero rows for absent classes), and the counts n_c as [classes] int32. Computed in
    float64 on the CPU, so the result does not depend on the device's reduction order."""
    feats = F.normalize(features.detach().to("cpu", torch.float64), dim=1, eps=1e-12)
    labels = labels.detach().to("cpu", torch.long)
    sums = torch.zeros(num_classes, feats.shape[1], dtype=torch.float64).index_add_(0, labels, feats)
    counts = torch.bincount(labels, minlength=num_classes)
    means = sums / counts.clamp(min=1)[:, None]
    scaled = F.normalize(means, dim=1, eps=1e-12) * counts[:, None]
    return scaled.float(), counts.to(torch.int32)


def smooth_prototypes(prototypes: torch.Tensor, uploads: list[tuple[torch.Tensor, torch.Tensor]],
                      rho: float) -> torch.Tensor:
    """The server's update (``FedNHServer.aggregate``): μ_c = normalize(Σ_k scaled_kc / Σ_k n_kc), then
    W_c ← normalize(ρ W_c + (1 − ρ) μ_c); a class nobody holds keeps W_c. Accumulated in float64 in the given
    (client-id) order; returns float32 [classes, d]."""
    w = prototypes.to(torch.float64)
    sums = torch.zeros_like(w)
    total = torch.zeros(len(w), dtype=torch.float64)
    for scaled, counts in uploads:
        sums += scaled.to(torch.float64)
        total += counts.to(torch.float64)
    mean = F.normalize(sums / total.clamp(min=1e-12)[:, None], dim=1, eps=1e-12)  # 0 rows stay 0
    return F.normalize(rho * w + (1.0 - rho) * mean, dim=1, eps=1e-12).to(prototypes.dtype)


class PrototypeHead(nn.Module):
    """s · cos(f, W_c) for every class: unit-norm prototypes W (a buffer, never trained locally) and a scale s."""

    def __init__(self, feature_dim: int, num_classes: int, scale: float, learn_scale: bool):
        super().__init__()
        self.in_features, self.out_features = feature_dim, num_classes
        w = torch.nn.init.orthogonal_(torch.empty(num_classes, feature_dim))  # FedNH_head_init: orthogonal
        self.register_buffer("prototype", F.normalize(w, dim=1, eps=1e-12))
        s = torch.tensor([float(scale)])
        if learn_scale:
            self.scale = nn.Parameter(s)
        else:
            self.register_buffer("scale", s)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.scale * F.normalize(features, dim=1, eps=1e-12) @ self.prototype.t()


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("fednh")
class FedNH(Algorithm):
    """Fixed-norm class prototypes as the classifier, smoothed on the server from uploaded class means."""

    Config = FedNHConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "all"  # body, s and W travel down; body and s come back averaged, W is the server's

    @property
    def clip_grad_norm(self) -> Optional[float]:
        return float(self.config.clip_grad) if self.config.clip_grad > 0 else None

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model.head = PrototypeHead(model.head.in_features, model.head.out_features, self.config.scale,
                                   self.config.learn_scale)
        return model

    # ------------------------------------------------------------------ driver side
    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        if self.config.body_average == "uniform":
            model = weighted_average([u.upload["model"] for u in updates], [1.0] * len(updates))
        else:
            model = weighted_average([u.upload["model"] for u in updates],
                                     [float(u.num_samples) for u in updates])
        model[PROTO_KEY] = smooth_prototypes(server_state["model"][PROTO_KEY],
                                             [(u.upload["protos"], u.upload["counts"]) for u in updates],
                                             self.config.rho)
        server_state["model"] = model
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        return {"scale": float(server_state["model"][SCALE_KEY].reshape(-1)[0])}

    # ------------------------------------------------------------------ client side
    @torch.no_grad()
    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        """The trained body and s, and this client's count-scaled prototypes from its whole training split."""
        x, y, _ = ctx.train_data
        feats = eval_features(model, x, _CHUNK)
        protos, counts = client_prototypes(feats, y, ctx.num_classes)
        return {"model": split_state(model, lambda k: k != PROTO_KEY), "protos": protos, "counts": counts}
