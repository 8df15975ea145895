"""What crosses the process boundary between the driver and the workers: small typed records, no string keys.

A job names its client and round and carries object-store references; the bulky parts (the payload, a client's
state) travel as references, so a record stays a few hundred bytes however big the model is.

A **call** is one unit of work an executor runs in some process (Flower's one verb, ``process_message``): the
round's plan (``raysim.engine.plan``) makes training calls, the driver makes evaluation, server-side and central
calls. Each call says which handles it takes as arguments (``args``: resolved by Ray before the call starts, or
handed over as private copies in process), how many objects it returns (``returns``: the first is its result, the
others, a training call's kept states, stay in the object store) and how it runs on a process's
:class:`~raysim.engine.core.ClientJobs` (``run``). The executors know nothing else about what a call does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from raysim.algorithms.base import Algorithm, ClientContext


@dataclass
class TrainJob:
    """Train one client for one round."""

    client_id: int
    round: int
    payload_ref: Any  # handle of the round's shared payload (a worker fetches it once per round)
    own_payload_ref: Optional[Any] = None  # handle of this client's own payload (``client_payload``)
    # more tags for the job's seed, job_seed(seed, client, round, *stream): () in synchronous rounds; the
    # asynchronous modes' (ASYNC_STREAM, job sequence), since a client may train twice on one server version
    stream: tuple[int, ...] = ()
    # what the driver sends each stage's client part (raysim.stages): stage name -> its parameters (DP-FedAvg's
    # clip norm, a step budget)
    stage: dict[str, Any] = field(default_factory=dict)
    alone: bool = False  # a stage's part needs the one-client loop: never stacked


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
    stage: dict[str, Any] = field(default_factory=dict)  # what each stage's client part reports (raysim.stages)
    # the upload's tensors are the base client_upload's own clones (split_state), held by nothing else: an
    # in-process executor hands them on as they are instead of copying them again
    private: bool = False


@dataclass
class CallResult:
    """What a training call returns first: each client's result in call order (without its upload where it was
    summed) and each of its sum groups' ``raysim.algorithms.aggregation.UploadSum`` in group order (none when the
    uploads travel per client); the clients' new states come back beside it as separate objects."""

    results: list[TrainResult]
    sums: list[Any] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Mean training time of one of the call's clients (what the plan's call sizing measures)."""
        return sum(r.seconds for r in self.results) / max(len(self.results), 1)


@dataclass
class EvalJob:
    """Evaluate a chunk of clients after a round's aggregation."""

    client_ids: list[int]
    round: int
    payload_ref: Any  # the shared evaluation payload
    own_payload_refs: Optional[list[Any]] = None  # per client, when the algorithm sends per-client payloads
    rows: Optional[tuple[int, int]] = None  # [start, end) of one client's test rows: the server's split, shared out


@dataclass
class ClientAccuracy:
    client_id: int
    correct: int
    total: int


@dataclass
class ServerTrainJob:
    """The algorithm's server-side training (``Algorithm.server_train``) for one round, run on a worker."""

    round: int
    state_ref: Any  # handle of the server state after aggregation
    updates_ref: Any  # handle of the round's list[ClientUpdate]
    history_refs: dict = field(default_factory=dict)  # client id -> handles of its kept objects (``server_keep``)


@dataclass
class StartedJob:
    """A training job set up and ready for its first step (``ClientJobs.start``): the one record that never leaves
    its process, shared by the one-client loop and the stack trainer."""

    job: TrainJob
    model: nn.Module  # the process's model object for this architecture, holding this client's start
    ctx: ClientContext
    phases: list[tuple]  # local_phases: (parameters, epochs[, learning rate])
    gen: torch.Generator  # the client's shuffling, seeded from (seed, client, round)
    augment: Any  # data.augment's batch augmentation (None: off)
    aug_gen: Optional[torch.Generator]
    clock: float  # time.perf_counter() when the job started
    parts: list = field(default_factory=list)  # (stage name, its ClientPart) for this job, in stage order


