"""The hooks an algorithm overrides. The defaults are FedAvg; the round loop (engine/driver.py) exists once.

Model:
  adapt_model        change a freshly built model (MOON's projection head), on workers and driver alike
Client side (run by a worker for one virtual client; each hook gets the job's ``ClientContext``):
  init_client_state  what a client holds before its first round
  client_setup       load the client's own state and its payload into the model
  local_phases       which parameters train for how many local epochs (FedRep: head first, then body)
  client_loss        the local objective on one batch (``ctx.state`` is the client's kept state)
  client_upload      what leaves the client: weights, prototypes, counts (every tensor counts in ``bytes_up``)
  client_keep        what the client keeps for next time (stored outside workers: a dead worker loses nothing)
  eval_setup, predict   the model a client predicts with after aggregation, and its logits
Driver side:
  prepare_data, check, init_server_state,
  server_payload     what every sampled client downloads (put into the object store once a round)
  client_payload     opt-in: what one client downloads on top (FedPAC's own head), counted per client
  server_aggregate   the new server state from the round's ``ClientUpdate``s, in client-id order
  server_aggregate_mean  with summed uploads (``uploads``: a model, the default, or a mean): the new server
                     state from the round's mean upload, summed where the clients trained (FedAvg: the model)
  server_train       opt-in: server-side training (FedGen's generator), run as a job on a worker, so it has
                     reserved CPU/GPU, is retried if the worker dies, and is seeded from (seed, round)
  on_round_end       server-side curriculum and extra metrics

Which part of the model the default hooks share is declared with ``shared`` ("all", "head", "backbone" or
"none"); most algorithms need nothing else.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads, client_weight, weighted_average
from raysim.config import AlgorithmConfig, ExperimentConfig
from raysim.data.base import FederatedData
from raysim.models import BACKBONE_PREFIX, HEAD_PREFIX

TensorDict = dict[str, torch.Tensor]
# the client hooks a stack (engine.vectorize) relies on: overriding one needs a new declaration
VECTOR_HOOKS = ("adapt_model", "init_client_state", "client_setup", "local_phases", "client_loss")
# the hooks that make the upload a model the clients downloaded and the server step its average (``Uploads.model``):
# a class that overrides one needs a new declaration of ``uploads``
MODEL_HOOKS = ("init_server_state", "server_payload", "client_payload", "client_upload", "server_aggregate",
               "server_aggregate_mean", "server_train", "server_keep")


def _owner(cls: type, hooks: tuple[str, ...]) -> Optional[type]:
    """The most derived class in ``cls``'s MRO that defines one of ``hooks`` (None: none does)."""
    return next((c for c in cls.__mro__ if any(h in c.__dict__ for h in hooks)), None)


