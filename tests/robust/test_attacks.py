"""Each attack's upload (or data), worked by hand; the malicious set is a function of (seed, num, fraction)."""

from __future__ import annotations

import pytest
import torch

from raysim.robust import attacks as T


def rows(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).reshape(len(values), -1)


HONEST_AND_ONE = rows(1, 2, 3, 4, 10)  # the last row is the malicious client's own update
BAD = [False, False, False, False, True]


def test_the_malicious_set_depends_on_seed_num_and_fraction_alone():
    a = T.malicious_clients(0, 20, 0.2)
    assert len(a) == 4 and a == sorted(a) and a == T.malicious_clients(0, 20, 0.2)
    assert a != T.malicious_clients(1, 20, 0.2)
    assert T.malicious_clients(0, 20, 0.0) == []
    assert len(T.malicious_clients(3, 10, 0.25)) == 3  # 2.5 rounds half up


def test_label_flip_maps_y_to_c_minus_1_minus_y():
    assert T.flip_labels(torch.tensor([0, 3, 9]), 10).tolist() == [9, 6, 0]


def test_the_trigger_is_a_square_in_the_bottom_right_corner():
    x = torch.zeros(2, 1, 4, 4)
    out = T.add_trigger(x, 2, 1.0)
    assert out[:, :, 2:, 2:].eq(1).all() and out.sum() == 8 and x.sum() == 0
    flat = T.add_trigger(torch.zeros(1, 5), 2, 3.0)
    assert flat.tolist() == [[0, 0, 0, 3, 3]]


def test_the_backdoor_poisons_a_share_of_the_rows_with_the_target():
    x = torch.zeros(4, 1, 3, 3)
    x[:, 0, 0, 0] = 2.0  # the brightest value: the trigger's
    y = torch.tensor([1, 2, 3, 4])
    px, py = T.poison_train_data("backdoor", x, y, 10, target=0, share=0.5, trigger=1,
                                 gen=torch.Generator().manual_seed(0))
    poisoned = (py == 0).nonzero().flatten()
    assert len(poisoned) == 2
    assert px[poisoned, 0, 2, 2].eq(2.0).all() and px[:, 0, 2, 2].sum() == 4.0
    fx, fy = T.poison_train_data("label_flip", x, y, 10, target=0, share=0.5, trigger=1, gen=torch.Generator())
    assert fy.tolist() == [8, 7, 6, 5] and fx is x


def test_sign_flip_sends_minus_scale_delta():
    out = T.poison_updates("sign_flip", HONEST_AND_ONE, BAD, scale=2.0)
    assert out.flatten().tolist() == [1, 2, 3, 4, -20]


def test_scaling_boosts_by_n_over_eta():
    # n = 5 clients, η = 1: γ = 5
    assert T.poison_updates("scaling", HONEST_AND_ONE, BAD).flatten().tolist() == [1, 2, 3, 4, 50]
    assert T.poison_updates("scaling", HONEST_AND_ONE, BAD, server_lr=0.5).flatten()[-1] == 100
    assert T.poison_updates("scaling", HONEST_AND_ONE, BAD, boost=3.0).flatten()[-1] == 30


def test_alie_uses_the_papers_z_and_the_honest_statistics():
    # n = 5, f = 1: s = floor(5/2 + 1) - 1 = 2, z = Φ^-1((5 - 2) / 5) = Φ^-1(0.6) = 0.2533471
    assert T.alie_z(5, 1) == pytest.approx(0.2533471, abs=1e-7)
    # honest 1, 2, 3, 4: mean 2.5, population std sqrt(5/4) = 1.1180340
    out = T.poison_updates("alie", HONEST_AND_ONE, BAD)
    assert out.flatten().tolist()[:4] == [1, 2, 3, 4]
    assert float(out[4]) == pytest.approx(2.5 - 0.2533471 * 1.1180340, abs=1e-6)
    assert float(T.poison_updates("alie", HONEST_AND_ONE, BAD, z=1.0)[4]) == pytest.approx(2.5 - 1.1180340)


def test_ipm_sends_minus_epsilon_times_the_honest_mean():
    assert float(T.poison_updates("ipm", HONEST_AND_ONE, BAD)[4]) == pytest.approx(-0.25)
    assert float(T.poison_updates("ipm", HONEST_AND_ONE, BAD, epsilon=2.0)[4]) == pytest.approx(-5.0)


def test_gaussian_is_seeded_and_has_sigma():
    big = torch.zeros(2, 20000, dtype=torch.float64)
    gens = [None, torch.Generator().manual_seed(7)]
    a = T.poison_updates("gaussian", big, [False, True], sigma=200.0, gens=gens)
    b = T.poison_updates("gaussian", big, [False, True], sigma=200.0, gens=[None, torch.Generator().manual_seed(7)])
    assert torch.equal(a, b) and a[0].abs().sum() == 0
    assert float(a[1].std()) == pytest.approx(200.0, rel=0.03)


