"""FAPD's hierarchical knowledge decomposition: PCA of the teacher's features on the server's calibration split.

The rows of the rotation R = Vᵀ are principal directions by descending variance, so ``R[:k]`` is the projection onto
the k-dimensional subspace that keeps most of the teacher's variance: the curriculum grows k, never reorders.
"""

from __future__ import annotations

import numpy as np
import torch


def fit_pca(features: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(R [D, D], eigenvalues [D]) of the features' covariance (1/(M−1)), both sorted by descending eigenvalue.

    Computed in float64 (the small trailing eigenvalues are what float32 gets wrong); R comes back in the input's
    floating dtype. Each row's sign is fixed (its largest-magnitude entry positive) so that the same features give
    the same R on every machine.
    """
    z = torch.as_tensor(np.asarray(features) if isinstance(features, np.ndarray) else features)
    if z.dim() != 2 or z.shape[0] < 2:
        raise ValueError(f"fit_pca needs a [M, D] matrix with M >= 2 samples, got shape {tuple(z.shape)}")
    out_dtype = z.dtype if z.is_floating_point() else torch.float32
    z = z.detach().to("cpu", torch.float64)
    centred = z - z.mean(dim=0, keepdim=True)
    cov = centred.T @ centred / (z.shape[0] - 1)
    eigenvalues, vectors = torch.linalg.eigh(cov)  # ascending
    order = torch.argsort(eigenvalues, descending=True, stable=True)
    eigenvalues, rotation = eigenvalues[order].clamp_min(0.0), vectors[:, order].T.contiguous()
    pivot = rotation.abs().argmax(dim=1)
    signs = torch.sign(rotation.gather(1, pivot[:, None]))
    rotation = rotation * torch.where(signs == 0, torch.ones_like(signs), signs)
    return rotation.to(out_dtype), eigenvalues


def fit_rotation(features: torch.Tensor | np.ndarray) -> torch.Tensor:
    """R = Vᵀ [D, D]: rows are principal directions, by descending variance; P_t = R[:k_t]."""
    return fit_pca(features)[0]


def explained_variance(eigenvalues: torch.Tensor, k: int) -> float:
    """Share of the total variance that the first k components hold (1.0 for a constant feature set)."""
    total = float(eigenvalues.sum())
    return float(eigenvalues[:k].sum()) / total if total > 0 else 1.0
