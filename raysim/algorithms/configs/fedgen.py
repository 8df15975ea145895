"""fedgen's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedgen.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raysim.config import AlgorithmConfig, require


TEACHER_WEIGHTINGS = ("per_sample", "batch_mean")


@dataclass
class FedGenConfig(AlgorithmConfig):
    name: str = "fedgen"
    # the generator (GENERATORCONFIGS['mnist'] = hidden 256, noise 32; its output width is model.feature_dim)
    generator_hidden_dim: int = 256
    noise_dim: int = 32
    # server-side training (RUNCONFIGS['mnist'], serverbase.init_ensemble_configs, serverpFedGen.__init__)
    ensemble_lr: float = 3e-4  # Adam, betas (0.9, 0.999)
    generator_lr_decay: float = 0.98  # ExponentialLR(gamma=0.98), stepped once per round
    generator_weight_decay: float = 1e-2  # RUNCONFIGS 'weight_decay', the generator's Adam
    ensemble_epochs: int = 50  # train_generator(epoches=ensemble_epochs // n_teacher_iters) ...
    n_teacher_iters: int = 5  # ... of n_teacher_iters steps each: 50 steps a round
    generator_batch_size: Optional[int] = None  # null: train.batch_size (train_generator(self.batch_size))
    ensemble_alpha: float = 1.0  # weight of the teacher (CE) loss
    # per_sample: the paper's Eq. 4, each generated sample's CE weighted by its label's α_k^y; batch_mean: the
    # authors' code, whose [B] CE times [B, 1] weights broadcasts to mean_i(α_k^{y_i}) · mean_j(CE_kj)
    teacher_weighting: str = "per_sample"
    ensemble_eta: float = 1.0  # weight of the diversity loss
    # client-side regularisation (RUNCONFIGS['mnist'], userpFedGen.train, main.py)
    generative_alpha: float = 10.0  # CE on generated features through the head
    generative_beta: float = 10.0  # KL of the model's prediction on x to the head's on G(y)
    generative_decay: float = 0.98  # both decay by this factor per round (exp_lr_scheduler(glob_iter, 0.98))
    gen_batch_size: int = 32  # generated samples per batch; the α-term is scaled by gen_batch_size / batch_size

    def validate(self) -> None:
        for key in ("generator_hidden_dim", "noise_dim", "ensemble_epochs", "n_teacher_iters", "gen_batch_size"):
            value = getattr(self, key)
            require(isinstance(value, int) and value >= 1, f"algorithm.{key}", f"must be an integer >= 1, got {value}")
        require(self.ensemble_epochs >= self.n_teacher_iters, "algorithm.ensemble_epochs",
                 f"must be >= algorithm.n_teacher_iters ({self.n_teacher_iters}), got {self.ensemble_epochs}")
        require(self.generator_batch_size is None or (isinstance(self.generator_batch_size, int)
                                                       and self.generator_batch_size >= 2),
                 "algorithm.generator_batch_size",
                 f"must be null or an integer >= 2 (batch norm and the diversity loss need pairs), "
                 f"got {self.generator_batch_size}")
        require(self.ensemble_lr > 0, "algorithm.ensemble_lr", f"must be > 0, got {self.ensemble_lr}")
        require(self.teacher_weighting in TEACHER_WEIGHTINGS, "algorithm.teacher_weighting",
                f"must be one of {', '.join(TEACHER_WEIGHTINGS)}, got {self.teacher_weighting!r}")
        for key in ("generator_lr_decay", "generative_decay"):
            value = getattr(self, key)
            require(0 < value <= 1, f"algorithm.{key}", f"must be in (0, 1], got {value}")
        for key in ("generator_weight_decay", "ensemble_alpha", "ensemble_eta", "generative_alpha", "generative_beta"):
            value = getattr(self, key)
            require(value >= 0, f"algorithm.{key}", f"must be >= 0, got {value}")

    @property
    def generator_steps(self) -> int:
        return (self.ensemble_epochs // self.n_teacher_iters) * self.n_teacher_iters


@dataclass
class FedGenPConfig(FedGenConfig):
    name: str = "fedgen-p"
