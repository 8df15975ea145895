"""The hooks an algorithm overrides. The defaults are FedAvg; the round loop (engine/driver.py) exists once.

Client side (run by a worker for one virtual client):
  client_setup   load the client's own state and the driver's payload into the model
  local_phases   which parameters train for how many local epochs (FedRep: head first, then body)
  client_loss    the local objective on one batch
  client_upload  what leaves the client        client_keep   what the client keeps for next time
Driver side:
  init_server_state, server_payload (what goes down each round), server_aggregate, on_round_end.

Which part of the model is shared is declared with ``shared`` ("all", "head", "backbone" or "none"); most
algorithms need nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from raysim.config import AlgorithmConfig
from raysim.models import BACKBONE_PREFIX, HEAD_PREFIX

TensorDict = dict[str, torch.Tensor]


@dataclass
class ClientContext:
    """Where a client is in its local training; handed to every ``client_loss`` call."""

    client_id: int
    round: int
    total_rounds: int
    epoch: int  # 0-based local epoch within this round
    num_epochs: int
    payload: dict
    sample_idx: Optional[torch.Tensor] = None  # the batch's sample indices in its domain
    meta: dict = field(default_factory=dict)  # the data's ``meta`` (what ``prepare_data`` attached), read-only


def weighted_average(uploads: list[TensorDict], weights: list[float]) -> TensorDict:
    """Per-key weighted mean, accumulated in the given (client-id) order so results never depend on timing."""
    total = float(sum(weights))
    out: TensorDict = {}
    for key, first in uploads[0].items():
        acc = torch.zeros_like(first, dtype=torch.float64)
        for upload, w in zip(uploads, weights):
            acc.add_(upload[key].to(torch.float64), alpha=w / total)
        out[key] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out


class Algorithm:
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    name: ClassVar[str] = "base"
    shared: ClassVar[str] = "all"  # all | head | backbone | none

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.config = cfg.algorithm

    # ----------------------------------------------------------------- which tensors cross the network
    @property
    def has_global_model(self) -> bool:
        """True when the driver holds one whole model, whose accuracy is ``acc_global``."""
        return self.shared == "all"

    def is_shared(self, key: str) -> bool:
        if self.shared == "all":
            return True
        if self.shared == "head":
            return key.startswith(HEAD_PREFIX)
        if self.shared == "backbone":
            return key.startswith(BACKBONE_PREFIX)
        return False

    def check(self, cfg: Any, data: Any) -> None:
        """Refuse configs the algorithm cannot run (raise UserError)."""
        from raysim.errors import UserError

        if self.shared in ("all", "backbone") and len(set(cfg.model.names())) > 1:
            raise UserError(f"config key 'model.name': {self.name} averages the {'model' if self.shared == 'all' else 'backbone'}, "
                            f"so every client needs the same architecture")
        if self.shared in ("all", "backbone") and len({data.input_shape(c) for c in range(data.num_clients)}) > 1:
            raise UserError(f"config key 'algorithm.name': {self.name} averages the "
                            f"{'model' if self.shared == 'all' else 'backbone'}, but clients' inputs differ in shape "
                            f"(use a head-sharing algorithm such as partialavg or unideal)")

    # ----------------------------------------------------------------- driver side
    def prepare_data(self, data: Any) -> Any:
        """Called once on the driver before the data goes into the object store (FAPD carves out a server split
        and attaches teacher features to ``data.meta`` here, so workers receive them once, with the data)."""
        return data

    def init_server_state(self, initial_state: TensorDict) -> dict:
        return {"model": {k: v.clone() for k, v in initial_state.items() if self.is_shared(k)}}

    def server_payload(self, server_state: dict, round: int) -> dict:
        """What every sampled client downloads this round (all of it is counted in ``bytes_down``)."""
        return {"model": server_state["model"]} if server_state["model"] else {}

    def eval_payload(self, server_state: dict) -> dict:
        """What evaluation after aggregation sees: by default the payload the next round would send."""
        return self.server_payload(server_state, round=-1)

    def server_aggregate(self, uploads: list[TensorDict], weights: list[float], server_state: dict,
                         round: int) -> dict:
        if uploads and uploads[0]:
            server_state["model"] = weighted_average(uploads, weights)
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        """Server-side curriculum and extra metrics; returns entries to add to the round's metrics."""
        return {}

    # ----------------------------------------------------------------- client side
    def client_setup(self, model: nn.Module, state: Optional[TensorDict], payload: dict,
                     ctx: Optional[ClientContext]) -> None:
        if state:
            model.load_state_dict(state, strict=False)
        if payload.get("model"):
            model.load_state_dict(payload["model"], strict=False)

    def local_phases(self, model: nn.Module) -> list[tuple[list[nn.Parameter], int]]:
        return [(list(model.parameters()), self.cfg.train.local_epochs)]

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Returns the loss to minimise and named parts to log (averaged per client, then over clients)."""
        return F.cross_entropy(model(x), y), {}

    def client_upload(self, model: nn.Module) -> TensorDict:
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if self.is_shared(k)}

    def client_keep(self, model: nn.Module) -> TensorDict:
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if not self.is_shared(k)}

    def eval_setup(self, model: nn.Module, state: Optional[TensorDict], payload: dict) -> None:
        """Make the model a client would predict with after this round's aggregation."""
        self.client_setup(model, state, payload, None)

