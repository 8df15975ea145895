"""MOON (Li, He & Song, CVPR 2021): FedAvg plus a model-contrastive loss on a projection of the features.

Paper: Q. Li, B. He, D. Song, "Model-Contrastive Federated Learning", CVPR 2021 (arXiv:2103.16257), Algorithm 1,
Eq. (1)-(3). Authors' code: github.com/QinbinLi/MOON (``model.py`` ``ModelFedCon``; ``main.py``
``train_net_fedcon`` for the loss, the ``alg == 'moon'`` loop for the previous-model pool, ``get_args`` for defaults).

Model (``adapt_model``, as ``ModelFedCon``): backbone h = f(x) (``model.feature_dim`` wide), then a 2-layer
projection head z = l2(ReLU(l1(h))) with l1 = Linear(fd, fd), l2 = Linear(fd, out_dim), then the classifier
l3 = Linear(out_dim, classes) on z. Here the projection joins the backbone (``model.backbone`` = body + l1 + l2, so
``model.features(x)`` returns z, the representation the authors contrast) and ``model.head`` is replaced by
Linear(out_dim, classes). Every layer is averaged, weighted by training samples (FedAvg's hooks).

Client i in round t, from w_i = w^t (the downloaded global model), minimises over each batch

    L = CE(head(z), y) + mu · ℓ_con,
    ℓ_con = −log( exp(cos(z, z_glob)/τ) / (exp(cos(z, z_glob)/τ) + Σ_prev exp(cos(z, z_prev)/τ)) )

(mean over the batch), z = R_{w_i}(x) the live projection, z_glob = R_{w^t}(x) from the frozen global model of this
round (``ctx.payload["model"]``), z_prev = R_{w_i^{t-1}}(x) from the client's own previous local model(s). As in the
authors' code the global and previous models run in eval mode with no gradient, and ℓ_con is a cross-entropy over
the logits [cos(z, z_glob), cos(z, z_prev_1), ...]/τ with label 0 (``torch.nn.CosineSimilarity(dim=-1)``).

* Previous models are per-client state (``client_keep``): stored by the driver, outside the workers, so a killed
  worker loses nothing, and checkpointed with the run. ``model_buffer_size`` (authors' default 1) previous models
  are kept, newest last, first in first out (the authors' ``pool_option='FIFO'``).
* A client's first round. The authors' ``--load_first_net 1`` (default) means to use the initial nets as the first
  previous models, but the copy it makes before round 1 is never appended to the pool, so round 1 has no negative
  (the logits hold the positive alone and ℓ_con = 0), and a party first sampled later contrasts with its own
  never-trained net (``init_nets`` builds one per party). Here a client's previous model before its first training is
  the initial model (the same initial weights as everyone's, ``init_client_state``). In round 1 that model IS the
  global model, so z_prev = z_glob, both logits are equal, and ℓ_con = log 2 with zero gradient (up to rounding):
  training in round 1 is as the authors' (only the logged ``loss_con`` differs from their 0). A client first sampled
  in a later round contrasts with an untrained model, as in the authors' code (there a separately initialised net
  per party, here the shared initial model). The initial model is never kept: after
  its first round a client's pool holds only its own trained models (so for K > 1 the pool grows 1, 2, ... K as
  the authors' does).
* Defaults (``main.py`` ``get_args`` and the paper, Sec. 4.1): τ = 0.5 (``--temperature``), out_dim = 256
  (``--out_dim``), model_buffer_size = 1. mu: the paper uses 5 on CIFAR-10 and 1 on CIFAR-100 (also the authors'
  configs in github.com/adap/flower ``baselines/moon/moon/conf/cifar10.yaml``, ``cifar100.yaml``); the code's
  ``--mu`` default, and this class's, is 1; ``experiments/fapd/cifar10-moon.yaml`` sets 5.
* ``mu: 0`` trains with CE alone and keeps no state (the global and previous models are not even run): FedAvg on
  the ModelFedCon architecture, not on raysim's plain model.

Logged loss parts: ``loss_ce`` and ``loss_con`` (ℓ_con before the factor mu).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext, split_state
from raysim.algorithms.configs.moon import MOONConfig
from raysim.registry import register_algorithm


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prevs: Sequence[torch.Tensor],
                           tau: float) -> torch.Tensor:
    """ℓ_con averaged over the batch: cross-entropy of [cos(z, z_glob), cos(z, z_prev)...]/τ with label 0.

    With no previous representation the logits hold the positive alone and the loss is 0 (the authors' round 1).
    """
    sims = [F.cosine_similarity(z, z_glob, dim=-1)] + [F.cosine_similarity(z, zp, dim=-1) for zp in z_prevs]
    logits = torch.stack(sims, dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class ProjectedBackbone(nn.Module):
    """``ModelFedCon``'s features → l1 → ReLU → l2: the backbone whose output is the projection z."""

    def __init__(self, body: nn.Module, feature_dim: int, out_dim: int):
        super().__init__()
        self.body = body
        self.l1 = nn.Linear(feature_dim, feature_dim)
        self.l2 = nn.Linear(feature_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(F.relu(self.l1(self.body(x))))


def _frozen(model: nn.Module) -> nn.Module:
    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.requires_grad_(False)
        p.grad = None
    return twin.eval()


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


@register_algorithm("moon")
class MOON(Algorithm):
    """Model-contrastive learning: projections pulled to the global model, pushed from the previous local one."""

    Config = MOONConfig
    shared = "all"

    # ------------------------------------------------------------------ model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        feature_dim, num_classes = model.head.in_features, model.head.out_features
        model.backbone = ProjectedBackbone(model.backbone, feature_dim, self.config.out_dim)
        model.head = nn.Linear(self.config.out_dim, num_classes)
        return model

    # ------------------------------------------------------------------ client
    def init_client_state(self, model: nn.Module, ctx: ClientContext) -> dict:
        """Before its first round a client's previous model is the initial model (see the module docstring)."""
        if self.config.mu == 0:
            return {}
        return {"prev": [split_state(model, lambda k: True)], "initial": True}

    @staticmethod
    def _twin(model: nn.Module, slot: int, ctx: ClientContext) -> nn.Module:
        """A frozen copy of ``model``'s architecture, built once per process and slot and reused job after job
        (its weights are loaded anew by every job)."""
        return ctx.once(f"moon.twin.{id(model)}.{slot}", lambda: _frozen(model))

    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """The global model into the model and a frozen twin; the client's previous models into frozen twins
        (``ctx.scratch``: this job's ``glob`` and ``prevs``)."""
        model.load_state_dict(ctx.payload["model"])
        if self.config.mu == 0:
            return
        glob = self._twin(model, 0, ctx)
        glob.load_state_dict(ctx.payload["model"])
        prevs = []
        for i, prev in enumerate(ctx.state.get("prev", [])):
            twin = self._twin(model, i + 1, ctx)
            twin.load_state_dict(prev)
            prevs.append(twin)
        ctx.scratch["glob"], ctx.scratch["prevs"] = glob, prevs

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        z = model.features(x)
        ce = F.cross_entropy(model.head(z), y)
        if "glob" not in ctx.scratch:  # mu == 0
            return ce, {"ce": ce}
        with torch.no_grad():
            z_glob = ctx.scratch["glob"].features(x)
            z_prevs = [prev.features(x) for prev in ctx.scratch["prevs"]]
        con = model_contrastive_loss(z, z_glob, z_prevs, self.config.tau)
        return ce + self.config.mu * con, {"ce": ce, "con": con}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        """The client's previous-model pool for next time: its older trained models, then this round's."""
        if self.config.mu == 0:
            return {}
        state = ctx.state
        older = [] if state.get("initial") else [_cpu(sd) for sd in state.get("prev", [])]
        pool = older + [split_state(model, lambda k: True)]
        return {"prev": pool[-self.config.model_buffer_size:]}

    def eval_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        model.load_state_dict(ctx.payload["model"])  # the global model; the pool plays no part in prediction
