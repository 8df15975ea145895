"""UNIDEAL (head-only sharing + curriculum knowledge distillation) and PartialKD, its no-curriculum ablation.

Each client keeps its backbone and its local head (the student); only the local head is uploaded, and the
average of the uploaded heads comes back as the global head, the teacher. The teacher is applied to the client's
own backbone features, so clients with different architectures and input shapes can still learn from each other,
and each round moves only ``feature_dim * classes + classes`` numbers per client and direction.
Local objective per batch: ``CE(student, y) + alpha * clkd_loss(teacher, student, p)``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, ClientContext, TensorDict
from raysim.algorithms.configs.unideal import PartialKDConfig, UnidealConfig
from raysim.curriculum.clkd import clkd_loss, p_schedule
from raysim.models import HEAD_PREFIX
from raysim.registry import register_algorithm


@register_algorithm("unideal")
class Unideal(Algorithm):
    """UNIDEAL: shares the head; CLKD distils the global head on the easiest p of each batch, p growing."""

    Config = UnidealConfig
    shared = "head"
    # engine.vectorize: CLKD ranks each client's batch on its own (topk per client under vmap); p depends on the
    # epoch and round only, which a stack shares
    vectorizable = True
    uploads = Uploads.model()  # the head it downloaded, averaged as FedAvg's on the head
    # the distilled share beside accuracy: per local epoch (the course inside each round), and per round (its mean)
    tensorboard_charts = {"curriculum p per local epoch": [r"^Curriculum/p_epoch$"],
                          "curriculum p per round (mean)": [r"^Curriculum/p$"]}

    # ------------------------------------------------------------------ the curriculum
    def fraction(self, ctx: ClientContext) -> float:
        """The kept fraction p for the current local epoch of the current round."""
        s = self.config.schedule
        start = s.start if s.start is not None else 1.0 / self.cfg.train.batch_size
        return p_schedule(start, s.end, s.shape, s.over, epoch=ctx.epoch, num_epochs=ctx.num_epochs,
                          round=ctx.round, total_rounds=ctx.total_rounds)

    @property
    def metric(self) -> str:
        return self.config.metric

    @property
    def kd_norm(self) -> str:
        return self.config.kd_norm

    # ------------------------------------------------------------------ client side
    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """Backbone and local head come from the client's own state; the global head stays in the payload."""
        if ctx.state:
            model.load_state_dict(ctx.state, strict=False)

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        features = model.features(x)
        student = model.head(features)
        teacher = teacher_logits(model, features, ctx.payload)
        ce = F.cross_entropy(student, y)
        kd = clkd_loss(teacher, student, self.fraction(ctx), self.metric, self.kd_norm)
        return ce + self.config.alpha * kd, {"ce": ce, "clkd": kd}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> TensorDict:
        """Everything stays: the backbone and the local head (only a copy of the head is uploaded)."""
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, Any]:
        """``p``: the round's distilled share, averaged over its local epochs (TensorBoard: Curriculum/p), and
        ``p_epochs``: its value in each local epoch, first to last (the schedule is a pure function of the epoch and
        the round, so the driver computes what every client used; TensorBoard: Curriculum/p_epoch, each local
        epoch's value held over its share of the round's 100 steps, and the console's ``p start→end``)."""
        n = self.cfg.train.local_epochs
        ps = [float(self.fraction(ClientContext(client_id=-1, round=round, total_rounds=self.cfg.rounds, epoch=e,
                                                num_epochs=n, payload={}))) for e in range(n)]
        return {"p": float(sum(ps) / len(ps)), "p_epochs": ps}


def teacher_logits(model: nn.Module, features: torch.Tensor, payload: dict[str, Any]) -> torch.Tensor:
    """The global head applied to this client's own features, outside autograd (the teacher is never trained)."""
    params = {k[len(HEAD_PREFIX):]: v for k, v in payload["model"].items() if k.startswith(HEAD_PREFIX)}
    with torch.no_grad():
        return functional_call(model.head, params, (features.detach(),))


@register_algorithm("partialkd")
class PartialKD(Unideal):
    """UNIDEAL's ablation: the same distillation from the global head, on every sample from the start."""

    Config = PartialKDConfig
    tensorboard_charts = {}  # p is 1 throughout: no curriculum to chart
    vectorizable = True  # engine.vectorize: UNIDEAL's loss with p = 1

    def fraction(self, ctx: ClientContext) -> float:
        return 1.0

    @property
    def metric(self) -> str:
        return "cosine"  # irrelevant: a fraction of 1.0 keeps every sample whatever the scores

    @property
    def kd_norm(self) -> str:
        return "batch"  # irrelevant too: every sample kept, so both divisors are B