def test_no_malicious_row_changes_nothing():
    assert T.poison_updates("alie", HONEST_AND_ONE, [False] * 5) is HONEST_AND_ONE


def test_scaling_shares_the_boost_so_that_the_mean_lands_on_the_attackers_model():
    w = torch.tensor([1, 1, 1, 1, 6], dtype=torch.float64)  # W = 10, the attacker weighs 6
    # one attacker: γ = W / (f w η) = 10 / 6; the weighted mean (1 + 2 + 3 + 4 + 6·10·10/6) / 10 = 11: the honest
    # part 1 plus the attacker's whole update 10
    out = T.poison_updates("scaling", HONEST_AND_ONE, BAD, weights=w)
    assert float(out[4]) == pytest.approx(100 / 6)
    assert float((out.flatten() * w).sum() / w.sum()) == pytest.approx(11.0)
    # two attackers (rows 3 and 4, weights 1 and 6): γ = 10/2 and 10/12; their share of the mean
    # (1·5·4 + 6·(10/12)·10) / 10 = 7, the mean of their updates (4 + 10) / 2, not f times it
    assert T.scaling_boosts(w, [3, 4]) == pytest.approx([5.0, 10 / 12])
    assert T.scaling_boosts(w, [4], server_lr=0.5) == pytest.approx([20 / 6])


def test_alie_z_variants():
    # n = 20, f = 4: s = 11 - 4 = 7; Baruch et al.: Φ^-1(13/20) = Φ^-1(0.65) = 0.385; Karimireddy et al.'s code:
    # Φ^-1((16 - 7)/16) = Φ^-1(0.5625) = 0.157
    assert T.alie_z(20, 4) == pytest.approx(0.3853205, abs=1e-6)
    assert T.alie_z(20, 4, "karimireddy") == pytest.approx(0.1573107, abs=1e-6)
    # n = 5, f = 1: s = 2, (5 - 1 - 2)/(5 - 1) = 1/2 -> 0
    assert T.alie_z(5, 1, "karimireddy") == 0.0
    out = T.poison_updates("alie", HONEST_AND_ONE, BAD, z_rule="karimireddy")
    assert float(out[4]) == pytest.approx(2.5)


def test_min_max_and_min_sum_by_hand():
    honest = rows(0, 1, 2, 5)  # mean 2, unit vector +1: the update is 2 - γ
    # min-max: the largest squared distance between honest updates is (5 - 0)² = 25; the farthest honest update
    # from 2 - γ is 5: (3 + γ)² <= 25 -> γ = 2 -> 0 (the halving search stops within 1e-5 below it)
    assert T.min_max(honest).tolist() == pytest.approx([0.0], abs=1e-4)
    # min-sum: each honest update's sum of squared distances: 0: 30, 1: 18, 2: 14, 5: 50 -> 50; the candidate's is
    # Σ (h - 2)² + 4γ² = 14 + 4γ² <= 50 -> γ = 3 -> -1
    assert T.min_sum(honest).tolist() == pytest.approx([-1.0], abs=1e-4)
    # sign and std perturbations: sign(2) = 1 the same here; the sample std of 0, 1, 2, 5 is sqrt(14/3)
    assert T.min_max(honest, "sign").tolist() == pytest.approx([0.0], abs=1e-4)
    std = (14 / 3) ** 0.5  # (3 + γ·std)² <= 25 -> γ std = 2
    assert T.min_max(honest, "std").tolist() == pytest.approx([0.0], abs=1e-4) and std > 0
    out = T.poison_updates("minsum", rows(0, 1, 2, 5, 9), [False] * 4 + [True])
    assert out.flatten().tolist()[:4] == [0, 1, 2, 5] and float(out[4]) == pytest.approx(-1.0, abs=1e-4)


def test_fang_trim_pushes_each_coordinate_past_the_honest_extremes():
    x = rows([1, -1, -3, 2], [2, -2, 1, -1], [3, -3, 1, -1], [4, -4, 1, -1], [5, -5, -1, 1])
    # sums 15, -15, -1, 0 -> s = +, -, -, 0. Column 0: s > 0, min 1 > 0 -> 1/r; column 1: s < 0, max -1 < 0 ->
    # -1/r; column 2: s < 0, max 1 > 0 -> 1·r; column 3: s = 0 -> 0. r ~ U[1, 2) per coordinate from the generator
    r = (1 + torch.rand(4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)).tolist()
    out = T.fang_trim(x, torch.Generator().manual_seed(3))
    assert out.tolist() == pytest.approx([1 / r[0], -1 / r[1], r[2], 0.0])
    assert 0.5 < out[0] <= 1 and 1 <= out[2] < 2


