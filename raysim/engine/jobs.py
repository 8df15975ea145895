"""What crosses the process boundary between the driver and the workers: small typed records, no string keys.

A job names its client and round and carries object-store references; the bulky parts (the payload, a client's
state) travel as references, so a record stays a few hundred bytes however big the model is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class TrainJob:
    """Train one client for one round."""

    client_id: int
    round: int
    payload_ref: Any  # ray.ObjectRef of the round's shared payload (a worker fetches it once per round)
    own_payload_ref: Optional[Any] = None  # ray.ObjectRef of this client's own payload (``client_payload``)


@dataclass
class TrainResult:
    """A trained client's upload and bookkeeping; its new state comes back beside it as a separate object."""

    client_id: int
    round: int
    upload: dict
    num_samples: int
    finite: bool
    loss: float
    parts: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    has_state: bool = False
    upload_bytes: int = 0  # bytes of every tensor of the upload (``bytes_up``), counted even when it was summed


@dataclass
class GroupResult:
    """A group's clients trained in one call with their uploads summed there (``engine.partial_sums``): the
    group's ``raysim.engine.partial.UploadSum`` and each client's result, without its upload; the clients' new
    states come back beside it as separate objects."""

    upload_sum: Any
    results: list[TrainResult]

    @property
    def seconds(self) -> float:
        """Mean training time of one of the group's clients (what the pool's call batching measures)."""
        return sum(r.seconds for r in self.results) / max(len(self.results), 1)


@dataclass
class EvalJob:
    """Evaluate a chunk of clients after a round's aggregation."""

    client_ids: list[int]
    round: int
    payload_ref: Any  # the shared evaluation payload
    own_payload_refs: Optional[list[Any]] = None  # per client, when the algorithm sends per-client payloads


@dataclass
class ClientAccuracy:
    client_id: int
    correct: int
    total: int


@dataclass
class ServerTrainJob:
    """The algorithm's server-side training (``Algorithm.server_train``) for one round, run on a worker."""

    round: int
    state_ref: Any  # ray.ObjectRef of the server state after aggregation
    updates_ref: Any  # ray.ObjectRef of the round's list[ClientUpdate]
    history_refs: dict = field(default_factory=dict)  # client id -> refs of its kept objects (``server_keep``)
