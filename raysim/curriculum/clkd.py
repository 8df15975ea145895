"""CLKD: UNIDEAL's teacher-student mutual-evaluation curriculum for knowledge distillation.

The teacher is the global head applied to a client's own backbone features, the student is the client's local
head. Per batch, samples on which teacher and student already agree ("easy" ones) are distilled first; the kept
fraction ``p`` grows over training (see :func:`p_schedule`). The seed's text about ``p`` contradicts itself; raysim
reads it as: the kept fraction grows from one sample per batch to the whole batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from raysim.algorithms.configs.unideal import METRICS, NORMS, OVERS, SHAPES

_EPS = 1e-8


def mutual_scores(teacher_logits: torch.Tensor, student_logits: torch.Tensor, metric: str = "cosine") -> torch.Tensor:
    """Per-sample teacher-student agreement on raw logits [B, C] -> [B]; higher means easier.

    ``cosine``: cosine similarity; ``l1`` / ``l2``: ``1 / (||t - s|| + 1e-8)`` with that norm.
    """
    if teacher_logits.shape != student_logits.shape or teacher_logits.dim() != 2:
        raise ValueError(f"teacher and student logits must both be [B, C], got {tuple(teacher_logits.shape)} "
                         f"and {tuple(student_logits.shape)}")
    if metric == "cosine":
        return F.cosine_similarity(teacher_logits, student_logits, dim=1)
    if metric in ("l1", "l2"):
        norm = (teacher_logits - student_logits).norm(p=1 if metric == "l1" else 2, dim=1)
        return 1.0 / (norm + _EPS)
    raise ValueError(f"unknown CLKD metric {metric!r}; known: {', '.join(METRICS)}")


def kept_count(batch: int, fraction: float) -> int:
    """How many samples a fraction keeps: ``clamp(floor(fraction * B + 0.5), 1, B)`` (round half up)."""
    return min(max(int(math.floor(fraction * batch + 0.5)), 1), batch)


def curriculum_mask(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Keep the easiest samples: those scoring at least the n-th largest score (ties at the threshold are kept)."""
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(f"scores must be a non-empty vector [B], got shape {tuple(scores.shape)}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    n = kept_count(scores.numel(), fraction)
    threshold = torch.topk(scores.detach(), n, sorted=True).values[-1]
    return scores.detach() >= threshold


def clkd_loss(teacher_logits: torch.Tensor, student_logits: torch.Tensor, fraction: float,
              metric: str = "cosine", norm: str = "batch") -> torch.Tensor:
    """``(1/N) * sum_i mask_i * KL(softmax(teacher_i) || softmax(student_i))``; the teacher gets no gradient.

    ``norm`` chooses N. ``batch`` (the default): N = B, the batch size. The seed's Eq. (5) is a sum over the batch
    of the indicator times the KL, averaged over the client's E batches; the surrounding text names no count of
    kept samples, so raysim reads the per-batch divisor as B (and it has always run so). Then the term's weight
    grows with p: early in the curriculum the few easy samples pull gently, and the full distillation strength
    alpha arrives only when every sample is kept. ``kept``: N = the number of kept samples, a per-sample mean over
    the kept ones, so alpha is the strength at every stage and one easy sample pulls as hard as a whole batch.
    The two agree when every sample is kept (p = 1, PartialKD).
    """
    teacher = teacher_logits.detach()
    mask = curriculum_mask(mutual_scores(teacher, student_logits.detach(), metric), fraction)
    log_t = F.log_softmax(teacher, dim=1)
    log_s = F.log_softmax(student_logits, dim=1)
    kl = (log_t.exp() * (log_t - log_s)).sum(dim=1)
    if norm == "batch":
        denominator = student_logits.shape[0]
    elif norm == "kept":
        denominator = mask.sum()
    else:
        raise ValueError(f"unknown CLKD normalisation {norm!r}; known: {', '.join(NORMS)}")
    return (kl * mask.to(kl.dtype)).sum() / denominator


def p_schedule(start: float, end: float, shape: str, over: str, *, epoch: int, num_epochs: int, round: int,
               total_rounds: int) -> float:
    """The kept fraction ``p`` at a point of training.

    Progress ``t`` runs from 0 to 1 over the local epochs of each round (``epoch`` is 0-based: the first epoch uses
    ``start``, the last ``end``; a single epoch counts as the last) or over the rounds (``round`` is 1-based).
    ``linear``: ``start + (end - start) * t``; ``step``: ``start`` for ``t < 0.5``, then ``end``;
    ``constant``: ``end`` throughout (``end=1.0`` is PartialKD: no curriculum).
    """
    if over == "local_epochs":
        t = epoch / (num_epochs - 1) if num_epochs > 1 else 1.0
    elif over == "rounds":
        t = (round - 1) / (total_rounds - 1) if total_rounds > 1 else 1.0
    else:
        raise ValueError(f"unknown schedule span {over!r}; known: {', '.join(OVERS)}")
    t = min(max(t, 0.0), 1.0)
    if shape == "linear":
        return start + (end - start) * t
    if shape == "step":
        return start if t < 0.5 else end
    if shape == "constant":
        return end
    raise ValueError(f"unknown schedule shape {shape!r}; known: {', '.join(SHAPES)}")
