"""Ditto (Li et al., ICML 2021): beside the global model, which is trained and averaged as in FedAvg, each client
trains a personal model of its own, pulled towards the global one by a proximal term; clients predict with it.

Paper: T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021 (arXiv:2012.04221), Algorithm 1. Authors' code: github.com/litian96/ditto
(``flearn/trainers_MTL/ditto.py`` ``Server.train``: for each local iteration, on the same batch, one SGD step of the
personal model v_k on ∇F_k(v_k) + λ(v_k − w^t), then one of the global model's local copy on ∇F_k; the round's
global model w^t stays fixed; ``fedbase.py``: every v_k starts as the initial model; ``run_*_ditto_lam1.sh``: λ = 1).

Client k in round t downloads w^t and, from w = w^t and its own v_k, minimises over each batch

    L = CE(w; x, y) + CE(v_k; x, y) + (λ/2)·‖v_k − w^t‖²

The two parameter sets are disjoint, so the gradient of L in w is ∇F_k(w) and in v_k is ∇F_k(v_k) + λ(v_k − w^t):
one optimiser step on L is the authors' two steps on the same batch (with ``train.momentum``/``weight_decay`` each set
keeps its own, per-parameter, optimiser state). The personal model is a submodule (``model.personal``, added by
``adapt_model`` as a copy of the freshly built model, so it starts at the initial weights as in the authors' code);
``is_shared`` keeps it out of uploads and payloads, and it is kept as client state (stored by the driver outside the
workers, checkpointed). w^t is read from the payload, a private copy training never changes. The server averages the
uploaded w_k by training samples (FedAvg; the authors sample clients in proportion to their data and take the
plain mean, which is the same in expectation).

Evaluation (``algorithm.predict``): ``personal`` (default, the paper's) predicts with v_k, and ``acc_mean`` is the
mean personalised accuracy; ``global`` predicts with w^{t+1} and logs its pooled ``acc_global`` as well.

* ``algorithm.lam`` λ = 1 (the authors' run scripts; their ``main.py`` default 0 gives each client a purely local
  model, which ``lam: 0`` also gives here). Not reproduced: ``--dynamic_lam`` (λ picked per client on validation
  data) and the robustness experiments' corrupted clients.
* Bytes: up and down = the global model; the personal model stays on the client.

Logged loss parts: ``loss_ce`` (the global model's), ``loss_personal`` (the personal model's CE) and ``loss_prox``
((λ/2)‖v_k − w^t‖²); ``loss`` is their sum.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.algorithms.fedprox import proximal_term
from raysim.config import AlgorithmConfig, is_finite, require
from raysim.registry import register_algorithm

PERSONAL = "personal"
PERSONAL_PREFIX = PERSONAL + "."
PREDICTS = ("personal", "global")


@dataclass
class DittoConfig(AlgorithmConfig):
    name: str = "ditto"
    lam: float = 1.0  # λ, the pull of the personal model towards the global one (authors' scripts: 1)
    predict: str = "personal"  # personal: v_k (acc_mean) | global: the averaged model (acc_global too)

    def validate(self) -> None:
        require(is_finite(self.lam, 0.0), "algorithm.lam", f"must be a number >= 0, got {self.lam}")
        require(self.predict in PREDICTS, "algorithm.predict",
                f"must be one of {', '.join(PREDICTS)}, got {self.predict!r}")


@register_algorithm("ditto")
class Ditto(Algorithm):
    """A personal model per client, trained beside the global one and pulled to it by (λ/2)‖v − w^t‖²."""

    Config = DittoConfig
    shared = "all"  # everything but the personal model (is_shared)
    # engine.vectorize: both losses run on the cohort's swapped-in weights (the personal model is a submodule) and
    # the proximal term on the shared download
    vectorizable = True

    @property
    def has_global_model(self) -> bool:
        return self.config.predict == "global"

    def is_shared(self, key: str) -> bool:
        return not key.startswith(PERSONAL_PREFIX)

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model.add_module(PERSONAL, copy.deepcopy(model))  # the initial weights, as the global model's
        return model

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ce = F.cross_entropy(model(x), y)
        personal = getattr(model, PERSONAL)
        ce_personal = F.cross_entropy(personal(x), y)
        w_t = ctx.payload["model"]
        prox = proximal_term(((p, w_t[name]) for name, p in personal.named_parameters()), self.config.lam)
        return ce + ce_personal + prox, {"ce": ce, "personal": ce_personal, "prox": prox}

    def predict(self, model: nn.Module, x: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        return getattr(model, PERSONAL)(x) if self.config.predict == "personal" else model(x)
