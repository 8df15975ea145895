"""CLKD (raysim.curriculum.clkd) against direct hand computations, no Ray."""

from __future__ import annotations

import math

import pytest
import torch

from raysim.curriculum.clkd import clkd_loss, curriculum_mask, kept_count, mutual_scores, p_schedule

# rows 0 and 3 tie under l1 and l2 (both differ by 1 in one logit): the hand computations cover ties too
T = torch.tensor([[2.0, 0.0, -1.0], [1.0, 1.0, 1.0], [0.0, 3.0, 0.0], [-1.0, 0.5, 2.0]], dtype=torch.float64)
S = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [-1.0, 0.5, 1.0]], dtype=torch.float64)


def hand_scores(metric: str) -> list[float]:
    out = []
    for t, s in zip(T.tolist(), S.tolist()):
        if metric == "cosine":
            dot = sum(a * b for a, b in zip(t, s))
            out.append(dot / (math.sqrt(sum(a * a for a in t)) * math.sqrt(sum(b * b for b in s))))
        elif metric == "l1":
            out.append(1.0 / (sum(abs(a - b) for a, b in zip(t, s)) + 1e-8))
        else:
            out.append(1.0 / (math.sqrt(sum((a - b) ** 2 for a, b in zip(t, s))) + 1e-8))
    return out


def hand_kl(t: list[float], s: list[float]) -> float:
    zt, zs = sum(math.exp(a) for a in t), sum(math.exp(b) for b in s)
    return sum(math.exp(a) / zt * (math.log(math.exp(a) / zt) - math.log(math.exp(b) / zs)) for a, b in zip(t, s))


def hand_loss(metric: str, fraction: float) -> float:
    scores = hand_scores(metric)
    b = len(scores)
    n = min(max(math.floor(fraction * b + 0.5), 1), b)
    threshold = sorted(scores, reverse=True)[n - 1]
    return sum(hand_kl(t, s) for t, s, sc in zip(T.tolist(), S.tolist(), scores) if sc >= threshold) / b


@pytest.mark.parametrize("metric", ["cosine", "l1", "l2"])
def test_scores_match_hand_computation(metric):
    assert torch.allclose(mutual_scores(T, S, metric), torch.tensor(hand_scores(metric), dtype=torch.float64))


@pytest.mark.parametrize("metric", ["cosine", "l1", "l2"])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.6, 0.9, 1.0])
def test_clkd_loss_matches_hand_computation(metric, fraction):
    got = clkd_loss(T, S, fraction, metric)
    assert got.item() == pytest.approx(hand_loss(metric, fraction), rel=1e-10, abs=1e-12)


def test_fraction_rounding_and_extremes():
    # n = clamp(floor(p * B + 0.5), 1, B), with B = 4
    assert [kept_count(4, p) for p in (0.0, 0.1, 0.124, 0.125, 0.375, 0.874, 0.875, 1.0)] == [1, 1, 1, 1, 2, 3, 4, 4]
    scores = torch.tensor([0.3, 0.9, 0.1, 0.5])
    assert curriculum_mask(scores, 0.1).tolist() == [False, True, False, False]  # rounds to 1: the easiest only
    assert curriculum_mask(scores, 0.95).tolist() == [True] * 4  # rounds to B: all
    assert curriculum_mask(scores, 0.5).tolist() == [False, True, False, True]
    # the loss at the extremes: one sample (the easiest) vs. the mean KL over all samples
    easiest = int(torch.tensor(hand_scores("cosine")).argmax())
    assert clkd_loss(T, S, 0.1).item() == pytest.approx(hand_kl(T[easiest].tolist(), S[easiest].tolist()) / 4)
    full = sum(hand_kl(t, s) for t, s in zip(T.tolist(), S.tolist())) / 4
    assert clkd_loss(T, S, 1.0, "l2").item() == pytest.approx(full)


