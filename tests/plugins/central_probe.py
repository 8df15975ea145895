"""A test-only algorithm: FAPD (whose offline teacher is central training) that also reports where a central job
ran: its process, its device and its Ray GPU ids, as metrics beside the driver's own process id."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from raysim.algorithms.fapd import FAPD, FAPDConfig
from raysim.algorithms.central import run_reserved
from raysim.registry import register_algorithm


@dataclass
class CentralProbeConfig(FAPDConfig):
    name: str = "central_probe"


def where(device: torch.device) -> dict:
    """What a central job sees of the process it runs in."""
    import ray

    gpus = len(ray.get_gpu_ids()) if ray.is_initialized() else -1
    return {"pid": torch.tensor(os.getpid()), "cuda": torch.tensor(int(device.type == "cuda")),
            "gpu_ids": torch.tensor(gpus)}


@register_algorithm("central_probe")
class CentralProbe(FAPD):
    Config = CentralProbeConfig

    def prepare_data(self, data):
        data = super().prepare_data(data)  # the teacher, trained by a central job
        self._central = {k: int(v) for k, v in run_reserved(where).items()}  # driver-side, like FAPD's PCA
        return data

    def on_round_end(self, round, metrics, server_state):
        return {**super().on_round_end(round, metrics, server_state), "driver_pid": os.getpid(),
                **{f"central_{k}": v for k, v in self._central.items()}}
