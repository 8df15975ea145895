"""UNIDEAL (head-only sharing + curriculum knowledge distillation) and PartialKD, its no-curriculum ablation.

Each client keeps its backbone and its local head (the student); only the local head is uploaded, and the
average of the uploaded heads comes back as the global head, the teacher. The teacher is applied to the client's
own backbone features, so clients with different architectures and input shapes can still learn from each other,
and each round moves only ``feature_dim * classes + classes`` numbers per client and direction.
Local objective per batch: ``CE(student, y) + alpha * clkd_loss(teacher, student, p)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from raysim.algorithms.base import Algorithm, ClientContext, TensorDict
from raysim.config import AlgorithmConfig, ExperimentConfig, require
from raysim.curriculum.clkd import METRICS, NORMS, OVERS, SHAPES, clkd_loss, p_schedule
from raysim.models import HEAD_PREFIX
from raysim.registry import register_algorithm


@dataclass
class ScheduleConfig:
    """The p-schedule: the share of each batch that CLKD distils, from ``start`` to ``end``."""

    start: Optional[float] = None  # null: one sample per batch (1 / train.batch_size)
    end: float = 1.0  # share distilled at the end of the schedule, in (0, 1]
    over: str = "local_epochs"  # local_epochs (restarts every round) | rounds (spans the whole run)
    shape: str = "linear"  # linear | step (start, then end from half-way) | constant (end throughout)

    def validate(self) -> None:
        if self.start is not None:
            require(0.0 < self.start <= 1.0, "algorithm.schedule.start", f"must be in (0, 1], got {self.start}")
        require(0.0 < self.end <= 1.0, "algorithm.schedule.end", f"must be in (0, 1], got {self.end}")
        require(self.over in OVERS, "algorithm.schedule.over",
                 f"must be one of {', '.join(OVERS)}, got {self.over!r}")
        require(self.shape in SHAPES, "algorithm.schedule.shape",
                 f"must be one of {', '.join(SHAPES)}, got {self.shape!r}")


@dataclass
class PartialKDConfig(AlgorithmConfig):
    name: str = "partialkd"
    alpha: float = 1.0  # strength of the distillation term

    def validate(self) -> None:
        require(self.alpha >= 0, "algorithm.alpha", f"must be >= 0, got {self.alpha}")


@dataclass
class UnidealConfig(PartialKDConfig):
    name: str = "unideal"
    metric: str = "cosine"  # teacher-student score that orders samples from easy to hard: cosine | l1 | l2
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    kd_norm: str = "batch"  # CLKD's divisor: batch (the batch size B) | kept (the kept samples); see clkd_loss

    def validate(self) -> None:
        super().validate()
        require(self.metric in METRICS, "algorithm.metric", f"must be one of {', '.join(METRICS)}, got {self.metric!r}")
        require(self.kd_norm in NORMS, "algorithm.kd_norm", f"must be one of {', '.join(NORMS)}, got {self.kd_norm!r}")
        self.schedule.validate()


@register_algorithm("unideal")
class Unideal(Algorithm):
    """UNIDEAL: shares the head; CLKD distils the global head on the easiest p of each batch, p growing."""

    Config = UnidealConfig
    shared = "head"
    # engine.vectorize: CLKD ranks each client's batch on its own (topk per client under vmap); p depends on the
    # epoch and round only, which a cohort shares
    vectorizable = True
    averages_models = True  # asynchronous.mode: the server step is the head average (FedAvg's, on the head)
    # the distilled share beside accuracy: per local epoch (the course inside each round), and per round (its mean)
    tensorboard_charts = {"curriculum p per local epoch": [r"^curriculum/p_epoch$"],
                          "curriculum p per round (mean)": [r"^curriculum/p$"]}

    @classmethod
    def config_warnings(cls, cfg: ExperimentConfig) -> list[str]:
        """A p-schedule over the local epochs cannot move with one local epoch: p stays at its end value."""
        schedule = getattr(cfg.algorithm, "schedule", None)  # PartialKD has none
        if (schedule is not None and schedule.over == "local_epochs" and cfg.train.local_epochs == 1
                and schedule.shape != "constant"):
            exact = " (exactly PartialKD)" if schedule.end == 1.0 else ""
            return [f"unideal's p-schedule runs over the local epochs, and with train.local_epochs=1 a single epoch "
                    f"counts as the last: p stays at algorithm.schedule.end={schedule.end} every round{exact}, the "
                    f"curriculum never moves (raise train.local_epochs, or set algorithm.schedule.over=rounds)"]
        return []

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
        """``p``: the round's distilled share, averaged over its local epochs (TensorBoard: curriculum/p), and
        ``p_epochs``: its value in each local epoch, first to last (the schedule is a pure function of the epoch and
        the round, so the driver computes what every client used; TensorBoard: curriculum/p_epoch, one point per
        local epoch, and the console's ``p start→end``)."""
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
