"""FedRCL (Seo, Kim, Kim & Han, CVPR 2024): FedAvg plus a relaxed supervised contrastive loss on several stages.

Paper: S. Seo, J. Kim, G. Kim, B. Han, "Relaxed Contrastive Learning for Federated Learning", CVPR 2024
(arXiv:2401.04928): supervised contrastive learning (SCL) aligns local updates, a divergence penalty on same-class
pairs that are already very similar prevents the representation collapse SCL causes, and the loss is applied to the
features of several backbone levels. Authors' code: github.com/skynbe/FedRCL (``clients/rcl_client.py``
``RCLClient._algorithm_rcl`` and ``get_weights``; ``utils/loss.py`` ``CLLoss`` / ``MultiLabelCrossEntropyLoss``;
``configs/client/fedrcl.yaml`` for the defaults; ``models/resnet_base.py`` for the levels). This file follows the
released code where it is more specific than the paper.

Server: FedAvg (the whole model averaged, weighted by training samples). Client i minimises on each batch

    L = CE(f(x), y) + (1/|S|) Σ_{l∈S} [ w_scl · L_SCL(h^l) + β · L_Div(h^l) ]

where h^l = the l-th stage's features (``ClassifierModel.forward_stages``: pre-ReLU, averaged over space, as the
authors' ``feature_relu: False``; S = ``stages``, all by default = the authors' ``branch_level: [0,1,2,3,4]``, i.e.
ResNet's stem and four layers), s_ij = cos(h_i, h_j) and τ the temperature:

    L_SCL = (1/B) Σ_i −log( e^{p_i/τ} / (e^{p_i/τ} + Σ_{n∈N_i} e^{s_in/τ}) )
        p_i  = the ``topk_pos`` smallest s_ij over same-class j, i itself included (the hardest positive; s_ii = 1)
        N_i  = the ``topk_neg`` largest s_ij over other-class j (the hardest negatives; fewer if the batch has fewer)
    L_Div = (1/B) Σ_i −log( e^{s_ii/τ} / (e^{s_ii/τ} + e^{q_i/τ}) )
        q_i  = the ``topk_pos`` smallest s_ij over same-class j ≠ i, replaced by −1 where below the threshold λ (or
               where i has no other same-class sample in the batch)

So the divergence penalty pushes a sample away from its same-class partners only when even the least similar of
them is more similar than λ (the relaxation); below λ the term is log(1 + e^{−2/τ}) ≈ 0 with no gradient. With
``topk_pos`` > 1 each positive is its own row [positive, negatives] and a row without a finite positive counts 0
(the authors' ``MultiLabelCrossEntropyLoss`` zeroes inf/NaN). L_SCL and L_Div are batch means per stage, then means
over the stages (``torch.mean(torch.stack(...))`` in ``_algorithm_rcl``).

Defaults (``configs/client/fedrcl.yaml``): τ = 0.05 (``rcl_loss.temp``), λ = 0.7 (penalty pair ``threshold``),
topk_pos = 1, topk_neg = 2, w_scl = 1 (``scl`` pair weight), β = 1 (``penalty`` pair weight), CE weight 1; the
config's prox and feature-alignment terms have weight 0 and are left out. Gradients are clipped to norm 10 at every
step, as ``RCLClient.local_train`` does (``clip_grad_norm``; null turns it off). Not reproduced: the authors train
under AMP and their ResNet-18 uses GroupNorm; local optimisation (lr, epochs, batch) is the setting's, as for every
method in a table.

Models: any whose backbone exposes stage features (mlp, mlp_hete, cnn, resnet10, resnet18; ``check`` refuses
others). Logged loss parts: ``loss_ce``, ``loss_scl``, ``loss_div`` (before their weights).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.algorithms.configs.fedrcl import FedRCLConfig
from raysim.config import ExperimentConfig
from raysim.data.base import FederatedData
from raysim.registry import register_algorithm


def _rows_loss(pos: torch.Tensor, neg: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean over samples of the mean over their positives of −log softmax([pos_p, negs]/τ)[0]; a positive that is
    not finite (no such positive in the batch) counts 0, as the authors' MultiLabelCrossEntropyLoss."""
    valid = torch.isfinite(pos)
    pos = torch.where(valid, pos, torch.zeros_like(pos))  # keep NaN out of the gradient of the dropped rows
    logits = torch.cat([pos.unsqueeze(2), neg.unsqueeze(1).expand(-1, pos.shape[1], -1)], dim=2) / tau
    rows = -torch.log_softmax(logits, dim=2)[:, :, 0]
    return torch.where(valid, rows, torch.zeros_like(rows)).mean(dim=1).mean()


