"""Stages: the round's features as hooks of the one round loop.

A stage is a small object built from the config, the same on the driver and on every worker
(:func:`build_stages`), that takes part in the round at declared points and nowhere else. The driver's round
(``raysim.engine.driver``) names its steps and tests for no feature; the client-job core (``raysim.engine.core``)
trains one client through the one local loop and asks the stages' client parts at fixed points. The model is pfl's
postprocessor chain (``postprocess_one_user`` where the user trained, ``postprocess_server`` on the aggregate),
FLSim's DP and secure-aggregation objects chosen by config, and Flower's client mods.

The hook points, in the order a round meets them (every hook has a default that changes nothing):

- **the schedule** (:class:`Schedule`, exactly one a run, the first stage): which clients start, when each one
  reports and what the server step consumes: the synchronous cohort (:class:`raysim.engine.schedule.SyncSchedule`),
  the simulated clock's round with dropouts and deadlines (``raysim.system.stage``), or arrivals in simulated-time
  order (FedAsync, FedBuff: ``raysim.engine.asynchronous``). Other stages may choose the cohort (:meth:`Stage.select`:
  Poisson sampling), learn it before its jobs are made (:meth:`Stage.begin_round`: the secure-aggregation group) or
  end the run before a round (:meth:`Stage.stop_before`: a spent privacy budget).
- **on the client, around and after training** (:meth:`Stage.client_part` gives a :class:`ClientPart` per job, on
  whichever process trains it, in stacks too): change the client's data (a poisoned split), its batches,
  its step's loss (DP-SGD) or how far it trains (a step budget), then transform its upload before any partial sum
  (DP clipping, compression, secure aggregation's mask), say what it takes on the wire, and keep state of its own
  for the client (error feedback's residual). What a part sends back rides in ``TrainResult.stage[name]``; what
  the driver sends it rides in ``TrainJob.stage[name]`` (:meth:`Stage.job_params`).
- **the reduction**: by default the one sum (``raysim.algorithms.aggregation.UploadSum``), taken where the clients
  trained; a stage that needs every upload (:attr:`Stage.needs_every_upload`) turns those sums off. A stage may
  work on the round's updates as rows before a rule reads them (:meth:`Stage.transform_rows`: an attack), replace
  the reduction (:meth:`Stage.reduce`: a robust rule, FedBuff's buffer), read the sum of what travelled as the plain
  sum (:meth:`Stage.decode`: secure aggregation's unmasking) or finish the sum on the server (:meth:`Stage.release`:
  DP noise).
- **after the server step**: its metrics (:meth:`Stage.round_metrics`), its own evaluations, run through the
  executor like any other (:meth:`Stage.evaluations`: the backdoor's success rate), the names the round's metrics
  are logged under (:meth:`Stage.label_metrics`: privacy's ``nonprivate/``), and its state for the checkpoint
  (:meth:`Stage.state`, :meth:`Stage.load`).

Each stage declares what it serves and refuses in :meth:`Stage.check` (with the data, before round 1) and in the
config checks of its section; a stage from a plugin registers with :func:`register_stage`. This module imports
neither torch nor the engine, so the subsystems' stage modules sit below the engine (``tests/test_layering.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Optional, Protocol

if TYPE_CHECKING:
    import torch

# This module sits below everything it describes: it names the config (``raysim.config.ExperimentConfig``), the one sum
# (``raysim.algorithms.aggregation.UploadSum``) and the engine's records (``TrainJob``, ``TrainResult``) only in its
# docs, and types them ``Any``, so that importing it imports none of them.
ExperimentConfig = Any
UploadSum = Any


class ClientPart:
    """One stage's part in one client's training job, on the process that trains it (built fresh for every job by
    :meth:`Stage.client_part`: per-job values live here, never on the stage). A part whose loop hooks (``batches``,
    ``loss``, ``fits``) change anything needs the one-client loop: its stage says so in :meth:`Stage.trains_alone`."""

    def setup(self, ctx: Any) -> None:
        """After the job's context is built, before the client's state and ``client_setup``: change what the client
        trains on (``ctx.train_data``)."""

    def batches(self, n: int, batch_size: int, generator: Any, device: Any) -> Optional[Iterator[Any]]:
        """One epoch's batches of sample positions (None: the one loop's shuffled batches)."""
        return None

    def loss(self, trainee: Any, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> Optional[torch.Tensor]:
        """The tensor to differentiate at a step instead of the algorithm's ``client_loss`` (None: that one); a part
        that gives one records the step's losses itself (``trainee.record``)."""
        return None

    def fits(self, seen: int, size: int) -> bool:
        """Whether a step of ``size`` samples after ``seen`` still belongs to the job (False ends its training)."""
        return True

    def upload(self, upload: dict, shared: dict) -> dict:
        """The upload as it leaves the client, before any partial sum; ``shared``: the payload it downloaded."""
        return upload

    def upload_bytes(self, n: int) -> int:
        """The bytes the upload takes on the wire, given ``n`` (its tensors' bytes, or an earlier part's count):
        ``bytes_up`` and the simulated clock count this (a compressed encoding's values, indices and scales)."""
        return n

    def restore(self, state: Any) -> None:
        """Before ``setup``: what this stage kept for the client last time (``keep``), or None (its first job)."""

    def keep(self) -> Any:
        """After training: what this stage keeps for the client until its next job (error feedback's residual),
        held in the client state store beside the algorithm's (checkpointed, outside workers); None: nothing."""
        return None

    def report(self, seen: int) -> Any:
        """What goes back to the driver in ``TrainResult.stage[name]`` (None: nothing); ``seen``: the samples its
        steps took."""
        return None


