"""raysim's rules and attacks against an independent implementation, byzfl 0.0.11 (EPFL's LPD library,
``pip install byzfl``), on the same random inputs (1e-6), for every one that both define. byzfl is fed float64 numpy
arrays: its torch path casts to float32.

Defined differently on purpose (each test says how, and checks the mapping between the two):
- Krum and Multi-Krum: byzfl scores a vector by its n − f − 1 nearest, the paper (and raysim) by n − f − 2, so
  raysim's f − 1 is byzfl's f;
- ALIE: byzfl sends μ + τσ with the sample std (Baruch et al.'s released code: ``--num_std 1.5``); raysim μ − zσ with
  the population std and z from n and f (``attack.z_rule``), so z = −τ·sqrt(m / (m − 1)) for m honest updates;
- sign flipping: byzfl's attacker sends −(the honest mean), raysim's its own update negated (Li et al.'s RSA);
- the geometric median: byzfl starts Weiszfeld at 0 with ν = 0.1 and a fixed number of steps, RFA's code (raysim)
  at the weighted mean with an early stop: compared from byzfl's start.
Not compared: Bulyan, FLTrust, FoolsGold, min-max/min-sum and Fang et al.'s attacks (byzfl has none of them),
Gaussian updates (each draws its own noise), label flipping (byzfl's is the honest mean: the flip is on the data).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from byzfl import (NNM, ALittleIsEnough, Bucketing, CenteredClipping, GeometricMedian, InnerProductManipulation, Krum,
                   Median, Mimic, MultiKrum, SignFlipping, TrMean)

from raysim.robust import aggregators as A
from raysim.robust import attacks as T

TOL = 1e-6


def inputs(seed: int, n: int = 11, d: int = 7) -> tuple[np.ndarray, torch.Tensor]:
    """Random updates, some far out (as attacked rows are), as numpy for byzfl and torch for raysim."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x[: n // 4] *= rng.uniform(3, 30)
    return x, torch.from_numpy(x.copy())


SEEDS = [0, 1, 2]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [10, 11])
def test_median(seed, n):
    x, t = inputs(seed, n)
    np.testing.assert_allclose(A.median(t).numpy(), Median()(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("f", [0, 1, 3])
def test_trimmed_mean(seed, f):
    x, t = inputs(seed)
    np.testing.assert_allclose(A.trimmed_mean(t, f).numpy(), TrMean(f)(x), atol=TOL, rtol=0)


def clustered(seed: int, n: int = 11, d: int = 7) -> tuple[np.ndarray, torch.Tensor]:
    """Updates of varied norms, a third of them shifted together: inputs on which the neighbour count matters."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.2, 3, size=(n, 1))
    x[: n // 3] += rng.normal(size=d) * 3
    return x, torch.from_numpy(x.copy())


def test_krum_and_multikrum_with_byzfls_neighbour_count():
    """byzfl's Krum(f) scores by n − f − 1 neighbours, raysim's by n − f − 2 (Blanchard et al.): raysim's f − 1 is
    byzfl's f, on every input; raysim's f itself picks otherwise on some of these inputs (the test can tell)."""
    unmapped = 0
    for make in (inputs, clustered):
        for seed in range(10):
            x, t = make(seed)
            n = x.shape[0]
            for f in (1, 2, 3, 4):
                np.testing.assert_allclose(A.krum(t, f - 1).numpy(), Krum(f)(x), atol=TOL, rtol=0)
                np.testing.assert_allclose(A.multikrum(t, f - 1, n - f).numpy(), MultiKrum(f)(x), atol=TOL, rtol=0)
                unmapped += not np.allclose(A.krum(t, f).numpy(), Krum(f)(x), atol=TOL, rtol=0)
                unmapped += not np.allclose(A.multikrum(t, f, n - f).numpy(), MultiKrum(f)(x), atol=TOL, rtol=0)
    assert unmapped > 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tau, iterations", [(1.0, 1), (0.5, 3), (100.0, 2)])
def test_centered_clipping_from_zero(seed, tau, iterations):
    """byzfl starts from 0 (its ``m`` argument cannot be given: its type check refuses every value), as raysim's
    first round does."""
    x, t = inputs(seed)
    np.testing.assert_allclose(A.centered_clip(t, tau, iterations).numpy(),
                               CenteredClipping(L=iterations, tau=tau)(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nu, steps", [(0.1, 3), (1e-5, 8)])
def test_geometric_median_from_byzfls_start(seed, nu, steps):
    """The same smoothed Weiszfeld steps from byzfl's start (0, uniform weights, no early stop)."""
    x, t = inputs(seed)
    ours = A.geometric_median(t, nu=nu, maxiter=steps, ftol=0.0, start=torch.zeros(t.shape[1], dtype=t.dtype))
    np.testing.assert_allclose(ours.numpy(), GeometricMedian(nu=nu, T=steps)(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("f", [0, 2, 5])
def test_nearest_neighbour_mixing(seed, f):
    x, t = inputs(seed)
    np.testing.assert_allclose(A.nearest_neighbor_mixing(t, f).numpy(), NNM(f)(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("s", [2, 3, 4])
def test_bucketing_with_the_same_shuffle(seed, s):
    """byzfl shuffles with numpy's global generator: the same seed gives raysim the same order."""
    x, t = inputs(seed)
    np.random.seed(seed)
    theirs = Bucketing(s)(x)
    np.random.seed(seed)
    order = torch.from_numpy(np.random.permutation(x.shape[0]))
    np.testing.assert_allclose(A.bucketing(t, s, order).numpy(), theirs, atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tau", [0.1, 2.0])
def test_ipm(seed, tau):
    x, t = inputs(seed)
    np.testing.assert_allclose(T.ipm(t, tau).numpy(), InnerProductManipulation(tau)(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tau", [1.5, -0.4])
def test_alie_maps_byzfls_tau_to_raysims_z(seed, tau):
    """byzfl: μ + τ·(sample std); raysim: μ − z·(population std): z = −τ·sqrt(m/(m − 1))."""
    x, t = inputs(seed)
    m = x.shape[0]
    z = -tau * (m / (m - 1)) ** 0.5
    np.testing.assert_allclose(T.alie(t, z).numpy(), ALittleIsEnough(tau)(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_sign_flipping_of_the_honest_mean(seed):
    """byzfl's attacker sends −(honest mean); raysim's flips its own update: the same function of the mean."""
    x, t = inputs(seed)
    np.testing.assert_allclose(T.sign_flip(t.mean(dim=0)).numpy(), SignFlipping()(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("target", [0, 4])
def test_mimic_copies_the_target(seed, target):
    """byzfl's Mimic copies a fixed honest vector (Karimireddy et al.'s ``MimicAttacker``); raysim's learns which
    during its warm-up, then copies it the same way."""
    x, t = inputs(seed)
    bad = torch.zeros(2, t.shape[1], dtype=t.dtype)
    out = T.poison_updates("mimic", torch.cat([t, bad]), [False] * len(t) + [True, True], mimic=target)
    for row in out[len(t):]:
        np.testing.assert_allclose(row.numpy(), Mimic(target)(x), atol=TOL, rtol=0)
