"""fednh's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fednh.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, is_finite, require


BODY_AVERAGES = ("samples", "uniform")


@dataclass
class FedNHConfig(AlgorithmConfig):
    name: str = "fednh"
    rho: float = 0.9  # prototype smoothing ρ (main.py --FedNH_smoothing)
    scale: float = 30.0  # s, or its starting value when learned (FedUH.py: "30.0 is a common choice")
    learn_scale: bool = True  # s trained by clients and averaged (authors' FedNH_fix_scaling: False)
    clip_grad: float = 10.0  # max gradient norm per local step (FedUHClient.training); 0 disables clipping
    # how the body and s are averaged: samples (FedAvg, as the paper and the table's fedavg row) | uniform (the
    # authors' FedNHServer.aggregate: server_lr / num_participants times the summed updates, server_lr 1)
    body_average: str = "samples"

    def validate(self) -> None:
        require(isinstance(self.rho, (int, float)) and 0 <= self.rho <= 1, "algorithm.rho",
                f"must be in [0, 1], got {self.rho}")
        require(is_finite(self.scale, 0, strict=True), "algorithm.scale",
                f"must be a finite number > 0, got {self.scale}")
        require(isinstance(self.learn_scale, bool), "algorithm.learn_scale",
                f"must be true or false, got {self.learn_scale!r}")
        require(is_finite(self.clip_grad, 0), "algorithm.clip_grad",
                f"must be a finite number >= 0 (0: no clipping), got {self.clip_grad}")
        require(self.body_average in BODY_AVERAGES, "algorithm.body_average",
                f"must be one of {', '.join(BODY_AVERAGES)}, got {self.body_average!r}")