@dataclass
class StageSetup:
    """What :meth:`Stage.check` sees before round 1: the prepared data, the server's initial model entries, the
    algorithm object, and the number of clients a round samples."""

    data: Any
    initial: dict
    algorithm: Any
    cohort: int


@dataclass
class RoundContext:
    """The round as the server-side hooks see it, after its clients reported."""

    round: int
    updates: list  # the finite ClientUpdates, in the order the server consumes them (client-id order when synchronous)
    total: Any  # the one sum (UploadSum) where the uploads were summed where the clients trained, else None
    clients: list[int]  # the round's clients, in id order: the sum's fixed groups
    server_state: dict
    shared: dict  # the shared payload the round's clients downloaded
    weighting: str  # the weights of the round's sum
    sum_group: int  # clients per group of the round's sum
    stages: StageSet
    meta: dict = field(default_factory=dict)  # the schedule's facts about each update (FedBuff: origin, staleness)
    on_nonfinite: str = "stop"
    skipped: list[int] = field(default_factory=list)  # clients whose non-finite update was dropped before the round
    abandoned: bool = False  # the schedule abandoned the round (Reports.abandoned): no server step


@dataclass
class StageEvaluation:
    """An evaluation a stage asks for after a round, run through the executor on a worker: the metric ``key`` is
    ``score(predictions)`` of the model a client without state predicts with (the global model) on
    ``inputs(data)``. Both are functions of the data alone (built once per process), so the object travels as it
    is."""

    key: str
    inputs: Callable[[Any], Any]
    score: Callable[[Any], Optional[float]]