def test_ties_at_the_threshold_are_kept():
    scores = torch.tensor([0.2, 0.7, 0.7, 0.7, 0.1])
    assert curriculum_mask(scores, 0.2).tolist() == [False, True, True, True, False]  # n = 1, three tie at the top
    # identical teacher/student rows tie exactly; all of them are distilled even though n = 1
    t = torch.tensor([[1.0, 2.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    s = torch.tensor([[2.0, 4.0, 0.0], [2.0, 4.0, 0.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    kl = hand_kl(t[0].tolist(), s[0].tolist())
    assert clkd_loss(t, s, 0.0, "cosine").item() == pytest.approx(2 * kl / 3)
    assert clkd_loss(t, s, 0.0, "l1").item() == pytest.approx(2 * kl / 3)


def test_gradient_reaches_student_only():
    teacher = T.clone().requires_grad_(True)
    student = S.clone().requires_grad_(True)
    clkd_loss(teacher, student, 1.0).backward()
    assert teacher.grad is None
    assert student.grad is not None and student.grad.abs().sum() > 0
    # analytic gradient of mean KL(p_t || p_s) w.r.t. student logits: (softmax(s) - softmax(t)) / B
    expected = (torch.softmax(S, 1) - torch.softmax(T, 1)) / len(S)
    assert torch.allclose(student.grad, expected)


def test_masked_samples_get_no_gradient():
    student = S.clone().requires_grad_(True)
    clkd_loss(T, student, 0.25, "cosine").backward()
    kept = curriculum_mask(mutual_scores(T, S, "cosine"), 0.25)
    assert kept.sum() == 1
    assert (student.grad[~kept] == 0).all() and student.grad[kept].abs().sum() > 0


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="metric"):
        mutual_scores(T, S, "kl")
    with pytest.raises(ValueError, match="fraction"):
        curriculum_mask(torch.ones(3), 1.5)
    with pytest.raises(ValueError):
        mutual_scores(T, S[:, :2])


def test_p_schedule():
    kw = dict(round=1, total_rounds=10)
    # over local epochs: first epoch uses start, last uses end, linear in between
    assert [p_schedule(0.2, 1.0, "linear", "local_epochs", epoch=e, num_epochs=5, **kw) for e in range(5)] == \
        pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert p_schedule(0.2, 1.0, "linear", "local_epochs", epoch=0, num_epochs=1, **kw) == 1.0
    assert [p_schedule(0.1, 0.9, "step", "local_epochs", epoch=e, num_epochs=4, **kw) for e in range(4)] == \
        [0.1, 0.1, 0.9, 0.9]
    assert p_schedule(0.1, 0.7, "constant", "local_epochs", epoch=0, num_epochs=4, **kw) == 0.7
    # over rounds: epochs don't matter
    got = [p_schedule(0.0, 1.0, "linear", "rounds", epoch=3, num_epochs=5, round=r, total_rounds=5)
           for r in range(1, 6)]
    assert got == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    with pytest.raises(ValueError):
        p_schedule(0.1, 1.0, "cosine", "rounds", epoch=0, num_epochs=1, round=1, total_rounds=1)


def test_kd_norm_batch_and_kept_by_hand():
    """Two classes, B = 4. Rows 0 and 1: teacher uniform, student (1/4, 3/4) (logits differ by ln 3), so each KL is
    0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3); their cosines are 0.94 and 0.98. Rows 2 and 3: teacher and
    student point opposite ways (cosine -1). p = 0.5 keeps n = 2: rows 0 and 1."""
    ln3 = math.log(3.0)
    t = torch.tensor([[1.0, 1.0], [2.0, 2.0], [1.0, -1.0], [1.0, -1.0]], dtype=torch.float64)
    s = torch.tensor([[1.0, 1.0 + ln3], [2.0, 2.0 + ln3], [-1.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    kl = 0.5 * math.log(4.0 / 3.0)
    assert curriculum_mask(mutual_scores(t, s), 0.5).tolist() == [True, True, False, False]
    assert clkd_loss(t, s, 0.5, norm="batch").item() == pytest.approx(2 * kl / 4)  # divided by B = 4
    assert clkd_loss(t, s, 0.5, norm="kept").item() == pytest.approx(2 * kl / 2)  # divided by the 2 kept
    assert clkd_loss(t, s, 0.5).item() == clkd_loss(t, s, 0.5, norm="batch").item()  # the default
    assert clkd_loss(t, s, 0.25, norm="kept").item() == pytest.approx(kl)  # n = 1: row 1 (cosine 0.98) alone
    # every sample kept: the two agree
    assert clkd_loss(t, s, 1.0, norm="kept").item() == pytest.approx(clkd_loss(t, s, 1.0, norm="batch").item())
    with pytest.raises(ValueError, match="normalisation"):
        clkd_loss(t, s, 0.5, norm="mean")


def test_kd_norm_is_a_checked_config_key():
    from raysim.config import ConfigError, load_config

    assert load_config(None, ["algorithm.name=unideal"]).algorithm.kd_norm == "batch"
    assert load_config(None, ["algorithm.name=unideal", "algorithm.kd_norm=kept"]).algorithm.kd_norm == "kept"
    with pytest.raises(ConfigError, match="algorithm.kd_norm"):
        load_config(None, ["algorithm.name=unideal", "algorithm.kd_norm=mean"])
