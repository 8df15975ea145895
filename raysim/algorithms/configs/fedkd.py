"""fedkd's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedkd.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from raysim.config import AlgorithmConfig, require


PREDICTS = ("mentor", "mentee")


@dataclass
class MentorConfig:
    name: Optional[str] = None  # mentor architecture (null: the client's model.name)
    width: Optional[int] = None  # CNN base channels (null: 2 x model.width)
    hidden: Optional[list[int]] = None  # MLP hidden widths (null: 2 x each of model.hidden)
    feature_dim: Optional[int] = None  # mentor backbone output (null: model.feature_dim)

    def validate(self) -> None:
        key = "algorithm.mentor."
        require(self.name is None or (isinstance(self.name, str) and bool(self.name)), f"{key}name",
                f"must be a model name or null, got {self.name!r}")
        for name in ("width", "feature_dim"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"{key}{name}", f"must be >= 1 or null, got {value}")
        require(self.hidden is None or all(h >= 1 for h in self.hidden), f"{key}hidden",
                f"widths must be >= 1, got {list(self.hidden or [])}")


@dataclass
class FedKDConfig(AlgorithmConfig):
    name: str = "fedkd"
    t_start: float = 0.95  # SVD energy threshold in round 0 (authors' parameters.py --tmin)
    t_end: float = 0.98  # ... reached in the last round (--tmax)
    predict: str = "mentor"  # mentor (the authors' test) | mentee
    weighted: bool = False  # False: plain mean of the updates (authors' np.mean); True: weighted by samples
    mentor: MentorConfig = field(default_factory=MentorConfig)

    def validate(self) -> None:
        require(0.0 < self.t_start <= 1.0, "algorithm.t_start", f"must be in (0, 1], got {self.t_start}")
        require(self.t_start <= self.t_end <= 1.0, "algorithm.t_end",
                f"must be in [algorithm.t_start, 1], got {self.t_end}")
        require(self.predict in PREDICTS, "algorithm.predict",
                f"must be one of {', '.join(PREDICTS)}, got {self.predict!r}")
        self.mentor.validate()
