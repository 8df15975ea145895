"""FAPD's client-side progressive distillation losses, in the round's k-dimensional teacher subspace.

Both losses treat the teacher side (teacher features, class embeddings, the projection) as constants: gradients
reach the student only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def project(feats: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """ẑ = normalize(z · Pᵀ): features [B, D] onto the k principal directions [k, D], unit length."""
    return F.normalize(feats @ projection.T, dim=1)


def pkd_loss(student_feats: torch.Tensor, teacher_feats: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ẑ_T) ‖ softmax(ẑ_S)), averaged over the batch."""
    projection = projection.detach().to(student_feats.dtype)
    z_s = project(student_feats, projection)
    z_t = project(teacher_feats.detach().to(student_feats.dtype), projection)
    return F.kl_div(F.log_softmax(z_s, dim=1), F.softmax(z_t, dim=1), reduction="batchmean")


def semantic_contrastive_loss(student_feats: torch.Tensor, class_embeddings: torch.Tensor, labels: torch.Tensor,
                              projection: torch.Tensor, tau: float = 0.04) -> torch.Tensor:
    """InfoNCE with the class embeddings: cross-entropy of cos(ẑ_S, ê_c) / τ over classes c, against the labels."""
    projection = projection.detach().to(student_feats.dtype)
    z_s = project(student_feats, projection)
    e = project(class_embeddings.detach().to(student_feats.dtype), projection)
    return F.cross_entropy(z_s @ e.T / tau, labels)