class Stage:
    """A feature of the round (see the module docstring); a subclass overrides the hooks it takes part in."""

    name: ClassVar[str] = "stage"
    # the uploads must reach the server one by one: no sums where the clients trained (a robust rule reads each)
    needs_every_upload: ClassVar[bool] = False

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg

    # ------------------------------------------------------------------ every process
    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        """This stage's part in training ``job`` (``params``: what :meth:`job_params` sent it); None: no part."""
        return None

    # ------------------------------------------------------------------ the driver, before round 1
    def check(self, setup: StageSetup) -> None:
        """Refuse (``raysim.errors.UserError``) what the data or the algorithm rule out."""

    def stack_refusal(self) -> Optional[str]:
        """Why no client may be trained in a stack while this stage is on (None: they may)."""
        return None

    def trains_alone(self, params: Any) -> bool:
        """Whether a job that carries ``params`` for this stage needs the one-client loop (its part's ``batches``,
        ``loss`` or ``fits``): such a job is never stacked."""
        return False

    def prepare(self) -> None:
        """On the driver, once, before any worker starts: the costly set-up (calibrating a noise multiplier, reading
        a trace), so that a setting it cannot serve is one line at once. Workers never call it."""

    def weighting(self, weighting: str) -> str:
        """The weights of the round's sum, given the algorithm's (DP-FedAvg: uniform)."""
        return weighting

    # ------------------------------------------------------------------ the driver, each round
    def stop_before(self, rnd: int) -> bool:
        """True ends the run before round ``rnd`` (a privacy budget it would overspend)."""
        return False

    def select(self, rnd: int) -> Optional[list[int]]:
        """Round ``rnd``'s clients, sorted, when this stage chooses them (Poisson sampling); None: the schedule's."""
        return None

    def begin_round(self, rnd: int, clients: list[int]) -> None:
        """The clients that start round ``rnd`` as the schedule chose them (with the simulated clock, those that
        drop out too), before any of their jobs is made: what the round's jobs carry may depend on them (the
        secure-aggregation group). The synchronous schedules call it; the asynchronous ones have no round's
        clients, and a stage that needs them refuses them."""

    def job_params(self, rnd: int) -> Any:
        """What every training job of round ``rnd`` carries for this stage's client part (None: nothing)."""
        return None

    def download(self, shared: dict, rnd: int) -> dict:
        """The shared payload of round ``rnd`` as the clients get it (a compressed download, decoded), before it is
        put once for the round."""
        return shared

    def download_bytes(self, n: int, rnd: int) -> int:
        """The bytes a payload of ``n`` tensor bytes takes on the wire in round ``rnd`` (``bytes_down``)."""
        return n

    def transform_rows(self, rows: Any, ctx: RoundContext) -> None:
        """Change the round's updates as rows (``raysim.robust.rows.UpdateRows``) in place, before a rule that reads
        rows reduces them (upload attacks)."""

    def reduce(self, ctx: RoundContext) -> Optional[Callable[[], dict]]:
        """The round's mean upload from every upload, replacing the one sum (a robust rule, FedBuff's buffered
        step): a function the server step calls when it reads the mean. None: not this stage's."""
        return None

    def decode(self, total: UploadSum, ctx: RoundContext) -> UploadSum:
        """The one sum as the server reads it, from the sum of the uploads as they travelled (secure aggregation's
        masked ring sum, unmasked and back to floats). The stages decode in reverse order (the last to encode on
        the client decodes first), before any release or mean reads the sum."""
        return total

    def release(self, summed: Callable[[], Any], ctx: RoundContext) -> Optional[dict]:
        """The round's mean from the one sum (``summed()``: an UploadSum, possibly empty), finished on the server
        (DP noise); called every round, reports or not, and taken even where no client reported. None: not this
        stage's (the mean is ``summed().mean()``, taken only if the server step reads it)."""
        return None

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        """The round's metrics of this stage; ``results``: the round's finite TrainResults."""
        return {}

    def evaluations(self, rnd: int) -> list[StageEvaluation]:
        """Evaluations to run after round ``rnd``'s server step (on the executor, on the global model)."""
        return []

    def label_metrics(self, metrics: dict[str, Any]) -> None:
        """Rename or relabel the round's metrics in place, once all of them are gathered (the evaluation's, the
        algorithm's, the running totals), just before they are logged and reported: privacy moves the
        diagnostics computed from un-noised client data under ``nonprivate/``."""

    # ------------------------------------------------------------------ the checkpoint
    def state(self) -> dict:
        """What this stage adds to the checkpoint (top-level keys of ``server.pt``; plain values and tensors)."""
        return {}

    def load(self, ckpt: dict) -> None:
        """Continue from a checkpoint's :meth:`state`."""


@dataclass
class Downloads:
    """What a round's clients download: the shared payload (and its handle), each client's own payload handle
    (``client_payload``, where the algorithm sends one) and their bytes."""

    shared: dict
    shared_ref: Any
    own: dict[int, Any]
    shared_bytes: int
    own_bytes: dict[int, int]
    bytes_down: int  # the shared payload once per client, plus each client's own


@dataclass
class Reports:
    """A round's reports, as the server step consumes them."""

    finished: list[Any]  # the finite results, in the order the server consumes them
    skipped: list[int]  # clients whose non-finite update was dropped (engine.on_nonfinite=skip)
    clients: list[int]  # the round's clients: its metrics' ``clients``, the evaluation's sampled cohort
    bytes_down: int
    shared: dict  # the shared payload the round's reports were trained from (DP-FedAvg's deltas' origin)
    total: Optional[UploadSum] = None  # the one sum, where the uploads were summed where the clients trained
    metrics: dict[str, Any] = field(default_factory=dict)  # the schedule's own (simulated time, staleness)
    totals: dict[str, Any] = field(default_factory=dict)  # running totals it keeps (``sim_time_s``)
    meta: dict[str, Any] = field(default_factory=dict)  # what its own reduction needs (FedBuff's origins)
    # the schedule abandoned the round (too few reports): ``finished`` is empty by decision, not because every
    # client failed, and the round changes no server state (no reduction, no release, no server step); it still
    # counts as a round, with its metrics, evaluation and checkpoint
    abandoned: bool = False


