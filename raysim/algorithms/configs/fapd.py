"""fapd's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fapd.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from raysim.config import AlgorithmConfig, require


CURRICULA = ("consensus", "fixed", "linear")


@dataclass
class TeacherConfig:
    features: Optional[str] = None  # .npy [N, D]: teacher features in the dataset's sample order (null: offline)
    class_embeddings: Optional[str] = None  # .npy [C, D] (null: per-class mean teacher features of calibration)
    # share of each client's training data moved to the server's split for FAPD alone (null: data.server_holdout,
    # which every method of a comparison holds out alike, when > 0, else 0.1)
    calibration_fraction: Optional[float] = None
    model: Optional[str] = None  # offline teacher architecture (null: model.name); its width is model.feature_dim
    hidden: Optional[list[int]] = None  # offline MLP teacher's hidden widths (null: model.hidden): a larger teacher
    width: Optional[int] = None  # offline CNN teacher's base channel count (null: model.width)
    epochs: int = 30  # offline teacher: central training epochs on the calibration split
    lr: float = 0.05  # offline teacher: SGD (momentum 0.9) learning rate
    batch_size: int = 32  # offline teacher: batch size
    cache_dir: Optional[str] = None  # teacher features cache (null: data.cache_dir, $RAYSIM_CACHE, ~/.cache/raysim)

    def validate(self) -> None:
        key = "algorithm.teacher."
        for name in ("features", "class_embeddings", "cache_dir"):
            value = getattr(self, name)
            if value is not None:  # absolute now: a Tune trial's run may start in another working directory
                setattr(self, name, os.path.abspath(os.path.expanduser(str(value))))
        if self.calibration_fraction is not None:
            require(0.0 <= self.calibration_fraction < 1.0, key + "calibration_fraction",
                     f"must be in [0, 1), got {self.calibration_fraction}")
            require(self.calibration_fraction > 0 or self.features is not None, key + "calibration_fraction",
                     "must be > 0 without algorithm.teacher.features (the offline teacher trains on that split)")
        require(self.epochs >= 1, key + "epochs", f"must be >= 1, got {self.epochs}")
        require(self.lr > 0, key + "lr", f"must be > 0, got {self.lr}")
        require(self.batch_size >= 1, key + "batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.hidden is None or all(int(h) >= 1 for h in self.hidden), key + "hidden",
                 f"must be a list of widths >= 1, got {self.hidden}")
        require(self.width is None or self.width >= 1, key + "width", f"must be >= 1, got {self.width}")


@dataclass
class FAPDConfig(AlgorithmConfig):
    name: str = "fapd"
    k0: int = 8  # initial curriculum dimension
    delta_k: int = 5  # dimensions added when the network is stable
    epsilon: float = 0.005  # stability threshold on acc_global (a fraction, not a percentage)
    window: int = 3  # consensus window N (rounds)
    curriculum: str = "consensus"  # consensus | fixed (FAPD-nadpt) | linear (k grows by delta_k every round)
    k_fixed: Optional[int] = None  # fixed curriculum's dimension (null: D, the whole teacher space)
    lambda_kd: float = 0.5  # weight of the projected feature-distillation (PKD) term
    lambda_cl: float = 0.5  # 0: FAPD-ncont
    tau: float = 0.04  # contrastive temperature
    kd_tau: float = 1.0  # temperature of the projected-feature KL (1: the seed's formula as written; see pkd_loss)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    def validate(self) -> None:
        require(self.k0 >= 1, "algorithm.k0", f"must be >= 1, got {self.k0}")
        require(self.delta_k >= 0, "algorithm.delta_k", f"must be >= 0, got {self.delta_k}")
        require(self.epsilon >= 0, "algorithm.epsilon", f"must be >= 0, got {self.epsilon}")
        require(self.window >= 1, "algorithm.window", f"must be >= 1, got {self.window}")
        require(self.curriculum in CURRICULA, "algorithm.curriculum",
                 f"must be one of {', '.join(CURRICULA)}, got {self.curriculum!r}")
        require(self.k_fixed is None or self.k_fixed >= 1, "algorithm.k_fixed", f"must be >= 1, got {self.k_fixed}")
        require(self.lambda_kd >= 0, "algorithm.lambda_kd", f"must be >= 0, got {self.lambda_kd}")
        require(self.lambda_cl >= 0, "algorithm.lambda_cl", f"must be >= 0, got {self.lambda_cl}")
        require(self.tau > 0, "algorithm.tau", f"must be > 0, got {self.tau}")
        require(self.kd_tau > 0, "algorithm.kd_tau", f"must be > 0, got {self.kd_tau}")
        self.teacher.validate()

    def privacy_refusal(self, cfg: Any, data: Any = None) -> Optional[tuple[str, str]]:
        """Under privacy, FAPD's server steps must read public data only: its PCA and class embeddings a split the
        config names as the server's (not the default carve of the clients' training data), and its consensus
        curriculum an ``acc_global`` measured on an official test split that no client holds."""
        fraction = self.teacher.calibration_fraction
        if not (cfg.data.server_holdout > 0 or (fraction is not None and fraction > 0)):
            return ("algorithm.teacher.calibration_fraction",
                    "fapd fits its PCA projection and class embeddings on a split of the clients' training data "
                    "(by default 0.1 of each client's samples, or all of it), outside the privacy mechanism; with "
                    "privacy on, name the server's split as public: data.server_holdout=F (held out of every client "
                    "for every method) or algorithm.teacher.calibration_fraction=F")
        if self.curriculum == "consensus" and (cfg.data.test_split != "official"
                                               or (data is not None and data.server_test is None)):
            return ("algorithm.curriculum",
                    f"fapd's consensus curriculum grows k from acc_global, which {cfg.data.name} measures on the "
                    f"clients' test samples (no official test split), outside the privacy mechanism; with privacy "
                    f"on, use a dataset with an official test split (data.test_split=official), or "
                    f"algorithm.curriculum=fixed or linear")
        return None

    def nonprivate_metrics(self, cfg: Any) -> tuple[str, ...]:
        """The offline teacher's accuracy is measured on the samples outside its split: the clients'."""
        return ("curriculum/teacher_acc",) if self.teacher.features is None else ()
