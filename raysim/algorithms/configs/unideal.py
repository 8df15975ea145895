"""unideal's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/unideal.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from raysim.config import AlgorithmConfig, ExperimentConfig, require

# CLKD's choices (raysim.curriculum.clkd reads them from here)
METRICS = ("cosine", "l1", "l2")
SHAPES = ("linear", "constant", "step")
OVERS = ("local_epochs", "rounds")
NORMS = ("batch", "kept")


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

    def config_warnings(self, cfg: ExperimentConfig) -> list[str]:
        """A p-schedule over the local epochs cannot move with one local epoch: p stays at its end value."""
        schedule = self.schedule
        if schedule.over == "local_epochs" and cfg.train.local_epochs == 1 and schedule.shape != "constant":
            exact = " (exactly PartialKD)" if schedule.end == 1.0 else ""
            return [f"unideal's p-schedule runs over the local epochs, and with train.local_epochs=1 a single epoch "
                    f"counts as the last: p stays at algorithm.schedule.end={schedule.end} every round{exact}, the "
                    f"curriculum never moves (raise train.local_epochs, or set algorithm.schedule.over=rounds)"]
        return []