@dataclass
class ClientContext:
    """One (client, round) job as the client-side hooks see it."""

    client_id: int
    round: int  # 1-based; -1 during evaluation
    total_rounds: int
    epoch: int  # 0-based local epoch, counted across all local phases
    num_epochs: int
    payload: dict  # the shared payload merged with this client's own; a private copy, free to change
    state: dict = field(default_factory=dict)  # what the client kept last time ({} before its first round)
    meta: dict = field(default_factory=dict)  # the data's ``meta`` (what ``prepare_data`` attached), read-only
    num_classes: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    train_data: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None  # (x, y, sample index), on device
    # the current batch's sample indices in its domain (for on-demand data: within the client's own split)
    sample_idx: Optional[torch.Tensor] = None
    # this job's own values, set by one hook and read by a later one of the same job (MOON's frozen twins); gone
    # when the job ends: per-job values live here or in what a hook returns, never on the algorithm's ``self``
    scratch: dict = field(default_factory=dict)
    # the process's cache for values derived from the data alone (``memo``), shared by every job it runs
    memo: dict = field(default_factory=dict, repr=False)

    def once(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()``'s value, made once per process and device and reused by later jobs: for values that depend
        only on the data and the device (FAPD's teacher features as device tensors), never on the job."""
        full = (key, str(self.device))
        if full not in self.memo:
            self.memo[full] = build()
        return self.memo[full]


@dataclass
class ClientUpdate:
    """One client's contribution to a round, as ``server_aggregate`` and ``server_train`` see it."""

    client_id: int
    upload: dict
    num_samples: int
    loss: float = float("nan")


@dataclass
class ServerContext:
    """What ``server_train`` runs with: it runs on a worker, its RNG already seeded from (seed, round)."""

    round: int
    total_rounds: int
    seed: int
    device: torch.device
    num_classes: int
    meta: dict = field(default_factory=dict)
    # what the server kept (``server_keep``) of each of this round's clients: client id -> its newest
    # ``server_history`` kept objects, oldest first (this round's last), on the CPU; {} when nothing is kept
    history: dict = field(default_factory=dict)


class SummedUpload(dict):
    """``ClientUpdate.upload`` of a client whose upload was summed where it trained (``Algorithm.uploads`` not
    apart): reading it is an error that says what to declare, never a silent empty dict."""

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError("ClientUpdate.upload: this round's uploads were summed where the clients trained "
                           "(Algorithm.uploads is a model, a mean or named statistics): server_aggregate gets their "
                           "mean from updates.mean(); declare uploads = Uploads.apart() to receive every upload")

    __getitem__ = get = keys = items = values = __iter__ = __len__ = __contains__ = _refuse  # type: ignore


class RoundUpdates(list):
    """The round's finite ``ClientUpdate``s in client-id order, as ``server_aggregate`` receives them, with the
    round's mean upload (``mean()``): summed where the clients trained, or over the uploads here, by the one sum
    (``raysim.algorithms.aggregation``) and the algorithm's weighting."""

    def __init__(self, updates: Iterable[ClientUpdate], mean: Callable[[], TensorDict]):
        super().__init__(updates)
        self._mean = mean

    def mean(self) -> TensorDict:
        return self._mean()


_LIVE: "weakref.WeakKeyDictionary[nn.Module, TensorDict]" = weakref.WeakKeyDictionary()


def live_state(model: nn.Module) -> TensorDict:
    """``model.state_dict(keep_vars=True)``: the model's own parameters and persistent buffers by key, walked once per
    model object. The client hooks run once per job, and a state-dict walk visits every module (~10 µs each); a
    worker's model objects keep their tensors for life (jobs reset and load them in place, as the core's reset does).
    """
    live = _LIVE.get(model)
    if live is None:
        live = _LIVE[model] = dict(model.state_dict(keep_vars=True))
    return live


def live_parameters(model: nn.Module) -> list[nn.Parameter]:
    """``list(model.parameters())`` (same objects, same order) without a module walk: from :func:`live_state`."""
    seen: dict[int, nn.Parameter] = {}
    for t in live_state(model).values():
        if isinstance(t, nn.Parameter):
            seen.setdefault(id(t), t)
    return list(seen.values())


def load_entries(model: nn.Module, entries: dict) -> None:
    """``model.load_state_dict(entries, strict=False)`` without its per-module walk: each tensor copied into the live
    entry of the same key; keys the model lacks are ignored. A shape mismatch goes to ``load_state_dict`` for its
    own error."""
    live = live_state(model)
    with torch.no_grad():
        for key, value in entries.items():
            target = live.get(key)
            if target is None:
                continue
            if not isinstance(value, torch.Tensor) or target.shape != value.shape:
                model.load_state_dict(entries, strict=False)  # raises its own message
                return
            target.copy_(value)


def split_state(model: nn.Module, keep: Callable[[str], bool]) -> TensorDict:
    """Detached CPU copies of the state entries whose key ``keep`` accepts."""
    return {k: v.detach().cpu().clone() for k, v in live_state(model).items() if keep(k)}


RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


def is_running_stat(key: str) -> bool:
    """A batch-norm layer's running statistic (a buffer, never a gradient's target): averaged by the server, never
    stepped by a server optimiser or corrected like a parameter (FedOpt, SCAFFOLD, FedDyn)."""
    return key.rsplit(".", 1)[-1] in RUNNING_STATS


def is_parameter(key: str, value: torch.Tensor) -> bool:
    """A state-dict entry that is a trained parameter (floating point, not a running statistic): what a server
    optimiser steps and what SCAFFOLD's and FedDyn's server states cover, read from the entry alone."""
    return value.is_floating_point() and not is_running_stat(key)


def batchnorm_keys(keys: Iterable[str]) -> set[str]:
    """Every state-dict entry of the batch-norm layers among ``keys`` (their weight, bias and running statistics):
    the entries of each module that holds a ``running_mean``. Read from the keys alone, so the driver (which holds
    only a state dict) and the workers (which hold the model) agree on them. FedBN keeps these local."""
    keys = list(keys)
    prefixes = {k[:-len("running_mean")] for k in keys if k.rsplit(".", 1)[-1] == "running_mean"}
    return {k for k in keys for p in prefixes if k.startswith(p) and "." not in k[len(p):]}


@torch.no_grad()
def eval_features(model: nn.Module, x: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """``model.features`` of every row of ``x``, in eval mode (batch norm on its running statistics), without
    autograd and in chunks, the model's mode restored: prototypes and feature statistics over a client's split."""
    was_training = model.training
    model.eval()
    try:
        return torch.cat([model.features(x[b:b + chunk]) for b in range(0, len(x), chunk)])
    finally:
        model.train(was_training)


class Algorithm:
    """A federated algorithm as a set of hooks (see the module docstring); the defaults are FedAvg.

    One instance lives on the driver and one on each worker; both are built from the whole config (``self.cfg``,
    with the algorithm's own keys in ``self.config``). Hooks must be pure functions of their inputs and the seeded
    RNG, so that a job re-run after a worker dies, or run on another worker, gives the same numbers.
    """

    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    name: ClassVar[str] = "base"
    shared: ClassVar[str] = "all"  # all | head | backbone | none
    eval_needs_train_data: ClassVar[bool] = False  # True: evaluation's ctx.train_data is set (local fine-tuning)
    clip_grad_norm: Optional[float] = None  # set: the worker clips each step's gradient norm to it (FedNH: 10)
    server_history: int = 0  # > 0: the server keeps that many of each client's newest ``server_keep`` objects (FedCDA)
    # What the clients upload and how the server step reads it, declared once (``Uploads``: a model average, a
    # weighted mean, named statistics with their own weights, or uploads kept apart); the engine infers nothing
    # from which hooks a class overrides, and every capability follows from it: the sums where the clients trained
    # (any but apart), DP-FedAvg, FedAsync/FedBuff and the robust rules (a model). A model declaration covers the
    # class that makes it and the classes derived from it that override none of MODEL_HOOKS (see
    # ``declared_uploads``); the default is FedAvg's hooks' own: a model, weighted by training samples
    uploads: ClassVar[Uploads] = Uploads.model()
    # engine.vectorize: the client hooks can train many clients as one batched computation (docs/hooks.md); a
    # subclass that overrides one of VECTOR_HOOKS must declare it again
    vectorizable: ClassVar[bool] = False
    # TensorBoard's custom-scalars page: title -> tags of the algorithm's own charts (FAPD: its curriculum's k)
    tensorboard_charts: ClassVar[dict[str, list[str]]] = {}

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        self.config: Any = cfg.algorithm  # the algorithm's own Config dataclass (FAPDConfig, ...)

    @classmethod
    def declared_uploads(cls) -> Uploads:
        """``uploads`` as it covers this class: a model declaration inherited from a class less derived than one
        that overrides a hook of ``MODEL_HOOKS`` (the server state, the payloads, the upload or the server step)
        does not cover hooks it never saw, so such a class's uploads are the same weighted mean, not a model."""
        declared = next(c for c in cls.__mro__ if "uploads" in c.__dict__)
        uploads: Uploads = declared.__dict__["uploads"]
        if uploads.kind == "model" and not issubclass(declared, _owner(cls, MODEL_HOOKS) or declared):
            return Uploads.mean(uploads.weighting)
        return uploads

    @classmethod
    def refusal(cls, feature: str, cfg: Optional[ExperimentConfig] = None) -> Optional[str]:
        """Why this algorithm cannot serve ``feature`` (None: it can), from its declarations alone:

        - ``"stack"`` (``engine.vectorize``: clients stacked in one batched computation): ``vectorizable = True``
          in a class at least as derived as every class that defines one of ``VECTOR_HOOKS``;
        - ``"async"`` (FedAsync, FedBuff), ``"privacy"`` (DP-FedAvg), ``"robust"`` (a robust rule or an attack on
          the uploads): a model upload (``declared_uploads``) shared by the server, no per-client history on the
          server, and for privacy no server-side training from the uploads; robust rules also need the whole model
          shared (``shared = "all"``).

        With ``cfg``, the reason its settings give too (the Config's ``refusal``: Ditto's ``select_lam`` cannot be
        stacked). The built-ins' answers are also kept torch-free in ``raysim.capabilities``, which the
        config checks read."""
        static = cls._static_refusal(feature)
        if static is not None or cfg is None:
            return static
        return cfg.algorithm.refusal(feature)

    @classmethod
    def _static_refusal(cls, feature: str) -> Optional[str]:
        """:meth:`refusal` from the class's declarations alone."""
        if feature == "stack":
            declared = next((c for c in cls.__mro__ if "vectorizable" in c.__dict__), None)
            if declared is None or not declared.__dict__["vectorizable"]:
                return "declares no vectorisable client hooks (Algorithm.vectorizable)"
            owner = _owner(cls, VECTOR_HOOKS)
            if owner is not None and not issubclass(declared, owner):
                overridden = ", ".join(h for h in VECTOR_HOOKS if h in owner.__dict__)
                return f"has a loss of its own ({owner.__name__} overrides {overridden}): declare vectorizable again"
            return None
        uploads = cls.declared_uploads()
        if uploads.kind != "model":
            if cls.uploads.kind == "model":
                owner = _owner(cls, MODEL_HOOKS)
                overridden = ", ".join(h for h in MODEL_HOOKS if owner is not None and h in owner.__dict__)
                return (f"has a server step of its own ({getattr(owner, '__name__', '?')} overrides {overridden}): "
                        f"declare its uploads again (Algorithm.uploads)")
            what = {"apart": "needs every upload of a round at once", "mean": "uploads a weighted mean, not a model",
                    "stats": "uploads named statistics, not a model"}[uploads.kind]
            return f"{what} (Algorithm.uploads = Uploads.{uploads.kind}(...))"
        if cls.server_history > 0:
            return "keeps per-client history on the server"
        if feature == "privacy" and cls.server_train is not Algorithm.server_train:
            return "trains on the server from the uploads"
        if cls.shared == "none":
            return "shares no model"
        if feature == "robust" and cls.shared != "all":
            return "averages only part of the model"
        return None

    @classmethod
    def config_warnings(cls, cfg: ExperimentConfig) -> list[str]:
        """Settings this algorithm runs but that mean less than they seem (UNIDEAL: a p-schedule that cannot move):
        one message each, printed as a ``raysim: warning:`` line whenever such a config is loaded to run. By default
        the algorithm's Config says (``AlgorithmConfig.config_warnings``): the built-ins' warnings live there, so that
        a config loads without importing its algorithm."""
        return cfg.algorithm.config_warnings(cfg)

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

    def check(self, cfg: ExperimentConfig, data: FederatedData) -> None:
        """Refuse configs the algorithm cannot run (raise UserError)."""
        from raysim.errors import UserError

        if self.shared in ("all", "backbone") and len(set(cfg.model.names())) > 1:
            what = "model" if self.shared == "all" else "backbone"
            raise UserError(f"config key 'model.name': {self.name} averages the {what}, "
                            f"so every client needs the same architecture")
        if self.shared in ("all", "backbone") and len(data.input_shapes()) > 1:
            raise UserError(f"config key 'algorithm.name': {self.name} averages the "
                            f"{'model' if self.shared == 'all' else 'backbone'}, but clients' inputs differ in shape "
                            f"(use a head-sharing algorithm such as partialavg or unideal)")

    # ----------------------------------------------------------------- model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Change a freshly built model (add or replace layers). Runs right after construction under the same
        seeded RNG on every worker and on the driver, so the result is identical everywhere. Keep ``backbone``,
        ``head`` and ``features(x)``: the default hooks and the head-sharing algorithms rely on them."""
        return model

    # ----------------------------------------------------------------- driver side
    def prepare_data(self, data: Any) -> Any:
        """Called once on the driver before the data goes into the object store (FAPD carves out a server split
        and attaches teacher features to ``data.meta`` here, so workers receive them once, with the data)."""
        return data

    def init_server_state(self, initial_state: TensorDict) -> dict:
        return {"model": {k: v.clone() for k, v in initial_state.items() if self.is_shared(k)}}

    def server_payload(self, server_state: dict, round: int) -> dict:
        """What every sampled client downloads this round: put into the object store once, and counted in
        ``bytes_down`` once per sampled client. ``round`` is -1 for the evaluation after a round."""
        return {"model": server_state["model"]} if server_state["model"] else {}

    def client_payload(self, server_state: dict, client_id: int, round: int) -> Optional[dict]:
        """Opt-in: what client ``client_id`` alone downloads on top of the shared payload (its keys win). None, the
        default, sends nothing per client; each client's own payload is counted in ``bytes_down`` for that client.
        ``round`` is -1 for the evaluation after a round."""
        return None

    def eval_payload(self, server_state: dict) -> dict:
        """What evaluation after aggregation sees: by default the payload the next round would send."""
        return self.server_payload(server_state, round=-1)

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        """The new server state from this round's finite updates (sorted by client id); FedAvg by default: the
        round's mean upload (weighted by ``weighting``), handed to ``server_aggregate_mean``.

        With summed uploads (``uploads`` not apart) the uploads were summed where the clients trained:
        ``updates`` is a :class:`RoundUpdates` whose ``mean()`` is their mean, and each ``upload`` a
        :class:`SummedUpload`. An override that only observes (logs, counts) and calls this keeps the sums."""
        if not updates:
            return server_state
        if isinstance(updates, RoundUpdates):
            mean = updates.mean()
        else:  # called directly with a list (a unit test, a subclass's own use)
            mean = weighted_average([u.upload for u in updates], [client_weight(u.num_samples, self.sum_weighting)
                                                                  for u in updates]) if updates[0].upload else {}
        if mean:  # nothing uploaded (shared = "none"): nothing to aggregate
            server_state = self.server_aggregate_mean(mean, server_state, round)
        return server_state

    def server_aggregate_mean(self, mean: dict, server_state: dict, round: int) -> dict:
        """With summed uploads: the new server state from the round's mean upload, Σ w_i·upload_i / Σ w_i
        over the finite updates (the upload's nested dict, each tensor in its own dtype). FedAvg: the model."""
        server_state["model"] = mean
        return server_state

    @property
    def weighting(self) -> str:
        """The weights of the round's mean model: ``algorithm.weighting`` where the config sets it, else the
        declared one (``samples`` for uploads kept apart, where an algorithm that averages does it in its own
        ``server_aggregate``)."""
        chosen = getattr(self.config, "weighting", None)
        if chosen is not None:
            return chosen
        uploads = type(self).declared_uploads()
        return uploads.weighting if uploads.kind in ("model", "mean") else "samples"

    @property
    def sum_weighting(self) -> str | dict[str, str]:
        """The weights of the round's sum: one weighting, or one per named statistic (``Uploads.stats``)."""
        return type(self).declared_uploads().weights(getattr(self.config, "weighting", None))

    @property
    def sums_uploads(self) -> bool:
        """Whether the engine sums this algorithm's uploads where the clients trained: its declared uploads are
        summed (not apart), and it declares nothing that needs each upload on the server: no per-client history
        (``server_history``), no server-side training from the updates (``server_train``)."""
        return type(self).declared_uploads().summed and self.server_history < 1 and not self.trains_on_server

    def server_train(self, server_state: dict, updates: list[ClientUpdate], ctx: ServerContext) -> dict:
        """Opt-in server-side training after ``server_aggregate``; returns the new server state.

        Only called when a subclass overrides it. It runs as a job on a worker, so it has the CPU/GPU reserved for
        that worker, it is re-run if the worker dies, and its RNG is seeded from (seed, round): keep it a pure
        function of its arguments and the run stays deterministic whatever the number of workers."""
        return server_state

    @property
    def trains_on_server(self) -> bool:
        return type(self).server_train is not Algorithm.server_train

    def server_keep(self, update: ClientUpdate, round: int) -> Any:
        """With ``server_history`` > 0: what the server keeps of one client's finite update (default: its upload;
        None keeps nothing this round). Each client's newest ``server_history`` objects are held per client in the
        object store (spilled past ``engine.state_memory_gb``, never in the driver's heap), checkpointed with the
        run, and handed to ``server_train`` as ``ctx.history`` for the round's clients (FedCDA's model cache)."""
        return update.upload

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        """Server-side curriculum and extra metrics; returns entries to add to the round's metrics."""
        return {}

    # ----------------------------------------------------------------- client side
    def init_client_state(self, model: nn.Module, ctx: ClientContext) -> dict:
        """What a client holds before its first round (``ctx.state`` then; nothing by default)."""
        return {}

    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """Load the client's kept state (``ctx.state``), then its payload's model (``ctx.payload``), into the model."""
        if ctx.state:
            load_entries(model, ctx.state)
        if ctx.payload.get("model"):
            load_entries(model, ctx.payload["model"])

    def local_phases(self, model: nn.Module, ctx: ClientContext) -> list[tuple]:
        """(parameters to train, local epochs[, learning rate]) per phase, in order; a fresh optimiser each phase,
        at ``train.lr`` unless the phase names its own (FedPAC: the head at 0.1, the body at 0.01)."""
        return [(live_parameters(model), self.cfg.train.local_epochs)]

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Returns the loss to minimise and named parts to log (averaged per client, then over clients)."""
        return F.cross_entropy(model(x), y), {}

    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        return split_state(model, self.is_shared)

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        return split_state(model, lambda k: not self.is_shared(k))

    def eval_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """Make the model a client would predict with after this round's aggregation (``ctx.round`` is -1)."""
        self.client_setup(model, ctx)

    def predict(self, model: nn.Module, x: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        """Logits at evaluation (FedRoD adds a personal head, prototype methods compare with prototypes)."""
        return model(x)