class RoundRun(Protocol):
    """What the driver lends a schedule for a round."""

    cfg: Any
    data: Any
    algorithm: Any
    stages: StageSet
    server_state: dict

    def put(self, obj: Any) -> Any: ...

    def payload(self, rnd: int) -> dict:
        """The shared payload of round ``rnd`` (-1 or below: the evaluation's)."""

    def downloads(self, clients: list[int], rnd: int) -> Downloads: ...

    def sample(self, rnd: int, count: int) -> list[int]:
        """``count`` of the run's clients, sorted, a pure function of (seed, round): the synchronous draw."""

    def job(self, client: int, rnd: int, payload_ref: Any, own_ref: Any = None, stream: tuple[int, ...] = (),
            params: Optional[dict] = None) -> Any:
        """A training job with the stages' parameters for round ``rnd`` (and ``params`` on top)."""

    def train(self, jobs: list[Any], summable: bool) -> tuple[dict[int, Any], Optional[UploadSum]]:
        """Train ``jobs`` through the round's plan: ({client: (TrainResult, state handle)}, the one sum where the
        uploads were summed where they trained (``summable`` and no stage needs every upload), else None)."""

    def collect(self, done: dict[int, Any], rnd: int) -> tuple[list[Any], list[int]]:
        """(the finite results in client-id order, the clients whose non-finite update was skipped); the finite
        results' new states are kept."""


class Schedule(Stage):
    """The stage that decides who trains and what the server step consumes (exactly one a run, the first stage).
    ``run_round`` trains through the driver's one plan and executor (``run``: ``raysim.engine.schedule.RoundRun``)
    and returns the round's reports; the rest of the round is the driver's, the same for every schedule."""

    name = "schedule"
    # the uploads may be summed where the clients trained (a deadline needs each upload's size first)
    summable: ClassVar[bool] = True
    # the schedule's own state changes while the round trains (the asynchronous queue): no checkpoint of the last
    # round is taken after a failure from then on
    changes_state_in_training: ClassVar[bool] = False

    def run_round(self, rnd: int, run: RoundRun) -> Reports:
        raise NotImplementedError

    def end_round(self, rnd: int, run: RoundRun) -> None:
        """After the round's server step, evaluation and ``on_round_end``, before its log and checkpoint."""

    def save(self, ckpt_dir: Any) -> dict:
        """Before ``server.pt`` is written: files of its own, and the record ``server.pt`` keeps of them."""
        return self.state()

    def saved(self, ckpt_dir: Any, final: bool) -> None:
        """After ``server.pt`` is written (``final``: the run's last round)."""

    def restore(self, ckpt: dict, ckpt_dir: Any, run: RoundRun) -> None:
        """Continue from a checkpoint (after the server state is restored)."""
        self.load(ckpt)

    def close(self) -> None:
        """The run ended: release what it holds (a writer thread)."""


