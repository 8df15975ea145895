"""Typed experiment configuration: dataclass schema -> OmegaConf (YAML + dotted overrides) -> validated object.

A config file holds only the keys that differ from the defaults below. ``extends: other.yaml`` (relative to the
file) layers a file on top of another, so CPU-sized siblings of paper configs stay a few lines long.
Every mistake becomes a :class:`ConfigError` whose one-line message names the offending key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raysim.async_config import AsynchronousConfig, check_asynchronous
from raysim.errors import UserError
from raysim.robust.config import AggregatorConfig, AttackConfig, check_robust
from raysim.privacy.config import PrivacyConfig, check_privacy
from raysim.system.config import SystemConfig


class ConfigError(UserError):
    """A config key is unknown, mistyped or holds an impossible value."""


def require(ok: bool, key: str, why: str) -> None:
    """Refuse a config value: ``config key 'KEY': WHY`` unless ``ok`` (every config class's validate uses this)."""
    if not ok:
        raise ConfigError(f"config key '{key}': {why}")


def is_whole(value: Any, low: int = 0) -> bool:
    """An integer (not a bool) >= ``low``: what a count in a config must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_finite(value: Any, low: float = float("-inf"), *, strict: bool = False) -> bool:
    """A finite number (not NaN, not a bool) >= ``low`` (> ``low`` with ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > low if strict else value >= low


def flatten_dict(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{a: {b: 1}}`` -> ``{"a.b": 1}``: nested mappings (sweep files, run configs read back by reports), or nested
    dataclasses (an :class:`ExperimentConfig`), as dotted keys. Only nodes of the root's kind nest: a dict-valued
    field of a config dataclass stays one value."""
    if dataclasses.is_dataclass(tree):
        nested: Any = dataclasses.is_dataclass
        items = [(f.name, getattr(tree, f.name)) for f in dataclasses.fields(tree)]
    else:
        nested, items = (lambda v: isinstance(v, dict)), list(tree.items())
    out: dict[str, Any] = {}
    for key, value in items:
        if nested(value):
            out.update(flatten_dict(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


PARTITIONS = ("iid", "dirichlet", "pathological", "shard", "natural", "linear", "square", "exponential",
              "inner_dirichlet", "niid1", "niid2", "legacy_iid", "legacy_dirichlet")


def _one_of(value: Any, key: str, choices: tuple) -> None:
    require(value in choices, key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")


@dataclass
class ClientsConfig:
    num: int = 10  # virtual clients in the federation
    fraction: float = 1.0  # share of clients sampled each round, in (0, 1]

    def validate(self) -> None:
        require(self.num >= 1, "clients.num", f"must be >= 1, got {self.num}")
        require(0.0 < self.fraction <= 1.0, "clients.fraction", f"must be in (0, 1], got {self.fraction}")

    @property
    def per_round(self) -> int:
        """The clients a round samples: ``fraction`` x ``num`` rounded half up, at least one."""
        return max(1, int(math.floor(self.fraction * self.num + 0.5)))


@dataclass
class DataConfig:
    name: str = "sklearn_digits"  # dataset (raysim list datasets)
    root: Optional[str] = None  # directory holding full datasets in their native layout
    cache_dir: Optional[str] = None  # where generated datasets are cached (default: the user's cache dir)
    # Flower Datasets' partitioners (raysim.data.flower): iid | dirichlet | pathological | shard | natural | linear |
    # square | exponential | inner_dirichlet; raysim's own: niid1 | niid2 (a domain per client group); legacy_iid |
    # legacy_dirichlet (raysim's splits before Flower's, which runs made with them keep on --resume)
    partition: str = "dirichlet"
    # Dirichlet concentration for label skew; for synthetic, FedProx's α (spread of the clients' models, >= 0).
    # null: the dataset's default, 0.5 for a Dirichlet split, 1 for synthetic
    alpha: Optional[float] = None
    beta: Optional[float] = None  # synthetic: FedProx's β, spread of the clients' inputs (>= 0; null: 1)
    dimension: int = 60  # synthetic: input features per sample (the paper's 60)
    min_samples: int = 10  # each client holds at least this many samples (train + test)
    self_balancing: bool = False  # dirichlet: Flower's self_balancing (no class goes to a client above the mean size)
    classes_per_client: int = 2  # pathological: classes per client (Flower's num_classes_per_partition)
    # pathological: how classes are given to clients: random | deterministic | first-deterministic (Flower's modes)
    class_assignment: str = "random"
    shards_per_client: Optional[int] = 2  # shard: shards per client (McMahan et al.'s 2); null: from data.shard_size
    shard_size: Optional[int] = None  # shard: samples per shard (null: the split size / (clients x shards))
    keep_incomplete_shard: bool = False  # shard: keep the last, smaller shard (Flower's keep_incomplete_shard)
    partition_sizes: list[int] = field(default_factory=list)  # inner_dirichlet: samples per client (empty: equal)
    test_fraction: float = 0.2  # per-client held-out share
    domains: list[str] = field(default_factory=list)  # digits: subset of mnist, mnistm, synth (empty = all)
    clients_per_domain: int = 1  # niid1/niid2: each domain split over this many clients
    # niid2: split (each domain dealt to its clients_per_domain clients with Dirichlet(alpha) label proportions; one
    # client per domain is then niid1) | subsample (each client keeps a Dirichlet(alpha) class mix of its niid1
    # share and drops the surplus: UNIDEAL's three-client NIID-2)
    label_skew: str = "split"
    samples_per_domain: Optional[int] = None  # cap on generated/loaded samples per domain (synthetic: per client)
    feature_fraction: float = 0.5  # tabular: share of the columns each client sees
    # tabular: sliced (a client's input is its own columns only, widths differ) | shared (every client's input is
    # the whole column space, its own columns at their global index and the others zero: averaging can run)
    feature_layout: str = "sliced"
    # images: resize every domain to this side once, when the data is built (null: native sizes); with
    # data.channels, MNIST (1x28x28) and MNIST-M/SynthDigits (3x32x32) share one shape, so averaging can run
    image_size: Optional[int] = None
    # images: 1 (greyscale) or 3 (grey repeated into RGB) for every domain (null: native)
    channels: Optional[int] = None
    # share of every client's training samples held by the server, for every algorithm (FAPD's teacher and PCA use
    # it), so methods compared on one setting train on the same client data
    server_holdout: float = 0.0
    # CIFAR-10/100, Tiny-ImageNet: official (clients partition the training split; acc_global on the official test
    # split, held by the evaluation) | pooled (train + test pooled, clients split their own share); sets without an
    # official test split are always pooled
    test_split: str = "official"
    augment: bool = False  # images: random crop (padding 4) + horizontal flip per training batch, seeded per job

    def validate(self) -> None:
        _one_of(self.partition, "data.partition", PARTITIONS)
        require(self.classes_per_client >= 1, "data.classes_per_client", f"must be >= 1, got {self.classes_per_client}")
        _one_of(self.class_assignment, "data.class_assignment", ("random", "deterministic", "first-deterministic"))
        if self.shards_per_client is not None:
            require(self.shards_per_client >= 1, "data.shards_per_client", "must be >= 1 (or null)")
        if self.shard_size is not None:
            require(self.shard_size >= 1, "data.shard_size", "must be >= 1 (or null)")
        require(self.partition != "shard" or self.shards_per_client is not None or self.shard_size is not None,
                "data.shards_per_client", "the shard partition needs data.shards_per_client or data.shard_size")
        require(all(n >= 1 for n in self.partition_sizes), "data.partition_sizes", "sizes must be >= 1")
        if self.name == "synthetic":  # FedProx's Synthetic(α, β): α = β = 0 is the paper's most similar setting
            self.alpha = 1.0 if self.alpha is None else self.alpha
            self.beta = 1.0 if self.beta is None else self.beta
            require(self.alpha >= 0, "data.alpha", f"must be >= 0 for synthetic, got {self.alpha}")
            require(self.beta >= 0, "data.beta", f"must be >= 0, got {self.beta}")
            require(self.dimension >= 1, "data.dimension", f"must be >= 1, got {self.dimension}")
        else:
            self.alpha = 0.5 if self.alpha is None else self.alpha
            require(self.alpha > 0, "data.alpha", f"must be > 0, got {self.alpha}")
        require(self.min_samples >= 2, "data.min_samples", f"must be >= 2, got {self.min_samples}")
        require(0.0 < self.test_fraction < 1.0, "data.test_fraction", f"must be in (0, 1), got {self.test_fraction}")
        require(self.clients_per_domain >= 1, "data.clients_per_domain", "must be >= 1")
        require(0.0 < self.feature_fraction <= 1.0, "data.feature_fraction", "must be in (0, 1]")
        if self.samples_per_domain is not None:
            require(self.samples_per_domain >= 10, "data.samples_per_domain", "must be >= 10")
        _one_of(self.label_skew, "data.label_skew", ("split", "subsample"))
        _one_of(self.feature_layout, "data.feature_layout", ("sliced", "shared"))
        if self.image_size is not None:
            require(self.image_size >= 1, "data.image_size", f"must be >= 1, got {self.image_size}")
        if self.channels is not None:
            _one_of(self.channels, "data.channels", (1, 3))
        require(0.0 <= self.server_holdout < 1.0, "data.server_holdout",
                f"must be in [0, 1), got {self.server_holdout}")
        _one_of(self.test_split, "data.test_split", ("official", "pooled"))


@dataclass
class ModelConfig:
    # one architecture for every client, or a list with one entry per client (HETE)
    name: Any = field(default="mlp", metadata={"type": "str | list[str]"})
    feature_dim: int = 64  # backbone output size; heads are Linear(feature_dim, classes) everywhere
    hidden: list[int] = field(default_factory=lambda: [128])  # MLP hidden widths before the feature layer
    width: int = 32  # CNN base channel count
    # pretrained backbone: a state dict file in torchvision's format (torch.save(backbone.state_dict())), loaded
    # into every client's backbone when it is built; or a list with one path (or null) per client (HETE)
    weights: Any = None

    def names(self) -> list[str]:
        return list(self.name) if isinstance(self.name, (list, tuple)) else [self.name]

    def for_client(self, client_id: int) -> str:
        names = self.names()
        return names[client_id] if len(names) > 1 else names[0]

    def weights_for(self, client_id: int) -> Optional[str]:
        """The backbone weights file of client ``client_id`` (None: randomly initialised)."""
        w = self.weights
        if isinstance(w, (list, tuple)):
            return w[client_id] if len(w) > 1 else (w[0] if w else None)
        return w

    def validate(self) -> None:
        names = self.names()
        require(len(names) >= 1 and all(isinstance(n, str) and n for n in names), "model.name",
                 "must be a model name or a list of names")
        require(self.feature_dim >= 1, "model.feature_dim", "must be >= 1")
        require(all(h >= 1 for h in self.hidden), "model.hidden", "widths must be >= 1")
        require(self.width >= 1, "model.width", "must be >= 1")
        if self.weights is not None:
            listed = isinstance(self.weights, (list, tuple))
            paths = list(self.weights) if listed else [self.weights]
            require(all(p is None or (isinstance(p, str) and p) for p in paths), "model.weights",
                     "must be a file path or a list with one path (or null) per client")
            paths = [None if p is None else str(Path(p).expanduser().resolve()) for p in paths]
            for p in paths:  # absolute now: a Tune trial's run may start in another working directory
                require(p is None or Path(p).is_file(), "model.weights",
                         f"file not found: {p} (expected a torchvision-format state dict of the backbone, "
                         f"saved with torch.save(backbone.state_dict(), PATH))")
            self.weights = paths if listed else paths[0]


@dataclass
class TrainConfig:
    lr: float = 0.05  # local learning rate
    local_epochs: int = 1  # passes over its training split each sampled client makes per round
    batch_size: int = 32  # local mini-batch size
    optimizer: str = "sgd"  # sgd | adam; a fresh optimiser per client job (the usual FL simulation choice)
    momentum: float = 0.0  # SGD momentum, in [0, 1)
    weight_decay: float = 0.0  # L2 penalty of the local optimiser

    def validate(self) -> None:
        require(is_finite(self.lr, 0, strict=True), "train.lr", f"must be a finite number > 0, got {self.lr}")
        require(self.local_epochs >= 1, "train.local_epochs", f"must be >= 1, got {self.local_epochs}")
        require(self.batch_size >= 1, "train.batch_size", f"must be >= 1, got {self.batch_size}")
        _one_of(self.optimizer, "train.optimizer", ("sgd", "adam"))
        require(0.0 <= self.momentum < 1.0, "train.momentum", "must be in [0, 1)")
        require(is_finite(self.weight_decay, 0), "train.weight_decay", f"must be a finite number >= 0, got "
                f"{self.weight_decay}")


@dataclass
class AlgorithmConfig:
    """Base of every algorithm's config; each algorithm file subclasses it with its own keys."""

    name: str = "fedavg"  # algorithm (raysim list algorithms); its own keys follow under algorithm.*
    # the weights of the round's mean upload: samples (each client's training samples, FedAvg's n_k/n) or uniform
    # (every client 1); null: the algorithm's own declaration (Algorithm.uploads). Summed where the clients
    # trained either way
    weighting: Optional[str] = None

    def validate(self) -> None:
        pass

    def config_warnings(self, cfg: "ExperimentConfig") -> list[str]:
        """Settings of these keys that run but mean less than they seem (what ``Algorithm.config_warnings`` returns
        by default): here, so that loading a config warns without importing the algorithm (and torch)."""
        return []


@dataclass
class EngineConfig:
    # auto | ray | inline: inline runs every job in this process, without Ray (notebooks, breakpoint() in a hook,
    # fast small runs); ray runs them on worker actors (several workers, GPUs, clusters). auto: inline for one
    # CPU worker when no Ray cluster is in sight (see raysim.engine.backend.choose_backend), else ray
    backend: str = "auto"
    # ClientWorker actors (processes) that run the virtual clients. null (the default): 1 in this process on one
    # machine with no Ray cluster or GPU in sight, else 2 Ray workers (raysim.raysight.default_workers); the
    # numbers are the same either way
    num_workers: Optional[int] = None
    cpus_per_worker: float = 1.0  # CPUs Ray reserves per worker (also its torch threads)
    gpus_per_worker: float = 0.0  # GPUs per worker; fractions below 1 share a GPU (0.25: four per GPU)
    # null: like ray.init() (RAY_ADDRESS, else a live `ray start` cluster, else its own Ray); local; auto; host:port
    address: Optional[str] = None
    driver_cpus: float = 0.0  # CPUs reserved for the driver's process (it mostly waits on workers)
    jobs_per_worker: int = 2  # jobs in flight per worker, so a worker never idles between jobs
    # clients trained per Ray call: auto (as many as make a call ~20 ms of measured work, 1 for long updates) or N;
    # sum groups (partial_sums) go whole, as many as fit in N clients
    clients_per_call: str = "auto"
    # a weighted-sum algorithm's uploads (FedAvg, FedProx, UNIDEAL, FAPD, ...) are summed where the clients trained:
    # each group of sum_group clients trains in one call and only its sum travels to the driver. false: every
    # upload travels and the driver sums the same groups itself (the same numbers; raysim.algorithms.aggregation)
    partial_sums: bool = True
    # the round's clients, in id order, in fixed groups of this many (auto: about √(2n) groups of n). The groups, never
    # the workers, fix the order of summation, so changing this changes the last float bits
    sum_group: str = "auto"
    # off | auto | N: train up to N same-architecture clients of a call as one batched computation (torch.func),
    # for algorithms that declare vectorisable client hooks; cohorts are fixed groups of each round's clients in id
    # order. auto (the default) measures one-at-a-time against stacked updates once, at the first round, within a
    # memory budget, and stacks only where that is faster and gives the same numbers bit for bit; a run too short to
    # repay the probe trains one at a time (raysim.engine.vectorize_probe); off: one client at a time
    vectorize: str = "auto"
    max_retries: int = 3  # re-runs of one client job after its worker died
    on_nonfinite: str = "stop"  # stop | skip: what to do with a client update holding NaN/Inf
    state_memory_gb: Optional[float] = None  # local Ray object store size; client state beyond it spills to disk
    dashboard: bool = False  # start Ray's dashboard with a local Ray
    # a worker on a GPU uses deterministic algorithms only (cuDNN, torch.use_deterministic_algorithms, cuBLAS's fixed
    # workspace) and no TF32: the same numbers on every run and worker count, at some speed (docs/gpu.md)
    deterministic: bool = True

    def validate(self) -> None:
        _one_of(self.backend, "engine.backend", ("auto", "ray", "inline"))
        if self.num_workers is None:
            from raysim.raysight import default_workers

            self.num_workers, self.workers_chosen = default_workers(self)  # the choice, and its reason
        require(self.num_workers >= 1, "engine.num_workers", f"must be >= 1, got {self.num_workers}")
        require(self.cpus_per_worker > 0, "engine.cpus_per_worker", f"must be > 0, got {self.cpus_per_worker}")
        require(self.gpus_per_worker >= 0, "engine.gpus_per_worker", "must be >= 0")
        require(self.gpus_per_worker <= 1 or float(self.gpus_per_worker).is_integer(), "engine.gpus_per_worker",
                 "fractions are allowed only below 1")
        require(self.driver_cpus >= 0, "engine.driver_cpus", "must be >= 0")
        require(self.jobs_per_worker >= 1, "engine.jobs_per_worker", "must be >= 1")
        per_call = self.clients_per_call = str(self.clients_per_call)
        require(per_call == "auto" or (per_call.isdigit() and int(per_call) >= 1), "engine.clients_per_call",
                 f"must be auto or a whole number >= 1, got {per_call!r}")
        group = self.sum_group = str(self.sum_group)
        require(group == "auto" or (group.isdigit() and int(group) >= 1), "engine.sum_group",
                 f"must be auto or a whole number of clients >= 1, got {group!r}")
        vectorize = self.vectorize = str(self.vectorize)
        if vectorize in ("False", "false"):  # YAML reads a bare off as false
            vectorize = self.vectorize = "off"
        require(vectorize in ("off", "auto") or (vectorize.isdigit() and int(vectorize) >= 1), "engine.vectorize",
                "must be off, auto or a whole number >= 1 (clients per cohort), got "
                + ("true (YAML reads yes, on and true so)" if vectorize in ("True", "true") else repr(vectorize)))
        require(self.max_retries >= 0, "engine.max_retries", "must be >= 0")
        _one_of(self.on_nonfinite, "engine.on_nonfinite", ("stop", "skip"))
        if self.state_memory_gb is not None:
            require(self.state_memory_gb > 0, "engine.state_memory_gb", "must be > 0")
        if self.backend == "inline":
            require(self.address in (None, "local"), "engine.backend",
                    f"inline runs every job in this process and cannot use the cluster at engine.address="
                    f"{self.address}; use engine.backend=ray (or auto)")
            require(self.state_memory_gb is None, "engine.backend",
                    "inline holds client states in this process's memory, while engine.state_memory_gb budgets "
                    "Ray's object store; use engine.backend=ray (or auto), or drop engine.state_memory_gb")


@dataclass
class EvalConfig:
    every: int = 1  # evaluate every N rounds (and always after the last)
    # whose test split is evaluated: all | sampled (the round's clients) | N (a fixed cohort of N clients drawn
    # from the seed) | auto (all up to 10,000 clients, else a cohort of 1,000)
    clients: str = "auto"
    chunk: int = 1024  # test samples predicted per forward pass (lower it when evaluation runs out of GPU memory)

    def validate(self) -> None:
        require(self.every >= 1, "eval.every", "must be >= 1")
        require(isinstance(self.chunk, int) and self.chunk >= 1, "eval.chunk",
                 f"must be a whole number >= 1, got {self.chunk}")
        self.clients = str(self.clients)
        require(self.clients in ("auto", "all", "sampled") or (self.clients.isdigit() and int(self.clients) >= 1),
                 "eval.clients", f"must be auto, all, sampled or a number of clients >= 1, got {self.clients!r}")


def switched_on(value: str) -> bool:
    return value.strip().lower() in ("true", "on", "yes", "1")


def mlflow_uri(value: str) -> str:
    """``log.mlflow`` as a tracking URI: ``true`` -> ``./mlruns``; a path -> its absolute ``file:`` URI (a Tune trial
    or the driver may run in another working directory); a URI as it is."""
    if switched_on(value):
        value = "mlruns"
    if "://" in value or value.startswith("file:"):
        return value
    return Path(value).expanduser().resolve().as_uri()


@dataclass
class LogConfig:
    dir: Optional[str] = None  # the run directory; default runs/<name>-<timestamp>
    tensorboard: bool = True  # write TensorBoard event files into the run directory
    checkpoint_every: int = 1  # checkpoint every N rounds (and always after the last); --resume starts there
    per_client_max: int = 100  # per-client accuracy scalars only up to this many clients (histogram always)
    progress: bool = True  # one console line per round
    # MLflow tracking (extra mlflow): a tracking URI, a folder for MLflow's file store, or true for ./mlruns; null: off
    mlflow: Optional[str] = None
    # Weights & Biases (extra wandb): the project, or true for "raysim"; WANDB_MODE=offline needs no network; null: off
    wandb: Optional[str] = None

    def validate(self) -> None:
        require(self.checkpoint_every >= 1, "log.checkpoint_every", "must be >= 1")
        for key in ("mlflow", "wandb"):  # false / off / empty: no tracking
            value = getattr(self, key)
            if value is not None and str(value).strip().lower() in ("", "false", "off", "no", "0", "none", "null"):
                setattr(self, key, None)
        if self.mlflow is not None:
            self.mlflow = mlflow_uri(str(self.mlflow))  # absolute: trials and drivers may run elsewhere


@dataclass
class ExperimentConfig:
    name: str = "experiment"  # names the default run directory runs/<name>-<time>
    plugins: list[str] = field(default_factory=list)  # modules that register extra algorithms/models/datasets
    seed: int = 0  # seeds the partition, initial weights and every (client, round) job
    rounds: int = 10  # communication rounds
    clients: ClientsConfig = field(default_factory=ClientsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    system: SystemConfig = field(default_factory=SystemConfig)  # clients' speeds, availability, deadline (issue 36)
    # FedAsync / FedBuff on a simulated-time event queue (off: synchronous rounds)
    asynchronous: AsynchronousConfig = field(default_factory=AsynchronousConfig)
    # Byzantine-robust aggregation (mean: the method's own) and the attacks it is measured against (issue 37)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    # differential privacy: DP-FedAvg's clipped deltas and noised sum, its accountant, DP-SGD on clients (issue 37)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def validate(self) -> "ExperimentConfig":
        name = str(self.name)
        require(bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0"), "name",
                f"must be one path component (it names the run directory runs/<name>-<time>), got {name!r}; "
                f"to choose where the run goes, set log.dir")
        require(self.rounds >= 1, "rounds", f"must be >= 1, got {self.rounds}")
        require(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate()
        for section in (self.model, self.data):  # plugin models' and datasets' own sections
            for f in dataclasses.fields(section):
                sub = getattr(section, f.name)
                if dataclasses.is_dataclass(sub) and hasattr(sub, "validate"):
                    sub.validate()
        _check_weighting(self.algorithm)
        check_asynchronous(self, require)
        check_robust(self, require)
        check_privacy(self, require)
        names = self.model.names()
        require(len(names) in (1, self.clients.num), "model.name",
                 f"a list must have one entry per client ({self.clients.num}), got {len(names)}")
        if isinstance(self.model.weights, list):
            require(len(self.model.weights) in (1, self.clients.num), "model.weights",
                     f"a list must have one entry per client ({self.clients.num}), got {len(self.model.weights)}")
        return self


def _check_weighting(algorithm: AlgorithmConfig) -> None:
    """``algorithm.weighting``: samples or uniform, for an algorithm whose mean upload it weights."""
    weighting = getattr(algorithm, "weighting", None)
    if weighting is None:
        return
    require(weighting in ("samples", "uniform"), "algorithm.weighting",
            f"must be samples or uniform (or null: the algorithm's own), got {weighting!r}")
    from raysim.registry import get_algorithm

    cls = get_algorithm(algorithm.name)
    require(cls.declared_uploads().honours_weighting, "algorithm.weighting",
            f"{algorithm.name} aggregates every upload its own way (Algorithm.uploads = Uploads.apart()), so there "
            f"is no mean to weight; drop algorithm.weighting")


def yaml_problem(exc: BaseException, text: Optional[str] = None) -> str:
    """What is wrong with a YAML ``text``, in one line naming the line and column (and the key, for a duplicate)."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        problem, mark = exc.problem, exc.problem_mark
        lines = (text or "").splitlines()
        if "cannot start any token" in problem and mark is not None and mark.line < len(lines) \
                and lines[mark.line][mark.column:mark.column + 1] == "\t":
            return f"a tab at line {mark.line + 1}, column {mark.column + 1}: YAML indents with spaces only"
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{problem}{where}"
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


def _read_yaml(path: Path, depth: int = 0) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = OmegaConf.load(path)
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError and friends: one line naming the file
        raise ConfigError(f"{path}: not valid YAML ({yaml_problem(exc, path.read_text(errors='replace'))})") \
            from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: a config file must be a mapping of keys")
    parent = raw.pop("extends", None)
    if parent is not None:
        require(depth < 8, "extends", "chain is too deep (a cycle?)")
        raw = OmegaConf.merge(_read_yaml((path.parent / str(parent)).resolve(), depth + 1), raw)
    return raw


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"config key '{key}': {text}" if key else f"config: {text}"


def _algorithm_key_hint(exc: OmegaConfBaseException, algorithm: str) -> str:
    """For an ``algorithm.*`` key the chosen algorithm lacks: which algorithms have it (``algorithm.mu=0.1`` with
    fedavg: fedprox and moon do)."""
    from omegaconf.errors import ConfigKeyError

    key = str(getattr(exc, "full_key", None) or "")
    if not isinstance(exc, ConfigKeyError) or not key.startswith("algorithm.") or key.count(".") < 1:
        return ""
    field_name = key.split(".")[1]
    from raysim.registry import algorithm_config, algorithm_names

    owners = [n for n in algorithm_names() if n != algorithm
              and field_name in {f.name for f in dataclasses.fields(algorithm_config(n))}]
    if not owners:
        return ""
    return (f"; {algorithm} has no key {field_name}, but {', '.join(owners)} "
            f"{'does' if len(owners) == 1 else 'do'} (set algorithm.name={owners[0]})")


def algorithm_config_class(name: str) -> type:
    from raysim.registry import algorithm_config

    return algorithm_config(name)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: dict | DictConfig | None = None, validate: bool = True, warn: bool = True) -> ExperimentConfig:
    """Build the validated config from an optional base mapping, a YAML file and dotted ``key=value`` overrides.

    ``warn``: print :mod:`raysim.checks`'s warnings (off for configs that are checked but not run, such as a sweep's
    validation candidates)."""
    layers: list[DictConfig] = []
    if base is not None:
        layers.append(OmegaConf.create(base) if isinstance(base, dict) else base)
    if path is not None:
        from raysim.catalog import resolve

        try:
            path = resolve(path)  # a file, or a shipped experiment by name (raysim list experiments)
        except UserError as exc:
            raise ConfigError(str(exc)) from None
        layers.append(_read_yaml(Path(path)))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like dotted.key=value")
    try:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        peek = OmegaConf.merge(*layers) if layers else OmegaConf.create()
        from raysim.registry import import_plugins

        import_plugins([str(m) for m in (OmegaConf.select(peek, "plugins", default=None) or [])])
        algo_name = OmegaConf.select(peek, "algorithm.name", default=AlgorithmConfig.name)
        algo_cls = algorithm_config_class(str(algo_name))
        model_names = OmegaConf.select(peek, "model.name", default=ModelConfig.name)
        model_names = [str(n) for n in model_names] if OmegaConf.is_list(model_names) else [str(model_names)]
        data_name = str(OmegaConf.select(peek, "data.name", default=DataConfig.name))
        model_cls = _with_sections(ModelConfig, "model", "model", tuple(dict.fromkeys(model_names)))
        data_cls = _with_sections(DataConfig, "data", "dataset", (data_name,))
        merged = OmegaConf.merge(_schema(algo_cls, model_cls, data_cls), *layers)  # merge copies the schema
        cfg: ExperimentConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc) + _algorithm_key_hint(exc, str(algo_name))) from None
    for item in overrides:  # YAML reads yes/on/true as a boolean: an error should echo the user's own word
        key, _, word = item.partition("=")
        if key == "engine.vectorize" and str(cfg.engine.vectorize) in ("True", "true"):
            cfg.engine.vectorize = word
    if not validate:
        return cfg
    cfg.validate()
    if warn:
        from raysim.checks import warn_config

        warn_config(cfg)  # settings that run but mean less than they seem (niid2 = niid1, a curriculum that can't move)
    return cfg


@functools.lru_cache(maxsize=64)
def _schema(algo_cls: type, model_cls: type, data_cls: type) -> DictConfig:
    """The structured schema of a config with these sections, built once: OmegaConf.structured walks every
    dataclass (~70 ms here), and ``OmegaConf.merge`` never changes its first argument."""
    return OmegaConf.structured(ExperimentConfig(algorithm=algo_cls(), model=model_cls(), data=data_cls()))


def _with_sections(base: type, key: str, kind: str, names: tuple[str, ...]) -> type:
    """``base`` plus one sub-section per named plugin model/dataset whose factory declares a ``Config`` dataclass:
    ``model.<name>.*`` / ``data.<name>.*``. Built-ins keep their keys in the section itself."""
    from raysim.registry import component_config

    sections = {n: c for n in names if (c := component_config(kind, n)) is not None}
    return _section_class(base, key, tuple(sections.items())) if sections else base


@functools.lru_cache(maxsize=None)
def _section_class(base: type, key: str, sections: tuple[tuple[str, type], ...]) -> type:
    taken = {f.name for f in dataclasses.fields(base)}
    for name, _ in sections:
        require(name not in taken and name.isidentifier(), f"{key}.name",
                 f"{name!r} cannot have a config section (it clashes with the key {key}.{name})")
    cls = dataclasses.make_dataclass(f"{base.__name__}_{'_'.join(n for n, _ in sections)}",
                                     [(n, c, field(default_factory=c)) for n, c in sections], bases=(base,))
    cls.__module__ = base.__module__
    return cls


def to_yaml(cfg: ExperimentConfig) -> str:
    """The config as OmegaConf writes it (``OmegaConf.to_yaml(OmegaConf.structured(cfg))``, byte for byte), without
    building the structured config (~0.1 s a run directory) where every value is a plain one."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    try:
        container = _plain(cfg)
    except TypeError:  # a plugin's value of another type: OmegaConf's own conversion
        return OmegaConf.to_yaml(OmegaConf.structured(cfg))
    return yaml.dump(container, default_flow_style=False, allow_unicode=True, sort_keys=False,
                     Dumper=get_omega_conf_dumper())


def _plain(value: Any) -> Any:
    """Dataclasses, dicts and sequences as the dicts and lists ``OmegaConf.to_container`` gives, enums by name."""
    import enum

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(type(value).__name__)


def to_flat_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Dotted-key view of the config (for comparing runs and for TensorBoard's HParams)."""
    return flatten_dict(cfg)
