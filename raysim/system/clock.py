"""Synchronous rounds in simulated time (``system.enabled``): who starts a round, who reports, and when it ends.

A round starts at the simulated time the last one ended. Its clients are drawn among those available then
(:meth:`raysim.system.model.SystemModel.sample_available`; with ``availability.mode=always`` exactly as without a
system model). A client that drops out (``system.dropout``) never reports and is not trained. Each trained client's
job takes :func:`raysim.system.model.job_duration` of its real bytes down and up and the samples its local steps
took. Then:

- no deadline: the round waits for every client that did not drop out; it lasts as long as its slowest one;
- ``system.deadline_s``: the round starts ceil(K (1 + rho)) clients (``system.over_selection``) and keeps the first
  K to report by the deadline, as in Bonawitz et al., "Towards federated learning at scale: system design" (SysML
  2019), section 2.2; it ends when the K-th report arrives, else at the deadline. A client that would report late is
  dropped (``system.late=drop``) or does partial work (``partial``): the local steps that fit before the deadline,
  as FedProx's stragglers do (Li et al., MLSys 2020); a client that fits no step is dropped.

Which clients report, and the partial clients' step budgets, follow from the durations alone (a partial job's
steps are the one loop's batches, :func:`raysim.algorithms.training.batch_bounds`, epoch after epoch), so the round
trains each kept partial client once more with its budget and discards every other late result. A client whose
result is discarded keeps no state from the round (the server cut it off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from raysim.algorithms.training import batch_bounds
from raysim.config import ConfigError
from raysim.system.config import selected_count
from raysim.system.model import ClientTraits, SystemModel, job_duration

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


# fewer available clients than this, expected at any moment, and a run is refused: in the 100,000 waits of
# system.wait_s that an asynchronous job slot makes before it gives up (raysim.engine.asynchronous.MAX_WAITS), less
# than one client would be expected to come by, and a synchronous round would find none round after round
MIN_EXPECTED_AVAILABLE = 1e-5


def check_availability(model: SystemModel) -> None:
    """Refuse, before round 1, an availability under which no client can be expected ever to be available: a trace
    that makes none available (intervals of no length, or outside the period), or clients.num x the share of time
    a client is available (``SystemModel.available_share``) below ``MIN_EXPECTED_AVAILABLE``. Without this an
    asynchronous run waits ``system.wait_s`` after ``system.wait_s`` for minutes, and a synchronous one runs
    round after round with no client and a NaN loss."""
    system = model.cfg
    mode = system.availability.mode
    if mode == "always":
        return
    share = model.available_share()
    key = {"diurnal": "on_share", "onoff": "mean_on_s", "trace": "trace"}[mode]
    if share <= 0.0:
        raise ConfigError(f"config key 'system.availability.trace': {system.availability.trace} makes no client "
                          f"available: every interval of a client of this federation has no length or lies outside "
                          f"its period, so no round could ever train")
    expected = model.num_clients * share
    if expected < MIN_EXPECTED_AVAILABLE:
        raise ConfigError(f"config key 'system.availability.{key}': no client can be expected to be available: "
                          f"{model.num_clients} clients x {share:.3g} of the time each = {expected:.3g} clients at "
                          f"any moment, so the run would wait system.wait_s={float(system.wait_s):g} s after "
                          f"system.wait_s for ever; make clients available a larger share of the time")


MAX_SIM_S = float(2 ** 62)  # simulated seconds a run may reach: TensorBoard's sim_time steps are whole seconds, int64


def check_clock_limits(model: SystemModel, cfg: Any, samples: Callable[[int], int], bytes_each_way: int) -> None:
    """:func:`check_job_times` for whole jobs: ``samples(c)`` training samples x ``train.local_epochs``."""
    sizes = np.array([samples(c) for c in range(cfg.clients.num)], dtype=np.float64)
    check_job_times(model, cfg, sizes * cfg.train.local_epochs, bytes_each_way)


def check_job_times(model: SystemModel, cfg: Any, work: np.ndarray, bytes_each_way: int) -> None:
    """Refuse, before round 1, client traits under which ``rounds`` of the slowest client's job (``work[c]``
    samples x epochs for client c) would pass ``MAX_SIM_S`` simulated seconds, or are not a finite time: the clock,
    the metrics' ``sim_time_s`` and TensorBoard's ``sim_time/*`` steps could not count them. The line names the
    trait whose term dominates that client's job."""
    worst, who = model.fastest(work, bytes_each_way, bytes_each_way, slowest=True)
    limit = MAX_SIM_S / max(1, int(cfg.rounds))
    if math.isfinite(worst) and worst <= limit:
        return
    t = model.traits(who)
    terms = {"latency": t.latency, "down": bytes_each_way / t.down, "speed": work[who] / t.speed,
             "up": bytes_each_way / t.up}
    trait = max(terms, key=lambda k: terms[k] if math.isfinite(terms[k]) else math.inf)
    key = {"lognormal": f"system.{trait}", "tiers": "system.tiers", "csv": "system.csv"}[cfg.system.traits]
    rounds = f"{cfg.rounds} round{'s' if cfg.rounds != 1 else ''}"
    raise ConfigError(f"config key '{key}': client {who}'s job would take {worst:.3g} simulated seconds ({trait}: "
                      f"{terms[trait]:.3g} s of it), and {rounds} of it more than the clock counts "
                      f"({MAX_SIM_S:.3g} s in all: TensorBoard's steps are whole seconds in 64 bits); give the "
                      f"clients traits that make a job take seconds to days")


def samples_in_budget(num_samples: int, batch_size: int, epochs: int, budget: int) -> int:
    """The samples of the longest run of whole local steps (``batch_bounds`` batches, ``epochs`` times) whose
    samples add up to at most ``budget``."""
    sizes = [e - b for b, e in batch_bounds(num_samples, batch_size)]
    per_epoch = sum(sizes)
    if per_epoch == 0 or budget <= 0:
        return 0
    full = min(epochs, budget // per_epoch)
    taken = full * per_epoch
    if full < epochs:
        for size in sizes:
            if taken + size > budget:
                break
            taken += size
    return int(taken)


@dataclass
class Settlement:
    """Who of a round's trained clients reports, and how long the round took."""

    round_s: float  # simulated seconds from the round's start to its end
    reporters: list[int]  # in client-id order
    budgets: dict[int, int] = field(default_factory=dict)  # partial clients: samples their steps may take
    late: list[int] = field(default_factory=list)  # missed the deadline and report nothing
    surplus: list[int] = field(default_factory=list)  # reported in time, after the first K


def settle(full_s: dict[int, float], partial_s: dict[int, tuple[float, int]], target: int,
           deadline_s: Optional[float], idle_s: float) -> Settlement:
    """The round's outcome from each trained client's full job time (``full_s``) and, for a late client that can do
    partial work, (its partial job's time, its sample budget) (``partial_s``); ``target`` is K. Ties go to the
    lower client id; a round in which nobody reports lasts ``idle_s``."""
    if deadline_s is None:
        return Settlement(round_s=max(full_s.values(), default=idle_s), reporters=sorted(full_s))
    in_time = [(s, c, None) for c, s in full_s.items() if s <= deadline_s]
    in_time += [(s, c, budget) for c, (s, budget) in partial_s.items() if s <= deadline_s]
    in_time.sort(key=lambda entry: (entry[0], entry[1]))
    kept = in_time[:target]
    round_s = kept[-1][0] if kept and len(kept) == target else (deadline_s if kept else idle_s)
    can_report = {c for _, c, _ in in_time}
    return Settlement(round_s=float(round_s), reporters=sorted(c for _, c, _ in kept),
                      budgets={c: b for _, c, b in kept if b is not None},
                      late=sorted(c for c in full_s if c not in can_report),
                      surplus=sorted(c for _, c, _ in in_time[target:]))


class RoundClock:
    """The simulated clock of the synchronous round loop: one per run, in the driver."""

    def __init__(self, cfg: ExperimentConfig, target: int):
        """``target``: K, the clients a round of this run samples without a system model."""
        self.cfg, self.system = cfg, cfg.system
        self.model = SystemModel(cfg.system, cfg.seed, cfg.clients.num)
        check_availability(self.model)  # before round 1: a run no client can join never starts
        self.target = target
        over = self.system.over_selection if self.system.deadline_s is not None else 0.0
        self.starts = min(cfg.clients.num, selected_count(self.target, over))

    def sample(self, rnd: int, now_s: float, draw: Callable[[int, int, int, int], list[int]]) -> tuple[list[int],
                                                                                                      list[int]]:
        """(the clients that train this round, those that started and dropped out), sorted. ``draw(seed, round,
        num, count)`` is the driver's own sampling, used as it is while every client is always available."""
        num = self.cfg.clients.num
        if self.system.availability.mode == "always":
            started = draw(self.cfg.seed, rnd, num, self.starts)
        else:
            started = self.model.sample_available(rnd, now_s, self.starts)
        dropped = [c for c in started if self.model.dropped(c, rnd)]
        gone = set(dropped)
        return [c for c in started if c not in gone], dropped

    def settle(self, results: dict[int, Any], samples: dict[int, int], bytes_down: dict[int, int],
               started: int) -> Settlement:
        """The round's outcome for its trained clients' ``results`` (client -> TrainResult) and the ``samples``
        each one's steps took, of ``started`` clients (dropouts included): a round that started clients of which
        none reports waits for its deadline; one that started none waits ``system.wait_s`` before the next samples
        again."""
        deadline = self.system.deadline_s
        full_s, partial_s = {}, {}
        ids = list(results)
        table = self.model.traits_many(np.array(ids, dtype=np.int64)) if ids else ()  # all the traits at once
        for cid, row in zip(ids, table):
            r, traits = results[cid], ClientTraits(*(float(v) for v in row))
            full_s[cid] = job_duration(traits, bytes_down[cid], r.upload_bytes, samples[cid])
            if deadline is not None and full_s[cid] > deadline and self.system.late == "partial" and r.num_samples:
                epochs = max(1, round(samples[cid] / r.num_samples))
                fit = self.model.samples_within(cid, bytes_down[cid], r.upload_bytes, deadline)
                budget = samples_in_budget(r.num_samples, self.cfg.train.batch_size, epochs, fit)
                if budget > 0:
                    partial_s[cid] = (job_duration(traits, bytes_down[cid], r.upload_bytes, budget), budget)
        idle = deadline if deadline is not None and started else self.system.wait_s
        return settle(full_s, partial_s, self.target, deadline, idle)

    def check_deadline(self, samples: Callable[[int], int], bytes_each_way: int) -> None:
        """Refuse, before round 1, a deadline that no client can meet: one line naming the fastest possible client
        time (a whole job; with ``late=partial``, one local step), with the model's bytes each way. And refuse
        traits under which the slowest client's job would outlast what the clock can count (see
        :func:`check_job_times`)."""
        check_clock_limits(self.model, self.cfg, samples, bytes_each_way)
        num, epochs, batch = self.cfg.clients.num, self.cfg.train.local_epochs, self.cfg.train.batch_size
        sizes = np.array([samples(c) for c in range(num)], dtype=np.float64)
        deadline = self.system.deadline_s
        if deadline is None:
            return
        work = np.minimum(sizes, batch) if self.system.late == "partial" else sizes * epochs
        best, who = self.model.fastest(work, bytes_each_way, bytes_each_way)
        if best > deadline:
            what = "one local step" if self.system.late == "partial" else "a round's job"
            raise ConfigError(f"config key 'system.deadline_s': no client can meet a {deadline:g} s deadline: the "
                              f"fastest possible client time for {what} is {best:.4g} s (client {who}, "
                              f"{bytes_each_way} bytes each way); raise system.deadline_s to at least "
                              f"{math.ceil(best * 1000) / 1000:g}")