class StageSet:
    """The run's stages in their documented order (the schedule first), with the few questions the engine asks of
    all of them at once."""

    def __init__(self, stages: Iterable[Stage]):
        self.stages = list(stages)
        self.by_name = {s.name: s for s in self.stages}
        schedules = [s for s in self.stages if isinstance(s, Schedule)]
        self.schedule: Optional[Schedule] = schedules[0] if schedules else None

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    @property
    def needs_every_upload(self) -> bool:
        return any(s.needs_every_upload for s in self.stages)

    def weighting(self, weighting: str) -> str:
        for s in self.stages:
            weighting = s.weighting(weighting)
        return weighting

    def stack_refusal(self) -> Optional[str]:
        return next((why for s in self.stages if (why := s.stack_refusal()) is not None), None)

    def job_params(self, rnd: int) -> dict[str, Any]:
        return {s.name: p for s in self.stages if (p := s.job_params(rnd)) is not None}

    def download(self, shared: dict, rnd: int) -> dict:
        for s in self.stages:
            shared = s.download(shared, rnd)
        return shared

    def download_bytes(self, n: int, rnd: int) -> int:
        for s in self.stages:
            n = s.download_bytes(n, rnd)
        return n

    def trains_alone(self, params: dict[str, Any]) -> bool:
        return any(s.trains_alone(params.get(s.name)) for s in self.stages)

    def client_parts(self, job: Any) -> list[tuple[str, ClientPart]]:
        """Each stage's part in ``job`` (in stage order), from what the job carries for it."""
        params = job.stage
        return [(s.name, part) for s in self.stages if (part := s.client_part(job, params.get(s.name))) is not None]

    def stop_before(self, rnd: int) -> bool:
        return any(s.stop_before(rnd) for s in self.stages)

    def select(self, rnd: int) -> Optional[list[int]]:
        return next((chosen for s in self.stages if (chosen := s.select(rnd)) is not None), None)

    def begin_round(self, rnd: int, clients: list[int]) -> None:
        for s in self.stages:
            s.begin_round(rnd, clients)

    def decode(self, total: UploadSum, ctx: RoundContext) -> UploadSum:
        for s in reversed(self.stages):
            total = s.decode(total, ctx)
        return total

    def transform_rows(self, rows: Any, ctx: RoundContext) -> None:
        for s in self.stages:
            s.transform_rows(rows, ctx)

    def label_metrics(self, metrics: dict[str, Any]) -> None:
        for s in self.stages:
            s.label_metrics(metrics)

    def state(self) -> dict:
        out: dict = {}
        for s in self.stages:
            if s is not self.schedule:
                out.update(s.state())
        return out


STAGE_STATE_KEY = "__stages__"  # a client's kept state: the stages' own, beside the algorithm's entries


def split_state(state: Optional[dict]) -> tuple[Optional[dict], dict]:
    """(the algorithm's part of a client's kept state, None when it kept nothing; the stages' own, by stage name)."""
    if not state or STAGE_STATE_KEY not in state:
        return state, {}
    own = {k: v for k, v in state.items() if k != STAGE_STATE_KEY}
    return own or None, dict(state[STAGE_STATE_KEY])


# ---------------------------------------------------------------------------------------------- which stages run
StageFactory = Callable[[ExperimentConfig], Optional[Stage]]

# the built-in stages, in their documented order: each factory imports its module and returns None when its section
# is off (a module path and a function name, so that building the stages of a run without them imports nothing)
_BUILTIN: list[tuple[str, str]] = [
    ("raysim.engine.schedule", "schedule_stage"),  # the schedule: sync | the simulated clock | FedAsync/FedBuff
    ("raysim.robust.attack_stage", "attack_stage"),  # attack.*: poisoned data, attacked uploads, the backdoor's ASR
    ("raysim.privacy.stage", "central_dp_stage"),  # privacy.enabled: DP-FedAvg (clip on the client, noise here)
    ("raysim.privacy.stage", "dpsgd_stage"),  # privacy.dpsgd: sample-level DP-SGD on every client
    # compression.*: the upload encoded (after DP's clip, so what is sent is the clipped delta), the download too
    ("raysim.compression.stage", "compression_stage"),
    ("raysim.secagg.stage", "secagg_stage"),  # secagg.enabled: masked last on the client, unmasked first on the server
    ("raysim.robust.rule_stage", "rule_stage"),  # aggregator.* (and attacks on uploads): the rule on the rows
]
_PLUGINS: list[tuple[str, StageFactory]] = []


def register_stage(name: str, factory: StageFactory) -> None:
    """Add a stage from a plugin (a module named in the config's ``plugins``, imported on the driver and on every
    worker): ``factory(cfg)`` returns the stage, or None where the config does not ask for it. Plugin stages run
    after the built-in ones, in the order they registered."""
    global _PLUGINS
    _PLUGINS = [(n, f) for n, f in _PLUGINS if n != name] + [(name, factory)]


def build_stages(cfg: ExperimentConfig) -> StageSet:
    """The run's stages, in order, from the config alone (the driver and every worker build the same)."""
    import importlib

    stages: list[Stage] = []
    for module, function in _BUILTIN:
        stage = getattr(importlib.import_module(module), function)(cfg)
        if stage is not None:
            stages.append(stage)
    for _, factory in _PLUGINS:
        stage = factory(cfg)
        if stage is not None:
            stages.append(stage)
    return StageSet(stages)
