"""FedRoD (Chen & Chao, ICLR 2022): a generic model trained with a class-balanced loss and averaged, plus a
personal head per client trained on top of it; clients predict with generic + personal logits.

Paper: H.-Y. Chen, W.-L. Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification",
ICLR 2022 (arXiv:2107.00778), Sec. 4 and Algorithm 1. Code: the authors' repository github.com/hongyouc/Fed-RoD
holds only a README (no code, at its newest commit b5050f4), so the reference implementation followed here is the
FedRoD of github.com/Yutong-Dai/FedNH (``src/flbase/strategies/FedROD.py``: ``FedRODClient._train_together``,
``balanced_softmax_loss``, ``testing``), which matches github.com/TsingZ0/PFLlib's ``clientrod.py``.

With θ the body (``model.backbone``), g the generic head (``model.head``), p_k client k's personal head (``phead``,
a Linear(feature_dim, classes) added by ``adapt_model``) and π_k client k's label prior (class counts of its
training split over its size; an absent class gets 1e-12 as in the reference), client k in round t minimises, per
batch, from (θ^t, g^t) and its own p_k,

    L = BSM(g(θ(x)), y; π_k) + CE(g(θ(x)).detach() + p_k(θ(x).detach()), y)
    BSM(z, y; π) = CE(z + log π, y) = −log( π_y e^{z_y} / Σ_c π_c e^{z_c} )      (balanced softmax)

so the first term trains θ and g (the generic, class-balanced objective) and the second trains p_k only (the
personal empirical risk on top of the generic logits): one SGD step on L is the reference's two steps on the same
batch (body + generic head on BSM, then the personal head on CE). The server averages (θ, g) weighted by training
samples (FedAvg); p_k never leaves the client (``client_keep``: stored by the driver, outside workers, checkpointed).
Prediction (``predict``): g(θ(x)) + p_k(θ(x)).

* Personal head: the plain local linear head (the paper's FedRoD (linear); the reference's
  ``FedROD_hyper_clf: False``). The hypernetwork variant (a shared network generating p_k from π_k, the reference's
  default ``FedROD_hyper_clf: True`` and the paper's FedRoD (hyper)) is not implemented. As in the reference,
  p_k starts as a copy of the initial generic head.
* Balanced loss: balanced softmax (the paper's default choice among its balanced risks).
* Not reproduced: the reference's gradient clipping at norm 10 of the generic part (its framework clips every
  method; the paper does not mention it) and its separate momentum-free SGD for the personal head (here the one
  optimiser of ``train.*`` updates all parameters; equal to the reference with ``train.momentum: 0``).

Evaluation: ``predict: personal`` (default) gives every client g + p_k on its test split (``acc_mean``, the
personalised accuracy UNIDEAL's table reports; no ``acc_global``, since those predictions are not one global
model's). ``predict: generic`` predicts with (θ, g) alone, the global model, and logs its pooled ``acc_global``
(the paper's generic accuracy) beside ``acc_mean``.

Bytes: up and down = body + generic head; the personal head stays on the client.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.algorithms.configs.fedrod import FedRoDConfig
from raysim.registry import register_algorithm

PHEAD_PREFIX = "phead."
_PRIOR = "_fedrod_prior"  # this job's label prior, cached in the job's private payload copy


# ---------------------------------------------------------------------------------------------- the math
def label_prior(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """π: the class counts over their sum, an absent class counted 1e-12 (the reference's ``sample_per_class``)."""
    counts = torch.bincount(labels.detach().long().cpu(), minlength=num_classes).to(torch.float64)
    counts[counts == 0] = 1e-12
    return (counts / counts.sum()).float()


def balanced_softmax_loss(logits: torch.Tensor, labels: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """Balanced softmax: mean over the batch of CE(logits + log π, y) (the reference's ``balanced_softmax_loss``)."""
    return F.cross_entropy(logits + prior.to(logits.device, logits.dtype).log()[None, :], labels)


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("fedrod")
class FedRoD(Algorithm):
    """A balanced-softmax generic head (averaged) plus a personal head; prediction uses both."""

    Config = FedRoDConfig
    shared = "all"  # everything but the personal head (is_shared)

    @property
    def has_global_model(self) -> bool:
        return self.config.predict == "generic"

    def is_shared(self, key: str) -> bool:
        return not key.startswith(PHEAD_PREFIX)

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model.phead = nn.Linear(model.head.in_features, model.head.out_features)
        with torch.no_grad():  # p_k starts as a copy of the initial generic head
            model.phead.weight.copy_(model.head.weight)
            model.phead.bias.copy_(model.head.bias)
        return model

    # ------------------------------------------------------------------ client side
    def _prior(self, ctx: ClientContext) -> torch.Tensor:
        if _PRIOR not in ctx.payload:
            ctx.payload[_PRIOR] = label_prior(ctx.train_data[1], ctx.num_classes).to(ctx.device)
        return ctx.payload[_PRIOR]

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feats = model.features(x)
        generic = model.head(feats)
        bsm = balanced_softmax_loss(generic, y, self._prior(ctx))
        personal = F.cross_entropy(generic.detach() + model.phead(feats.detach()), y)
        return bsm + personal, {"bsm": bsm, "personal": personal}

    def predict(self, model: nn.Module, x: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        feats = model.features(x)
        logits = model.head(feats)
        return logits if self.config.predict == "generic" else logits + model.phead(feats)