def relaxed_contrastive_loss(h: torch.Tensor, y: torch.Tensor, tau: float = 0.05, threshold: float = 0.7,
                             topk_pos: int = 1, topk_neg: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_SCL, L_Div) of one stage's features ``h`` [B, C] with labels ``y`` [B] (see the module docstring)."""
    z = F.normalize(h, p=2, dim=1)
    sim = z @ z.t()
    n = len(y)
    same = y.unsqueeze(0) == y.unsqueeze(1)
    eye = torch.eye(n, dtype=torch.bool, device=h.device)
    inf = torch.tensor(float("inf"), device=h.device, dtype=sim.dtype)
    # L_SCL: hardest positives (self included) against the hardest other-class negatives
    pos = torch.topk(torch.where(same, sim, inf), min(topk_pos, n), dim=1, largest=False).values
    neg = torch.topk(torch.where(same, -inf, sim), min(topk_neg, n), dim=1, largest=True).values
    scl = _rows_loss(pos, neg, tau)
    # L_Div: the sample itself as the positive, its least similar same-class partner as a negative above λ only
    self_pos = torch.topk(torch.where(eye, sim, inf), min(topk_pos, n), dim=1, largest=False).values
    partner = torch.topk(torch.where(same & ~eye, sim, inf), min(topk_pos, n), dim=1, largest=False).values
    relaxed = torch.where(torch.isfinite(partner) & (partner >= threshold), partner, -torch.ones_like(partner))
    div = _rows_loss(self_pos, relaxed, tau)
    return scl, div


@register_algorithm("fedrcl")
class FedRCL(Algorithm):
    """FedAvg plus a relaxed supervised contrastive loss over the backbone stages."""

    Config = FedRCLConfig
    shared = "all"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self.clip_grad_norm = self.config.clip_grad_norm

    def check(self, cfg: ExperimentConfig, data: FederatedData) -> None:
        super().check(cfg, data)
        from raysim.errors import UserError
        from raysim.models import build_model, has_stages

        for arch in dict.fromkeys(cfg.model.names()):
            if not has_stages(arch):
                raise UserError(f"config key 'model.name': fedrcl needs a backbone with stage features "
                                f"(mlp, mlp_hete, cnn, resnet10, resnet18), got {arch}")
        if self.config.stages is not None:
            model = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0, self).eval()
            with torch.no_grad():
                count = len(model.stage_features(torch.zeros(2, *data.input_shape(0))))
            bad = [s for s in self.config.stages if s >= count]
            if bad:
                raise UserError(f"config key 'algorithm.stages': {cfg.model.for_client(0)} has {count} stages "
                                f"(0..{count - 1}), got {list(self.config.stages)}")

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        logits, stages = model.forward_stages(x)
        ce = F.cross_entropy(logits, y)
        chosen = stages if c.stages is None else [stages[i] for i in c.stages]
        parts = [relaxed_contrastive_loss(h, y, c.tau, c.threshold, c.topk_pos, c.topk_neg) for h in chosen]
        scl = torch.stack([p[0] for p in parts]).mean()
        div = torch.stack([p[1] for p in parts]).mean()
        return ce + c.scl_weight * scl + c.penalty_weight * div, {"ce": ce, "scl": scl, "div": div}
