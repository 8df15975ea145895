"""The ``system`` config section: client speeds, bandwidths, latency, availability, dropout, the round deadline and
the server's report timeout and minimum of reports.

Off by default (``system.enabled: false``): then no key here changes any number a run computes. Every mistake is a
:class:`raysim.validate.ConfigError` whose one-line message names the key. Files (``system.csv``,
``system.availability.trace``) are checked when the run builds its :class:`raysim.system.model.SystemModel`, before
its first round, with the same one-line errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from raysim.validate import ConfigError, is_finite as _finite, require as _require

TRAIT_SOURCES = ("lognormal", "tiers", "csv", "fedscale")
SPEED_UNITS = ("samples", "flops")
AVAILABILITY_MODES = ("always", "onoff", "diurnal", "trace")
LATE_POLICIES = ("drop", "partial")


SystemConfigError = ConfigError  # the name this section's errors had before raysim.validate held the convention


def _positive(value: Any) -> bool:
    return _finite(value, 0.0, strict=True)


@dataclass
class TraitConfig:
    """One client trait drawn from a lognormal distribution: ``median``, and ``spread`` = the ratio of its 90th to
    its 10th percentile (1: every client gets the median; 10: the fastest tenth is 10x the slowest tenth)."""

    median: float = 1.0  # the trait's median over clients (units: see system.speed, down, up, latency)
    spread: float = 1.0  # 90th / 10th percentile ratio of the trait over clients (1: every client the median)

    def check(self, key: str, *, zero_ok: bool = False) -> None:
        ok = _finite(self.median, 0.0) if zero_ok else _positive(self.median)
        _require(ok, f"{key}.median", f"must be a finite number {'>=' if zero_ok else '>'} 0, got {self.median!r}")
        _require(_finite(self.spread, 1.0), f"{key}.spread",
                 f"must be a finite ratio >= 1 (90th over 10th percentile), got {self.spread!r}")


@dataclass
class TierConfig:
    """A device tier: its share of the clients and its traits (units as in :class:`SystemConfig`)."""

    share: float = 1.0  # the tier's share of the clients (shares are normalised to sum 1)
    speed: float = 100.0  # samples trained per second
    down: float = 1.25e6  # download bandwidth, bytes per second
    up: float = 6.25e5  # upload bandwidth, bytes per second
    latency: float = 0.05  # seconds per job before any byte moves


@dataclass
class AvailabilityConfig:
    # always | onoff (a seeded two-state process with exponential on and off durations) | diurnal (each client on
    # for on_share of every period_s, at a phase drawn from the seed) | trace (intervals read from a file)
    mode: str = "always"
    mean_on_s: float = 3600.0  # onoff: mean length of an available stretch, seconds
    mean_off_s: float = 3600.0  # onoff: mean length of an unavailable stretch, seconds
    period_s: float = 86400.0  # diurnal: the day; trace (CSV): the trace repeats every period_s
    on_share: float = 0.5  # diurnal: share of each period a client is available
    # trace: a CSV of client_id,start_s,end_s rows (a client is available in [start_s, end_s]), or FedScale's
    # client-behaviour trace (.pkl or .json: {client_id: {active: [...], inactive: [...], finish_time: T}})
    trace: Optional[str] = None
    # a client must stay available for its whole job (download, compute, upload) to report: one whose availability
    # ends first leaves mid-job and never reports (FedScale's traces); false: availability is checked when a job
    # starts, and a started client always reports (the optimistic model of raysim before issue 55)
    whole_job: bool = False

    def validate(self) -> None:
        key = "system.availability"
        _require(self.mode in AVAILABILITY_MODES, f"{key}.mode",
                 f"must be one of {', '.join(AVAILABILITY_MODES)}, got {self.mode!r}")
        for name in ("mean_on_s", "mean_off_s", "period_s"):
            _require(_positive(getattr(self, name)), f"{key}.{name}",
                     f"must be a finite number of seconds > 0, got {getattr(self, name)!r}")
        _require(_positive(self.on_share) and self.on_share <= 1, f"{key}.on_share",
                 f"must be in (0, 1], got {self.on_share!r}")
        _require(self.mode != "trace" or bool(self.trace), f"{key}.trace",
                 "availability.mode=trace needs a trace file (system.availability.trace=PATH)")


@dataclass
class SystemConfig:
    enabled: bool = False  # simulate the clients' systems side and a simulated clock (off: nothing here counts)
    # where speed, bandwidths and latency come from: lognormal | tiers | csv | fedscale (FedScale's device trace)
    traits: str = "lognormal"
    # the unit of every speed (system.speed, tiers' and the CSV's): samples (trained per second) | flops (FLOP/s: a
    # job's compute is samples x epochs x the model's training FLOPs per sample, measured once before round 1)
    speed_unit: str = "samples"
    speed: TraitConfig = field(default_factory=lambda: TraitConfig(100.0, 1.0))  # per second, in system.speed_unit
    down: TraitConfig = field(default_factory=lambda: TraitConfig(1.25e6, 1.0))  # download, bytes per second
    up: TraitConfig = field(default_factory=lambda: TraitConfig(6.25e5, 1.0))  # upload, bytes per second
    latency: TraitConfig = field(default_factory=lambda: TraitConfig(0.05, 1.0))  # seconds per job
    tiers: list[TierConfig] = field(default_factory=list)  # traits=tiers: device tiers with their shares
    csv: Optional[str] = None  # traits=csv: a CSV with the header client_id,speed,down,up,latency, every client once
    # traits=fedscale: FedScale's client_device_capacity file (.pkl or .json: {client_id: {computation: ms per sample
    # of inference, communication: kbit/s}}), naming every client of the federation
    capacity: Optional[str] = None
    availability: AvailabilityConfig = field(default_factory=AvailabilityConfig)
    dropout: float = 0.0  # probability that a client which started a round never reports, per (client, round)
    deadline_s: Optional[float] = None  # the round's deadline in simulated seconds (null: wait for every client)
    over_selection: float = 0.0  # rho: a round with a deadline starts ceil(K (1 + rho)) clients, keeps the first K
    late: str = "drop"  # a client that misses the deadline: drop | partial (the local steps that fit)
    wait_s: float = 60.0  # when no client is available, the server waits this long before it samples again
    # without a deadline, how long the server waits for a round's reports (null: it knows at once who will never
    # report, an oracle); a client that has not reported by then is cut off. Asynchronous: a job's slot is freed at
    # this long after its start when it has not reported
    report_timeout_s: Optional[float] = None
    # a synchronous round with fewer reports is abandoned: the model stays, the time is lost (Bonawitz et al. 2019):
    # a whole number of clients, or a share in (0, 1] of the round's target K (null: every round aggregates)
    min_reports: Any = None

    def validate(self) -> None:
        _require(self.traits in TRAIT_SOURCES, "system.traits",
                 f"must be one of {', '.join(TRAIT_SOURCES)}, got {self.traits!r}")
        _require(self.speed_unit in SPEED_UNITS, "system.speed_unit",
                 f"must be one of {', '.join(SPEED_UNITS)}, got {self.speed_unit!r}")
        if self.speed_unit == "flops":  # the same check as samples/s, named in the unit the user chose
            _require(_positive(self.speed.median), "system.speed.median",
                     f"must be a finite number of FLOP/s > 0, got {self.speed.median!r}")
        for name in ("speed", "down", "up"):
            getattr(self, name).check(f"system.{name}")
        self.latency.check("system.latency", zero_ok=True)
        if self.traits == "tiers":
            _require(len(self.tiers) >= 1, "system.tiers", "traits=tiers needs at least one tier")
            for i, tier in enumerate(self.tiers):
                key = f"system.tiers[{i}]"
                _require(_positive(tier.share), f"{key}.share", f"must be > 0, got {tier.share!r}")
                for name in ("speed", "down", "up"):
                    _require(_positive(getattr(tier, name)), f"{key}.{name}",
                             f"must be a finite number > 0, got {getattr(tier, name)!r}")
                _require(_finite(tier.latency, 0.0), f"{key}.latency", f"must be >= 0, got {tier.latency!r}")
        _require(self.traits != "csv" or bool(self.csv), "system.csv",
                 "traits=csv needs a CSV file (system.csv=PATH, header client_id,speed,down,up,latency)")
        _require(self.traits != "fedscale" or bool(self.capacity), "system.capacity",
                 "traits=fedscale needs FedScale's device capacity file (system.capacity=PATH, .pkl or .json)")
        _require(self.traits != "fedscale" or self.speed_unit == "samples", "system.speed_unit",
                 "FedScale's capacity trace gives each client's milliseconds per sample, not FLOP/s: use "
                 "speed_unit=samples with traits=fedscale")
        self.availability.validate()
        _require(_finite(self.dropout, 0.0) and self.dropout < 1, "system.dropout",
                 f"must be a probability in [0, 1), got {self.dropout!r}")
        if self.deadline_s is not None:
            _require(_positive(self.deadline_s), "system.deadline_s",
                     f"must be a number of seconds > 0 (or null), got {self.deadline_s!r}")
        _require(_finite(self.over_selection, 0.0), "system.over_selection",
                 f"must be a finite number >= 0, got {self.over_selection!r}")
        _require(self.over_selection == 0 or self.deadline_s is not None, "system.over_selection",
                 "over-selection keeps the first K clients to report before system.deadline_s: set a deadline")
        _require(self.late in LATE_POLICIES, "system.late",
                 f"must be one of {', '.join(LATE_POLICIES)}, got {self.late!r}")
        _require(_positive(self.wait_s), "system.wait_s", f"must be a number of seconds > 0, got {self.wait_s!r}")
        if self.report_timeout_s is not None:
            _require(_positive(self.report_timeout_s), "system.report_timeout_s",
                     f"must be a number of seconds > 0 (or null), got {self.report_timeout_s!r}")
            _require(self.deadline_s is None, "system.report_timeout_s",
                     "a round with system.deadline_s stops waiting at its deadline: set one of the two")
        if self.min_reports is not None:
            m = self.min_reports
            _require(not isinstance(m, bool) and (isinstance(m, int) and m >= 1 or isinstance(m, float)
                                                   and 0 < m <= 1), "system.min_reports",
                     f"must be a whole number of clients >= 1 or a share in (0, 1] of the round's target, got {m!r}")


def check_system(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """The ``system`` keys against the rest of the config; ``require(ok, key, why)`` refuses."""
    system = cfg.system
    if not system.enabled:
        return
    if system.min_reports is not None:
        target = cfg.clients.per_round
        require(cfg.asynchronous.mode in ("off", False, "false", "False"), "system.min_reports",
                f"a minimum of reports abandons a synchronous round; asynchronous.mode={cfg.asynchronous.mode} has "
                f"no rounds to abandon (drop system.min_reports)")
        require(min_reports(system.min_reports, target) <= target, "system.min_reports",
                f"{system.min_reports} is above the round's cohort of {target} clients (clients.fraction x "
                f"clients.num): no round could aggregate")


def min_reports(value: Any, target: int) -> int:
    """The reports a round needs: ``value`` clients, or ceil(``value`` x ``target``) for a share."""
    if isinstance(value, float):
        return max(1, int(math.ceil(value * target - 1e-9)))
    return int(value)


def selected_count(cohort: int, over_selection: float) -> int:
    """How many clients a round with over-selection rho starts: ceil(K (1 + rho)) (Bonawitz et al. 2019)."""
    return int(math.ceil(cohort * (1.0 + over_selection) - 1e-9))