def test_fang_krum_by_hand():
    import math

    # honest (10, 1), (-10, 1), (1, 10), (1, -10), the attacker's own (1, 1): s = sign of the sum (3, 3) = (1, 1).
    # λ's bound: n - 2c - 1 = 2, each honest update's 2 nearest honest (Euclidean): (10, 1): 9√2 + √202,
    # (-10, 1): √202 + 11√2, (1, 10): 9√2 + √202, (1, -10): √202 + 11√2 -> min 9√2 + √202; plus max ‖h‖/√d =
    # √101/√2: λ0 = (9√2 + √202)/(2√2) + √(101/2) = 16.63. Krum (f = 1, 2 nearest, squared) at -λ0(1, 1): 2·354.8
    # against (10, 1)'s 162 + 202 = 364: not chosen. At λ0/2 = 8.32: (-8.32, -8.32) scores 2·89.7 = 179.4, below
    # every honest one ((1, -10): 89.7 + 202): chosen
    x = rows([10, 1], [-10, 1], [1, 10], [1, -10], [1, 1])
    lam = ((9 * math.sqrt(2) + math.sqrt(202)) / (2 * math.sqrt(2)) + math.sqrt(101 / 2)) / 2
    assert T.fang_krum(x, [4]).tolist() == pytest.approx([-lam, -lam])
    # one dimension, honest 1..4 and the attacker's 5: λ0 = 2/(2·1) + 4 = 5, and Krum never picks -λ (2 scores 2,
    # -λ scores at least 1 + 4): halved while λ >= 1e-5, 5/2^19
    assert T.fang_krum(rows(1, 2, 3, 4, 5), [4]).tolist() == pytest.approx([-5 / 2 ** 19])
    # every malicious row sends it
    out = T.poison_updates("fang_krum", torch.cat([x, rows([2, 2])]), [False] * 4 + [True, True])
    assert torch.equal(out[4], out[5]) and out[:4].tolist() == x[:4].tolist()


def test_mimic_learns_the_direction_of_largest_variance_and_copies_its_extreme():
    honest = rows([0, 0], [4, 0], [2, 1], [2, -1])
    # μ = (2, 0); centred (-2, 0), (2, 0), (0, 1), (0, -1); from z = (0.6, 0.8) one power step
    # Σ ⟨c, z⟩ c = (8·0.6, 2·0.8) = (4.8, 1.6) -> (3, 1)/√10; ⟨h, z⟩ = 0, 12, 7, 5 (x √10) -> the second
    mu, z = T.mimic_direction(honest, None, torch.tensor([0.6, 0.8], dtype=torch.float64), 0)
    assert mu.tolist() == [2.0, 0.0] and z.tolist() == pytest.approx([3 / 10 ** 0.5, 1 / 10 ** 0.5])
    assert T.mimic_target(honest, z) == 1
    # the next warm-up round averages: μ stays (2, 0); the step from (3, 1)/√10 is (24, 2)/√580; z = their mean,
    # normalised
    _, z2 = T.mimic_direction(honest, mu, z, 1)
    step = torch.tensor([24.0, 2.0], dtype=torch.float64) / 580 ** 0.5
    mean = (z + step) / 2
    assert z2.tolist() == pytest.approx((mean / mean.norm()).tolist())
    out = T.poison_updates("mimic", torch.cat([honest, rows([9, 9])]), [False] * 4 + [True], mimic=1)
    assert out[4].tolist() == [4.0, 0.0]


def test_dba_plants_one_bar_of_the_global_trigger_per_client():
    # Xie et al.'s MNIST pattern: bars of 4, gap 2: rows 0 and 3, columns 0-3 and 6-9
    assert T.dba_bars(4, 2) == [(0, 0), (0, 6), (3, 0), (3, 6)]
    x = torch.zeros(4, 1, 8, 8)
    x[:, 0, 7, 7] = 2.0  # the brightest value: the trigger's
    y = torch.tensor([1, 2, 3, 4])
    px, py = T.poison_train_data("dba", x, y, 10, target=0, share=1.0, trigger=2, gen=torch.Generator(),
                                 bars=[T.dba_bars(3, 2)[1]], bar_size=3)
    # part 1 of size 3, gap 2: row 0, columns 5-7, on every row of the batch
    assert py.tolist() == [0, 0, 0, 0] and px[:, 0, 0, 5:8].eq(2.0).all() and px[:, 0].sum() == 4 * (3 * 2 + 2)
    glob = T.add_bars(torch.zeros(1, 1, 8, 8), T.dba_bars(3, 2), 3, 1.0)
    assert glob.sum() == 12 and glob[0, 0, 3, 0:3].eq(1).all()
