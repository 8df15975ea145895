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
