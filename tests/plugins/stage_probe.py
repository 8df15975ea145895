"""A stage from outside raysim, in one file: the design's proof that a new capability of the round needs no change to
the driver, the client-job core or any algorithm (``raysim.stages``). On when a config names this module in
``plugins``; its factory returns None otherwise, so a process that imported it for one run leaves the next alone.

``shrink``: every client's upload is pulled towards the model it downloaded, upload ← download + λ·(upload −
download), where the client trained (its client part), before any partial sum; λ travels to the client with each
job (``job_params``). The part reports the L2 norm of the client's own change before shrinking, which the stage logs
as the round's mean (``probe/change_norm``, in client-id order), and the stage counts the reports it has seen over
the run (``probe/reports``: its state, in the checkpoint, so a resumed run continues the count). With λ = 1/2
(``LAMBDA``) FedAvg's server moves half as far as it would. Each client part also keeps, in the client state store,
how many jobs its client has run (``probe/most_jobs``: the most over the round's clients), and says its upload
travels in half its bytes (as float16 would: ``bytes_up``).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from raysim.stages import ClientPart, RoundContext, Stage, register_stage

LAMBDA = 0.5


class _Shrink(ClientPart):
    def __init__(self, lam: float):
        self.lam, self.norm, self.jobs = lam, 0.0, 0

    def restore(self, state: Any) -> None:
        self.jobs = int(state) if state is not None else 0

    def keep(self) -> Any:
        return torch.tensor(self.jobs + 1)

    def upload_bytes(self, n: int) -> int:
        return n // 2

    def upload(self, upload: dict, shared: dict) -> dict:
        model = shared.get("model") or {}
        out, total = {}, 0.0
        for key, value in upload.items():
            if key in model and value.is_floating_point():
                change = value - model[key].to(value.device, value.dtype)
                total += float(change.double().pow(2).sum())
                out[key] = model[key].to(value.device, value.dtype) + self.lam * change
            else:
                out[key] = value
        self.norm = math.sqrt(total)
        return out

    def report(self, seen: int) -> Any:
        return {"norm": self.norm, "jobs": self.jobs + 1}


class ShrinkStage(Stage):
    name = "shrink"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.reports = 0

    def job_params(self, rnd: int) -> Any:
        return LAMBDA

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _Shrink(float(params)) if params is not None else None

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        norms = [r.stage[self.name]["norm"] for r in results]
        self.reports += len(norms)
        return {"probe/change_norm": float(torch.tensor(norms, dtype=torch.float64).mean()) if norms else None,
                "probe/reports": self.reports,
                "probe/most_jobs": max((r.stage[self.name]["jobs"] for r in results), default=0)}

    def state(self) -> dict:
        return {"shrink_reports": self.reports}

    def load(self, ckpt: dict) -> None:
        self.reports = int(ckpt.get("shrink_reports", 0))


register_stage("shrink", lambda cfg: ShrinkStage(cfg) if "stage_probe" in cfg.plugins else None)
