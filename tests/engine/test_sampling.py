"""sample_clients: the round's clients are a pure function of (seed, round), of the configured size."""

from __future__ import annotations

import pytest

from raysim.engine.driver import round_half_up, sample_clients


@pytest.mark.parametrize("num, fraction, size", [(10, 1.0, 10), (10, 0.5, 5), (10, 0.25, 3), (10, 0.01, 1),
                                                 (4, 0.5, 2), (7, 0.5, 4), (1, 0.1, 1)])
def test_sample_size_rounds_half_up_and_is_never_empty(num, fraction, size):
    for rnd in range(1, 6):
        got = sample_clients(0, rnd, num, fraction)
        assert len(got) == size
        assert got == sorted(set(got)) and all(0 <= c < num for c in got)  # distinct, sorted, in range


def test_sampling_depends_on_seed_and_round_only():
    assert sample_clients(3, 7, 100, 0.1) == sample_clients(3, 7, 100, 0.1)  # no hidden RNG state: resume-safe
    by_round = {tuple(sample_clients(3, r, 100, 0.1)) for r in range(1, 11)}
    by_seed = {tuple(sample_clients(s, 7, 100, 0.1)) for s in range(10)}
    assert len(by_round) == 10 and len(by_seed) == 10


def test_every_client_is_sampled_about_equally_often():
    counts = [0] * 20
    for rnd in range(1, 2001):
        for c in sample_clients(0, rnd, 20, 0.25):
            counts[c] += 1
    assert sum(counts) == 2000 * 5
    assert min(counts) > 400 and max(counts) < 600  # 500 expected; a binomial sd of ~19


def test_round_half_up_is_not_bankers_rounding():
    assert [round_half_up(x) for x in (0.5, 1.5, 2.5, 2.49)] == [1, 2, 3, 2]
