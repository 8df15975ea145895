"""sample_clients: the round's clients are a pure function of (seed, round), of the configured size."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.engine.sampling import sample_clients
from raysim.engine.plan import round_half_up


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


def _old_sample(seed: int, rnd: int, num: int, fraction: float) -> list[int]:
    """sample_clients as it was before issue 39: the draw every earlier run's metrics depend on."""
    m = max(1, int(round_half_up(fraction * num)))
    rng = np.random.default_rng([seed, rnd, 104729])
    return sorted(int(c) for c in rng.choice(num, size=m, replace=False))


@pytest.mark.parametrize("num, fraction", [(1, 1.0), (10, 0.3), (10, 1.0), (10_001, 0.01), (10_001, 0.03),
                                           (60_000, 0.5), (60_000, 1.0), (200_000, 0.001)])
def test_the_draw_is_the_same_as_ever(num, fraction):
    """Floyd's path (a cohort up to num // 50), numpy's tail shuffle (past it) and the whole population alike."""
    for seed, rnd in ((0, 1), (3, 7)):
        got = sample_clients(seed, rnd, num, fraction)
        assert got == _old_sample(seed, rnd, num, fraction)
        assert all(type(c) is int for c in got[:3])


def test_a_cohort_that_cannot_fit_in_memory_is_refused_up_front(tmp_path, capsys):
    from raysim.cli import main
    from raysim.config import load_config
    from raysim.engine.sampling import check_cohort_fits
    from raysim.errors import UserError

    cfg = load_config(None, ["clients.num=100000000", "data.name=synthetic"])
    with pytest.raises(UserError, match=r"samples 100000000 clients a round.*more than the 8.0 GiB.*at most about"):
        check_cohort_fits(cfg, available=8 * 1024**3)
    check_cohort_fits(load_config(None, ["clients.num=100000000", "clients.fraction=0.001"]), available=8 * 1024**3)
    args = ["run", "clients.num=100000000", "data.name=synthetic", f"log.dir={tmp_path / 'run'}"]
    if check_cohort_fits.__globals__["_available_memory"]() is not None:  # the CLI's one line, on this machine
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("raysim: error: config key 'clients.fraction'") and err.count("\n") == 0, err
        assert not (tmp_path / "run").exists()
