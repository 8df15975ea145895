"""fedopt's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedopt.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, is_finite, require


@dataclass
class FedOptConfig(AlgorithmConfig):
    name: str = "fedopt"
    server_lr: float = 1.0  # η, the server learning rate

    def validate(self) -> None:
        require(is_finite(self.server_lr, 0.0, strict=True), "algorithm.server_lr",
                f"must be a number > 0, got {self.server_lr}")


def _decay(key: str, value: float) -> None:
    require(is_finite(value, 0.0) and value < 1.0, f"algorithm.{key}", f"must be in [0, 1), got {value}")


# ---------------------------------------------------------------------------------------------- the built-ins
@dataclass
class FedAvgMConfig(FedOptConfig):
    name: str = "fedavgm"
    server_lr: float = 1.0
    server_momentum: float = 0.9  # β; 0 with server_lr 1 is FedAvg exactly

    def validate(self) -> None:
        super().validate()
        _decay("server_momentum", self.server_momentum)


@dataclass
class AdaptiveConfig(FedOptConfig):
    name: str = "fedadam"
    server_lr: float = 0.01
    beta1: float = 0.9  # first-moment decay
    beta2: float = 0.99  # second-moment decay (FedAdam, FedYogi)
    tau: float = 1e-3  # adaptivity τ: added to √v, and v starts at τ²

    def validate(self) -> None:
        super().validate()
        _decay("beta1", self.beta1)
        _decay("beta2", self.beta2)
        require(is_finite(self.tau, 0.0, strict=True), "algorithm.tau", f"must be a number > 0, got {self.tau}")


@dataclass
class FedAdamConfig(AdaptiveConfig):
    name: str = "fedadam"


@dataclass
class FedYogiConfig(AdaptiveConfig):
    name: str = "fedyogi"


@dataclass
class FedAdagradConfig(AdaptiveConfig):
    name: str = "fedadagrad"
    server_lr: float = 0.1
    beta1: float = 0.0  # the authors ran Keras' Adagrad: no first moment
