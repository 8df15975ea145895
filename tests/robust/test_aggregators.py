"""Each rule's defining computation on five small updates, worked out by hand in the comments (not by the code)."""

from __future__ import annotations

import pytest
import torch

from raysim.robust import aggregators as A


def rows(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).reshape(len(values), -1)


# coordinate 0: 1, 2, 3, 6, 100; coordinate 1: 10, 20, 30, 40, -50
FIVE = rows([1, 10], [2, 20], [3, 30], [6, 40], [100, -50])
W = torch.ones(5, dtype=torch.float64)


def test_median_takes_the_middle_value_of_each_coordinate():
    # sorted: 1 2 [3] 6 100 and -50 10 [20] 30 40
    assert A.median(FIVE).tolist() == [3.0, 20.0]
    # even n: 1 2 | 3 6 -> (2 + 3) / 2 (torch.median alone would give 2)
    assert A.median(rows(1, 2, 3, 6)).tolist() == [2.5]


def test_trimmed_mean_drops_f_on_each_side():
    # f = 1: 2, 3, 6 -> 11/3; 10, 20, 30 -> 20
    assert A.trimmed_mean(FIVE, 1).tolist() == pytest.approx([11 / 3, 20.0])
    # f = 2: only the middle value stays
    assert A.trimmed_mean(FIVE, 2).tolist() == [3.0, 20.0]
    with pytest.raises(ValueError):
        A.trimmed_mean(FIVE, 3)


KRUM = rows(0, 1, 3, 7, 20)


def test_krum_scores_and_choice():
    # f = 1: n - f - 2 = 2 nearest others, squared: 0: 1+9=10, 1: 1+4=5, 3: 4+9=13, 7: 16+36=52, 20: 169+289=458
    assert A.krum_scores(KRUM, 1).tolist() == [10.0, 5.0, 13.0, 52.0, 458.0]
    assert A.krum(KRUM, 1).tolist() == [1.0]


def test_multikrum_averages_the_m_best():
    # m = 3: 1 (5), 0 (10), 3 (13) -> 4/3; default m = n - f = 4 adds 7 -> 11/4
    assert A.multikrum(KRUM, 1, 3).tolist() == pytest.approx([4 / 3])
    assert A.multikrum(KRUM, 1).tolist() == pytest.approx([11 / 4])
    with pytest.raises(ValueError):
        A.krum(KRUM, 2)  # n = 5 is not > 2f + 2 = 6


def test_bulyan_on_five_with_f0_is_the_mean_and_on_eight_with_f1_by_hand():
    # f = 0: θ = n = 5 chosen, β = 5 closest to the median: every row, the mean 31/5
    assert A.bulyan(KRUM, 0).tolist() == pytest.approx([31 / 5])
    with pytest.raises(ValueError):
        A.bulyan(KRUM, 1)  # n = 5 is not > 4f + 3 = 7
    # n = 8, f = 1: Krum (5, 4, 3, 2 neighbours) chooses 2 (score 19, tied with 3: the lower index), 3 (18), 1 (26,
    # tied with 4), 4 (17); then 5 and 0 by their distances to all left; θ = 6: {0..5}, median 2.5, the β = 4
    # closest: 2, 3, 1, 4 -> 2.5 (50 and -40 never count)
    eight = rows(0, 1, 2, 3, 4, 5, 50, -40)
    assert A.bulyan(eight, 1).tolist() == pytest.approx([2.5])


def test_norm_bound_clips_each_update_to_m_before_the_weighted_mean():
    # M = 5: [3,4] stays, [6,8] -> [3,4], [0,0], [0,1] stay, [30,40] -> [3,4]
    x = rows([3, 4], [6, 8], [0, 0], [0, 1], [30, 40])
    assert A.norm_bound(x, W, 5.0).tolist() == pytest.approx([9 / 5, 13 / 5])
    # weights 1,2,1,1,5: [3,4] + 2[3,4] + [0,1] + 5[3,4] = [24, 33], / 10
    w = torch.tensor([1, 2, 1, 1, 5], dtype=torch.float64)
    assert A.norm_bound(x, w, 5.0).tolist() == pytest.approx([2.4, 3.3])


def test_centered_clipping_iterates_around_the_centre():
    x = rows(0.5, 2, -3, 0, 10)
    # τ = 1, from 0: 0.5, 1, -1, 0, 1 -> 1.5 / 5 = 0.3
    assert A.centered_clip(x, 1.0, 1).tolist() == pytest.approx([0.3])
    # second iteration from 0.3: 0.2, 1, -1, -0.3, 1 -> 0.9 / 5 = 0.18 -> 0.48
    assert A.centered_clip(x, 1.0, 2).tolist() == pytest.approx([0.48])
    # from the centre 10 (the last round's aggregate), τ = 1: -1, -1, -1, -1, 0 -> 10 - 0.8
    assert A.centered_clip(x, 1.0, 1, torch.tensor([10.0])).tolist() == pytest.approx([9.2])


def test_mean_is_the_weighted_mean():
    w = torch.tensor([1, 1, 1, 1, 6], dtype=torch.float64)
    # (1 + 2 + 3 + 6 + 600) / 10
    assert A.aggregate("mean", FIVE, w).tolist() == pytest.approx([61.2, (100 - 300) / 10])


