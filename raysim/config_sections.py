"""The experiment config's schema: one dataclass per section (``clients``, ``data``, ``model``, ``train``,
``algorithm``, ``engine``, ``eval``, ``log``) and :class:`ExperimentConfig`, which holds them with the subsystems'
sections (``system``, ``asynchronous``, ``aggregator``, ``attack``, ``privacy``, ``compression``, ``secagg``).
Each section's ``validate`` checks its own keys with ``raysim.validate.require``; ``ExperimentConfig.validate``
checks the keys that depend on one another.
Import these names from ``raysim.config``; loading and merging YAML is ``raysim.config_loading``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from raysim.sections.asynchronous import AsynchronousConfig, check_asynchronous
from raysim.sections.compression import CompressionConfig, check_compression
from raysim.sections.privacy import PrivacyConfig, check_privacy
from raysim.sections.robust import AggregatorConfig, AttackConfig, check_robust
from raysim.sections.secagg import SecAggConfig, check_secagg
from raysim.sections.system import SystemConfig, check_system
from raysim.validate import FLOAT32_MAX, is_finite, one_of as _one_of, path_too_long, require

PARTITIONS = ("iid", "dirichlet", "pathological", "shard", "natural", "linear", "square", "exponential",
              "inner_dirichlet", "niid1", "niid2", "legacy_iid", "legacy_dirichlet")



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
        # the optimiser scales float32 tensors by lr (Adam by lr / (1 - beta1) = 10 lr at its first step) and by
        # weight_decay: a factor beyond float32's range is refused by torch with a traceback
        most = FLOAT32_MAX * (0.1 if self.optimizer == "adam" else 1.0)
        require(is_finite(self.lr, 0, strict=True) and self.lr <= most, "train.lr",
                f"must be a finite number > 0, at most {most:.4g} (float32's largest"
                f"{' over 10: adam divides lr by 1 - beta1 = 0.1' if self.optimizer == 'adam' else ''}), got {self.lr}")
        require(self.local_epochs >= 1, "train.local_epochs", f"must be >= 1, got {self.local_epochs}")
        require(self.batch_size >= 1, "train.batch_size", f"must be >= 1, got {self.batch_size}")
        _one_of(self.optimizer, "train.optimizer", ("sgd", "adam"))
        require(0.0 <= self.momentum < 1.0, "train.momentum", "must be in [0, 1)")
        require(is_finite(self.weight_decay, 0) and self.weight_decay <= FLOAT32_MAX, "train.weight_decay",
                f"must be a finite number >= 0, at most {FLOAT32_MAX:.4g} (float32's largest), got {self.weight_decay}")


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

    def refusal(self, feature: str) -> Optional[str]:
        """Why these settings cannot serve ``feature`` (``stack``, ``async``, ``privacy``, ``robust``; None: they
        can), beside what the algorithm's declarations allow (``Algorithm.refusal``): Ditto's ``select_lam`` cannot be
        stacked. Here, on the Config, so that the checks read it without importing the algorithm."""
        return None

    def config_warnings(self, cfg: "ExperimentConfig") -> list[str]:
        """Settings of these keys that run but mean less than they seem (what ``Algorithm.config_warnings`` returns
        by default): here, so that loading a config warns without importing the algorithm (and torch)."""
        return []

    def privacy_refusal(self, cfg: "ExperimentConfig", data: Any = None) -> Optional[tuple[str, str]]:
        """(config key, why) where these settings make a server step read the clients' data outside the privacy
        mechanism (``privacy.*``: refused in one line), else None. Asked when the config loads (``data`` None) and
        again before round 1 with the prepared data (whether the dataset has an official test split)."""
        return None

    def nonprivate_metrics(self, cfg: "ExperimentConfig") -> tuple[str, ...]:
        """The keys of the algorithm's own round metrics (``on_round_end``) that are computed from the clients' raw
        data: with ``privacy.*`` on they are logged under ``nonprivate/``."""
        return ()


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
    # for algorithms that declare vectorisable client hooks; stacks are fixed groups of each round's clients in id
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
                "must be off, auto or a whole number >= 1 (clients per stack), got "
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
    # whose test split is evaluated: all | sampled (the round's clients) | N (a fixed set of N clients drawn
    # from the seed) | auto (all up to 10,000 clients, else a fixed 1,000)
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
        if self.dir is not None:
            too_long = path_too_long(str(self.dir))
            require(not too_long, "log.dir", f"cannot be a directory: {too_long}")
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
    # what travels: compressed uploads (error feedback) and downloads, and secure aggregation (issue 53)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    secagg: SecAggConfig = field(default_factory=SecAggConfig)

    def validate(self) -> "ExperimentConfig":
        name = str(self.name)
        require(bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0"), "name",
                f"must be one path component (it names the run directory runs/<name>-<time>), got {name!r}; "
                f"to choose where the run goes, set log.dir")
        too_long = path_too_long(name, suffix=len("-20261231-235959"))
        require(not too_long, "name", f"names the run directory runs/<name>-<time>, which cannot be {too_long}")
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
        check_system(self, require)
        check_robust(self, require)
        check_privacy(self, require)
        check_compression(self, require)
        check_secagg(self, require)
        if self.privacy.dpsgd:
            _check_dpsgd_models(self.model)
        names = self.model.names()
        require(len(names) in (1, self.clients.num), "model.name",
                 f"a list must have one entry per client ({self.clients.num}), got {len(names)}")
        if isinstance(self.model.weights, list):
            require(len(self.model.weights) in (1, self.clients.num), "model.weights",
                     f"a list must have one entry per client ({self.clients.num}), got {len(self.model.weights)}")
        return self


def _check_dpsgd_models(model: ModelConfig) -> None:
    """DP-SGD clips each sample's own gradient; a batch norm layer mixes the samples of a batch (and updates its
    running statistics in place, which torch.func's per-sample gradients refuse), so a model whose factory declares
    ``batch_norm = True`` is refused (Opacus refuses batch norm too, and swaps it for group norm)."""
    from raysim.registry import get_model

    for name in dict.fromkeys(model.names()):
        require(not getattr(get_model(name), "batch_norm", False), "privacy.dpsgd",
                f"DP-SGD needs each sample's own gradient, and model.name={name} has batch norm layers, which mix "
                f"the samples of a batch; with privacy.dpsgd use a model without them (mlp, cnn)")


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
