"""Pure helpers of the worker: batching, byte accounting, job seeds, finiteness."""

import torch

from raysim.engine.core import job_seed
from raysim.trees import all_finite, nbytes
from raysim.algorithms.training import batch_bounds


def test_batch_bounds_cover_every_sample_and_never_leave_a_single_one():
    for n in range(1, 100):
        for bs in (1, 7, 32):
            bounds = batch_bounds(n, bs)
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            if n > 1 and bs > 1:
                assert all(e - s >= 2 for s, e in bounds)


def test_nbytes_counts_every_tensor_exactly():
    tree = {"model": {"w": torch.zeros(10, 3), "b": torch.zeros(3, dtype=torch.float64)},
            "projection": [torch.zeros(2, 2, dtype=torch.float16)], "k": 5}
    assert nbytes(tree) == 10 * 3 * 4 + 3 * 8 + 4 * 2


def test_job_seeds_depend_on_client_and_round_only():
    assert job_seed(0, 1, 2) == job_seed(0, 1, 2)
    assert len({job_seed(0, c, r) for c in range(20) for r in range(20)}) == 400
    assert job_seed(0, 1, 2) != job_seed(1, 1, 2)


def test_all_finite():
    assert all_finite({"a": torch.ones(3), "n": torch.tensor([1, 2])})
    assert not all_finite({"a": torch.tensor([1.0, float("nan")])})
    assert not all_finite([torch.tensor([float("inf")])])
    # the sum first: +Inf and -Inf in one tensor sum to NaN, still not finite; a -Inf among finite values too
    assert not all_finite({"a": torch.tensor([float("inf"), float("-inf")]), "b": torch.zeros(2)})
    assert not all_finite({"a": torch.ones(4), "b": {"c": torch.tensor([2.0, float("-inf"), 1.0])}})
    # finite values whose sum overflows (float32, float16) are finite: checked element by element then
    assert all_finite({"a": torch.tensor([3e38, 3e38]), "h": torch.full((8,), 60000.0, dtype=torch.float16)})
    assert not all_finite({"h": torch.tensor([60000.0, float("nan")], dtype=torch.float16)})
    assert all_finite({"e": torch.zeros(0), "n": torch.tensor([2**62, 2**62]), "d": torch.ones(3, dtype=torch.float64)})
    assert all_finite({}) and all_finite({"x": 3})