# ---------------------------------------------------------------------------------------------------- calls
class JobCore(Protocol):
    """The client-job core as calls and the stack trainer see it (``raysim.engine.core.ClientJobs``)."""

    cfg: Any
    data: Any
    device: torch.device
    algorithm: Algorithm
    busy: Optional[int]  # the client of a call being trained, for error messages

    def start(self, job: TrainJob, shared: dict, own: Optional[dict], state: Optional[dict]) -> StartedJob: ...

    def finish(self, started: StartedJob, loss_sum: Any, part_sums: dict, seen: int, finite: bool,
               seconds: Optional[float] = None) -> tuple[TrainResult, Optional[dict]]: ...

    def train(self, job: TrainJob, shared: dict, own: Optional[dict],
              state: Optional[dict]) -> tuple[TrainResult, Optional[dict]]: ...

    def run_call(self, call: TrainCall, shared: dict, owns: list, states: list) -> tuple[CallResult, list]: ...

    def evaluate(self, job: EvalJob, shared: dict, owns: list, states: list) -> list[ClientAccuracy]: ...

    def server_train(self, round: int, server_state: dict, updates: list, history: dict) -> dict: ...

    def evaluate_stage(self, evaluation: Any, shared: dict, round: int) -> Optional[float]: ...

    def probe_stack_size(self, jobs: list[TrainJob], shared: dict, owns: list,
                          states: list) -> tuple[int, dict]: ...


class Host(Protocol):
    """The process a call runs in, as the call sees it: the client-job core (None before the data has arrived),
    the device, and how handles that a call carries inside its records become values."""

    jobs: Optional[JobCore]
    device: torch.device

    def fetch(self, handles: list) -> list:
        """The values of ``handles`` (None stays None)."""

    def shared(self, handle: Any) -> Any:
        """The round's shared payload behind ``handle``, fetched once per process and payload."""


class Call:
    """One unit of work for an executor (see the module docstring)."""

    kind: str = "train"  # what the progress line calls it: train | evaluate | server | central
    round: int = 0
    clients: list[int]  # for error messages (which clients to name when the call fails or its worker dies)

    def args(self) -> list:
        """Handles to hand over as the call's arguments (resolved before it runs)."""
        return []

    @property
    def returns(self) -> int:
        return 1

    def describe(self, host: Optional[Host] = None) -> str:
        """What an out-of-memory or failure message says was running (``host``: the process running it, if any)."""
        raise NotImplementedError

    def run(self, host: Host, values: list) -> list:
        """Run on ``host`` with ``args``' values; returns ``returns`` objects."""
        raise NotImplementedError


@dataclass
class _JobsCall(Call):
    """A call over some of a round's training jobs, with their clients' kept states as its arguments."""

    jobs: list[TrainJob]
    states: list[Any]  # handles of the clients' kept states (None: none yet)

    @property
    def round(self) -> int:  # type: ignore[override]
        return self.jobs[0].round

    def args(self) -> list:
        return list(self.states)

    def payloads(self, host: Host) -> tuple[Any, list]:
        """The round's shared payload and each job's own payload (``client_payload``; None where it has none)."""
        return host.shared(self.jobs[0].payload_ref), host.fetch([j.own_payload_ref for j in self.jobs])


@dataclass
class TrainCall(_JobsCall):
    """Train some of a round's clients, one at a time or (``stacked``) as one stack, and reduce their
    uploads: each group of ``groups`` (sizes, in order, covering the clients) summed by ``weighting`` where they
    trained, or (no groups) every upload returned with its client's result."""

    stacked: bool = False
    stack: int = 0  # stacked: at most this many clients stacked at once (the stack size), consecutively
    groups: tuple[int, ...] = ()
    weighting: str = "samples"
    part_of: Optional[int] = None  # the sum group (its index in the round) whose clients this call trains part of:
    # the uploads come back, and the driver sums the group as a worker would (the plan's split tail)
    kind = "train"

    @property
    def clients(self) -> list[int]:  # type: ignore[override]
        return [j.client_id for j in self.jobs]

    @property
    def returns(self) -> int:
        return 1 + len(self.jobs)

    def describe(self, host: Optional[Host] = None) -> str:
        busy = host.jobs.busy if host is not None and host.jobs is not None else None
        stack = f" (a stack of {len(self.jobs)})" if self.stacked and len(self.jobs) > 1 else ""
        return f"client {self.jobs[0].client_id if busy is None else busy}'s training in round {self.round}{stack}"

    def run(self, host: Host, values: list) -> list:
        assert host.jobs is not None
        shared, owns = self.payloads(host)
        result, kept = host.jobs.run_call(self, shared, owns, values)
        return [result, *kept]


