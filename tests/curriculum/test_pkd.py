"""Progressive distillation losses against direct computations; gradients reach the student only."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from raysim.curriculum.pca import fit_rotation
from raysim.curriculum.pkd import pkd_loss, semantic_contrastive_loss


def _inputs(b: int = 7, d: int = 10, k: int = 4, c: int = 5):
    g = torch.Generator().manual_seed(0)
    student = torch.randn(b, d, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(b, d, generator=g, dtype=torch.float64, requires_grad=True)
    classes = torch.randn(c, d, generator=g, dtype=torch.float64, requires_grad=True)
    projection = fit_rotation(torch.randn(50, d, generator=g, dtype=torch.float64))[:k].clone().requires_grad_(True)
    labels = torch.randint(0, c, (b,), generator=g)
    return student, teacher, classes, projection, labels


def test_pkd_loss_is_the_batch_mean_kl_of_projected_normalised_features():
    s, t, _, p, _ = _inputs()
    loss = pkd_loss(s, t, p)
    s, t, p = s.detach(), t.detach(), p.detach()
    expected = 0.0
    for i in range(len(s)):
        zs = (p @ s[i]) / torch.linalg.norm(p @ s[i])
        zt = (p @ t[i]) / torch.linalg.norm(p @ t[i])
        pt = torch.exp(zt) / torch.exp(zt).sum()
        log_ps = zs - torch.log(torch.exp(zs).sum())
        expected += float((pt * (torch.log(pt) - log_ps)).sum())
    assert float(loss.detach()) == pytest.approx(expected / len(s), rel=1e-10)
    assert float(pkd_loss(t, t, p)) == pytest.approx(0.0, abs=1e-12)


def test_pkd_temperature_worked_by_hand():
    """Two 2-d unit features, identity projection: ẑ_S = (1, 0), ẑ_T = (0, 1).

    Logits ẑ / T: teacher (0, a), student (a, 0) with a = 1 / T. softmax(teacher) = (1, e^a) / (1 + e^a); the log
    ratio log p_T - log p_S is (-a, a), so KL = a (e^a - 1) / (1 + e^a). T = 1: 0.4621; T = 0.5: 2 (e² - 1) /
    (1 + e²) = 1.5232; T = 0.04 (the seed's contrastive τ): 25 tanh(12.5) = 25.000, 54x the T = 1 value.
    """
    s = torch.tensor([[3.0, 0.0]], dtype=torch.float64)  # normalised to (1, 0)
    t = torch.tensor([[0.0, 0.5]], dtype=torch.float64)  # normalised to (0, 1)
    eye = torch.eye(2, dtype=torch.float64)
    e = math.e
    assert float(pkd_loss(s, t, eye)) == pytest.approx((e - 1) / (1 + e), rel=1e-12)
    assert float(pkd_loss(s, t, eye, temperature=0.5)) == pytest.approx(2 * (e**2 - 1) / (1 + e**2), rel=1e-12)
    assert float(pkd_loss(s, t, eye, temperature=0.04)) == pytest.approx(25 * math.tanh(12.5), rel=1e-12)


def test_semantic_contrastive_loss_is_infonce_over_cosines():
    s, _, e, p, y = _inputs()
    tau = 0.04
    loss = semantic_contrastive_loss(s, e, y, p, tau=tau)
    s, e, p = s.detach(), e.detach(), p.detach()
    expected = 0.0
    for i in range(len(s)):
        sims = torch.stack([F.cosine_similarity(p @ s[i], p @ e[j], dim=0) for j in range(len(e))]) / tau
        expected += -float(sims[y[i]] - torch.logsumexp(sims, dim=0))
    assert float(loss.detach()) == pytest.approx(expected / len(s), rel=1e-10)
    default = semantic_contrastive_loss(s, e, y, p)
    assert float(default.detach()) == pytest.approx(float(loss.detach()))  # tau defaults to 0.04


def test_gradients_reach_the_student_only():
    s, t, e, p, y = _inputs()
    (pkd_loss(s, t, p) + semantic_contrastive_loss(s, e, y, p)).backward()
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
    assert t.grad is None and e.grad is None and p.grad is None


def test_full_rotation_keeps_cosines():
    """With k = D the projection is a rotation: the contrastive logits equal unprojected cosines."""
    s, _, e, _, y = _inputs(k=10)
    s, e = s.detach(), e.detach()
    r = fit_rotation(torch.randn(40, 10, dtype=torch.float64))
    a = semantic_contrastive_loss(s, e, y, r, tau=0.5)
    b = F.cross_entropy(F.normalize(s, dim=1) @ F.normalize(e, dim=1).T / 0.5, y)
    assert float(a) == pytest.approx(float(b), rel=1e-10)
    assert math.isfinite(float(pkd_loss(s, s * 2, r)))
