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


def pkd_loss(student_feats: torch.Tensor, teacher_feats: torch.Tensor, projection: torch.Tensor,
             temperature: float = 1.0) -> torch.Tensor:
    """KL(softmax(ẑ_T / T) ‖ softmax(ẑ_S / T)), averaged over the batch.

    ``temperature`` T = 1 is the seed's formula as written. ẑ are unit vectors, so their entries lie in [-1, 1] and
    at T = 1 both softmaxes are close to uniform: the term is tiny whatever the features. T < 1 sharpens both
    distributions and so strengthens the term (worked case in tests/curriculum/test_pkd.py). No T²
    factor: the term's weight is lambda_kd's to set.
    """
    projection = projection.detach().to(student_feats.dtype)
    z_s = project(student_feats, projection) / temperature
    z_t = project(teacher_feats.detach().to(student_feats.dtype), projection) / temperature
    return F.kl_div(F.log_softmax(z_s, dim=1), F.softmax(z_t, dim=1), reduction="batchmean")


def semantic_contrastive_loss(student_feats: torch.Tensor, class_embeddings: torch.Tensor, labels: torch.Tensor,
                              projection: torch.Tensor, tau: float = 0.04) -> torch.Tensor:
    """InfoNCE with the class embeddings: cross-entropy of cos(ẑ_S, ê_c) / τ over classes c, against the labels."""
    projection = projection.detach().to(student_feats.dtype)
    z_s = project(student_feats, projection)
    e = project(class_embeddings.detach().to(student_feats.dtype), projection)
    return F.cross_entropy(z_s @ e.T / tau, labels)