@dataclass
class EvalCall(Call):
    """Test accuracy of the model each client of ``job`` would use after the round's aggregation."""

    job: EvalJob
    states: list[Any]
    kind = "evaluate"

    @property
    def round(self) -> int:  # type: ignore[override]
        return self.job.round

    @property
    def clients(self) -> list[int]:  # type: ignore[override]
        return self.job.client_ids

    def args(self) -> list:
        return list(self.states)

    def describe(self, host: Optional[Host] = None) -> str:
        return f"the evaluation of clients {self.job.client_ids} after round {self.job.round}"

    def run(self, host: Host, values: list) -> list:
        assert host.jobs is not None
        owns = host.fetch(self.job.own_payload_refs or [None] * len(self.job.client_ids))
        return [host.jobs.evaluate(self.job, host.shared(self.job.payload_ref), owns, values)]


@dataclass
class ServerCall(Call):
    """The algorithm's server-side training for one round, on a worker's reserved CPU/GPU share."""

    job: ServerTrainJob
    kind = "server"
    clients: list[int] = field(default_factory=list)

    @property
    def round(self) -> int:  # type: ignore[override]
        return self.job.round

    def args(self) -> list:
        return [self.job.state_ref, self.job.updates_ref]

    def describe(self, host: Optional[Host] = None) -> str:
        return f"the server-side training of round {self.job.round}"

    def run(self, host: Host, values: list) -> list:
        assert host.jobs is not None
        state, updates = values
        history = {cid: host.fetch(list(refs)) for cid, refs in self.job.history_refs.items()}
        return [host.jobs.server_train(self.job.round, state, updates, history)]


@dataclass
class CentralCall(Call):
    """Central training (FAPD's offline teacher, FedPCL's stand-in backbones) on a worker's reserved share:
    ``train(device)``, its result on the CPU (``raysim.algorithms.central``)."""

    train: Callable[[Any], Any]
    kind = "central"
    clients: list[int] = field(default_factory=list)

    def describe(self, host: Optional[Host] = None) -> str:
        return "central training"

    def run(self, host: Host, values: list) -> list:
        from raysim.algorithms.central import run_here

        return [run_here(self.train, host.device)]


@dataclass
class StageEvalCall(Call):
    """A stage's evaluation after a round (``raysim.stages.StageEvaluation``: the backdoor's success rate) of the
    model a client without state predicts with, on a worker like any evaluation."""

    evaluation: Any
    payload_ref: Any  # the round's evaluation payload
    rnd: int
    kind = "evaluate"
    clients: list[int] = field(default_factory=list)

    @property
    def round(self) -> int:  # type: ignore[override]
        return self.rnd

    def describe(self, host: Optional[Host] = None) -> str:
        return f"the evaluation {self.evaluation.key!r} after round {self.rnd}"

    def run(self, host: Host, values: list) -> list:
        assert host.jobs is not None
        return [host.jobs.evaluate_stage(self.evaluation, host.shared(self.payload_ref), self.rnd)]


@dataclass
class ProbeCall(_JobsCall):
    """``engine.vectorize=auto``: the stack size a probe on the round's first clients chooses (nothing it trains
    is kept), and what it measured."""

    kind = "train"
    clients: list[int] = field(default_factory=list)

    def describe(self, host: Optional[Host] = None) -> str:
        return f"the engine.vectorize=auto probe in round {self.round}"

    def run(self, host: Host, values: list) -> list:
        assert host.jobs is not None
        shared, owns = self.payloads(host)
        return [host.jobs.probe_stack_size(self.jobs, shared, owns, values)]