def test_bulyan_takes_n_equal_to_4f_plus_3():
    # n = 7 = 4f + 3 with f = 1 (the paper's bound; n > 4f + 3 refused it before): θ = n - 2f = 5, β = θ - 2f = 3.
    # Krum (n - f - 2 = 4 neighbours, squared): from {0, 1, 2, 3, 4, 50, -40} the scores of 0..4 are 30, 15, 10, 15,
    # 30 -> 2; from {0, 1, 3, 4, 50, -40}: 0: 1 + 9 + 16 + 1600 = 1626, 1: 1695, 3: 1863, 4: 1962 -> 0; from
    # {1, 3, 4, 50, -40} (every other row a neighbour): 1: 4095, 3: 4063, 4: 4062 -> 4; then 3 (4062 to all left,
    # against 1's 4086) and 1. Chosen 2, 0, 4, 3, 1: median 2, the β = 3 closest: 2, 3, 1 -> 2
    seven = rows(0, 1, 2, 3, 4, 50, -40)
    assert A.bulyan(seven, 1).tolist() == pytest.approx([2.0])
    with pytest.raises(ValueError):
        A.bulyan(rows(0, 1, 2, 3, 4, 50), 1)  # 6 < 4f + 3


def test_geometric_median_by_smoothed_weiszfeld():
    x = rows(0, 1, 2, 3, 100)
    # one step from the mean z = 106/5 = 21.2: distances 21.2, 20.2, 19.2, 18.2, 78.8, so z = Σ x_i/d_i / Σ 1/d_i
    # = (1/20.2 + 2/19.2 + 3/18.2 + 100/78.8) / (1/21.2 + 1/20.2 + 1/19.2 + 1/18.2 + 1/78.8)
    # = 1.5875423 / 0.2163935 = 7.336368
    assert A.geometric_median(x, maxiter=1).tolist() == pytest.approx([7.336368], abs=1e-6)
    # in one dimension the geometric median is the median: 2 (within the smoothing ν)
    assert A.geometric_median(x, maxiter=1000, ftol=0.0).tolist() == pytest.approx([2.0], abs=1e-4)
    # weights move it: the 100 weighing 6 of 10 is the weighted median
    w = torch.tensor([1, 1, 1, 1, 6], dtype=torch.float64)
    assert A.geometric_median(x, w, maxiter=1000, ftol=0.0).tolist() == pytest.approx([100.0], abs=1e-3)
    # RFA's stop: the objective's relative change below ftol ends it early (the default stops within 4 steps)
    assert A.geometric_median(x).tolist() != A.geometric_median(x, maxiter=1000, ftol=0.0).tolist()


def test_nearest_neighbour_mixing_averages_the_n_minus_f_nearest():
    x = rows(0, 1, 3, 7, 20)
    # f = 1: four nearest, itself included: 0, 1, 3 and 7 all take {0, 1, 3, 7} -> 11/4; 20 takes {20, 7, 3, 1} -> 31/4
    assert A.nearest_neighbor_mixing(x, 1).flatten().tolist() == [2.75, 2.75, 2.75, 2.75, 7.75]
    # f = 2: three nearest: 0, 1, 3 -> {0, 1, 3} = 4/3; 7 -> {7, 3, 1} = 11/3; 20 -> {20, 7, 3} = 10
    assert A.nearest_neighbor_mixing(x, 2).flatten().tolist() == pytest.approx([4 / 3, 4 / 3, 4 / 3, 11 / 3, 10])
    with pytest.raises(ValueError):
        A.nearest_neighbor_mixing(x, 5)


def test_bucketing_means_buckets_of_s_in_the_random_order():
    # order 4, 0, 3, 1, 2: 20, 0 | 7, 1 | 3 -> 10, 4, 3 (the last bucket smaller)
    out = A.bucketing(rows(0, 1, 3, 7, 20), 2, torch.tensor([4, 0, 3, 1, 2]))
    assert out.flatten().tolist() == [10.0, 4.0, 3.0]


def test_fltrust_trusts_by_cosine_and_rescales_to_the_servers_norm():
    server = torch.tensor([3.0, 4.0], dtype=torch.float64)  # ‖g0‖ = 5
    x = rows([6, 8], [0, 5], [-3, -4], [4, -3], [0, 0])
    # cosines 1, 20/25 = 0.8, -1, 0, (zero row) 0 -> ReLU 1, 0.8, 0, 0, 0; rescaled to norm 5: [3, 4], [0, 5];
    # (1·[3, 4] + 0.8·[0, 5]) / 1.8 = [3/1.8, 8/1.8]
    assert A.fltrust(x, server).tolist() == pytest.approx([3 / 1.8, 8 / 1.8])
    # nobody trusted: a zero update, the model stays
    assert A.fltrust(rows([-3, -4], [4, -3]), server).tolist() == [0.0, 0.0]


def test_foolsgold_weighs_down_clients_that_look_alike():
    # two Sybils with one history direction, three others: cosines minus the identity, row by row,
    # a: [0, 1, 0, 0, -1], b: [1, 0, 0, 0, -1], c: [0, 0, 0, -1, 0], d: [0, 0, -1, 0, 0], e: [-1, -1, 0, 0, 0];
    # v = 1, 1, 0, 0, 0; pardoning multiplies c, d, e's entries for a and b by 0/1; 1 - max: 0, 0, 1, 1, 1;
    # 1 -> 0.99, ln(0.99/0.01) + 0.5 > 1 -> 1; ln 0 -> 0
    history = rows([1, 0], [1, 0], [0, 1], [0, -1], [-1, 0])
    assert A.foolsgold_weights(history).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    # the round's mean with those weights, divided by n as the authors' code does: ([0,1] + [0,-1] + [-1,0]) / 5
    assert A.foolsgold(history, history).tolist() == pytest.approx([-0.2, 0.0])
    # 60° apart and one opposite: v = 0.5, 0.5, 0; 1 - max = 0.5, 0.5, 1 -> logit: ln(1) + 0.5 = 0.5, and 1
    three = rows([1, 0], [0.5, 3 ** 0.5 / 2], [-1, 0])
    assert A.foolsgold_weights(three).tolist() == pytest.approx([0.5, 0.5, 1.0])
