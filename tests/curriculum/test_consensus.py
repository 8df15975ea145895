"""The consensus controller's rule on hand-made accuracy sequences."""

from __future__ import annotations

import io

import pytest
import torch

from raysim.curriculum.consensus import ConsensusController, is_stable


def _run(ctrl: ConsensusController, accs: list[float]) -> list[int]:
    return [ctrl.update(a) for a in accs]


def test_not_stable_until_the_window_is_full():
    ctrl = ConsensusController(k0=8, delta_k=5, epsilon=0.005, window=3, max_dim=64)
    assert ctrl.k == 8 and ctrl.stable is None
    assert ctrl.update(0.5) == 8 and ctrl.stable is False
    assert ctrl.update(0.5) == 8 and ctrl.stable is False  # two accuracies, window 3
    assert ctrl.update(0.5) == 13 and ctrl.stable is True


def test_an_unstable_round_keeps_k():
    ctrl = ConsensusController(8, 5, 0.005, 3, 64)
    assert _run(ctrl, [0.50, 0.50, 0.51]) == [8, 8, 8]  # |0.51 - 0.50| >= epsilon
    # every earlier accuracy in the window is compared with the current one, not just the previous
    assert not is_stable([0.500, 0.004 + 0.500, 0.008 + 0.500], 0.005, 3)
    assert not is_stable([0.5, 0.5, 0.505], 0.005, 3)  # strictly below epsilon


def test_plateau_grows_k_every_stable_round_then_resets_on_a_jump():
    ctrl = ConsensusController(8, 5, 0.005, 3, 64)
    accs = [0.30, 0.45, 0.52, 0.520, 0.522, 0.521, 0.523, 0.60, 0.601, 0.602]
    # round:  1    2     3     4      5      6      7      8     9      10
    # stable: -    -     no    no     yes    yes    yes    no    no     yes
    assert _run(ctrl, accs) == [8, 8, 8, 8, 13, 18, 23, 23, 23, 28]


def test_k_is_capped_at_the_teacher_dimension():
    ctrl = ConsensusController(8, 5, 0.005, 2, max_dim=20)
    assert _run(ctrl, [0.7] * 6) == [8, 13, 18, 20, 20, 20]


def test_window_one_is_always_stable():
    assert _run(ConsensusController(1, 2, 0.0, 1, 6), [0.1, 0.9, 0.2, 0.3]) == [3, 5, 6, 6]


def test_state_dict_round_trip_continues_the_same_curriculum():
    accs = [0.30, 0.45, 0.52, 0.520, 0.522, 0.521, 0.523, 0.60, 0.601, 0.602]
    whole = ConsensusController(8, 5, 0.005, 3, 64)
    expected = _run(whole, accs)
    first = ConsensusController(8, 5, 0.005, 3, 64)
    _run(first, accs[:5])
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)  # the checkpoint path: plain values only
    buf.seek(0)
    second = ConsensusController(8, 5, 0.005, 3, 64)
    second.load_state_dict(torch.load(buf, weights_only=True))
    assert second.k == first.k and second.history == first.history and second.stable == first.stable
    assert expected[5:] == _run(second, accs[5:])


def test_invalid_arguments():
    for args in [(0, 5, 0.1, 3, 8), (9, 5, 0.1, 3, 8), (1, -1, 0.1, 3, 8), (1, 1, -0.1, 3, 8), (1, 1, 0.1, 0, 8)]:
        with pytest.raises(ValueError):
            ConsensusController(*args)
    with pytest.raises(ValueError):
        ConsensusController(1, 1, 0.1, 3, 8).load_state_dict({"k": 9})
