"""fit_rotation against numpy's eigendecomposition, on data whose spectrum is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.curriculum.pca import explained_variance, fit_pca, fit_rotation

SPECTRUM = np.array([9.0, 5.0, 3.0, 1.5, 0.5, 0.1])


def _data(m: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Samples with covariance Q diag(SPECTRUM) Qᵀ for a random rotation Q (returned too)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(len(SPECTRUM), len(SPECTRUM))))
    z = rng.normal(size=(m, len(SPECTRUM))) * np.sqrt(SPECTRUM)
    return (z @ q.T + rng.normal(size=len(SPECTRUM))).astype(np.float32), q


def _projector(rows: np.ndarray) -> np.ndarray:
    return rows.T @ rows


def test_projectors_match_numpy_eigh():
    x, _ = _data()
    values, vectors = np.linalg.eigh(np.cov(x.astype(np.float64), rowvar=False, ddof=1))
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    r = fit_rotation(torch.from_numpy(x)).double().numpy()
    assert r.shape == (6, 6)
    for k in range(1, 7):  # projectors are sign-free, unlike eigenvectors
        np.testing.assert_allclose(_projector(r[:k]), _projector(vectors[:, :k].T), atol=1e-5)
    _, eig = fit_pca(x)
    np.testing.assert_allclose(eig.numpy(), values, rtol=1e-6)


def test_rows_are_orthonormal_and_ordered_by_variance():
    x, q = _data()
    r = fit_rotation(x).double().numpy()
    np.testing.assert_allclose(r @ r.T, np.eye(6), atol=1e-6)
    variances = (x @ r.T).var(axis=0)
    assert np.all(np.diff(variances) < 0)
    np.testing.assert_allclose(variances, SPECTRUM, rtol=0.1)  # close to the population spectrum
    np.testing.assert_allclose(_projector(r[:2]), _projector(q[:, :2].T), atol=0.05)


def test_deterministic_signs_and_dtype():
    x, _ = _data(500)
    a = fit_rotation(torch.from_numpy(x))
    b = fit_rotation(torch.from_numpy(x[::-1].copy()))  # same samples, other order
    assert a.dtype == torch.float32
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert torch.all(a.gather(1, a.abs().argmax(1, keepdim=True)) > 0)


def test_explained_variance_and_degenerate_input():
    x, _ = _data()
    _, eig = fit_pca(x)
    # the share of the covariance's eigenvalues (numpy's, largest first) that the first k directions hold
    values = np.sort(np.linalg.eigvalsh(np.cov(x.astype(np.float64), rowvar=False, ddof=1)))[::-1]
    for k in range(1, 7):
        assert explained_variance(eig, k) == pytest.approx(values[:k].sum() / values.sum(), rel=1e-5), k
    assert explained_variance(eig, 6) == pytest.approx(1.0)
    assert explained_variance(eig, 2) == pytest.approx(14 / SPECTRUM.sum(), abs=0.02)  # the population's share
    assert explained_variance(fit_pca(np.ones((5, 3)))[1], 1) == 1.0
    with pytest.raises(ValueError):
        fit_rotation(np.ones((1, 3)))
