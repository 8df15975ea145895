"""Synchronous rounds in simulated time (``system.enabled``): who starts a round, who reports, and when it ends.

A round starts at the simulated time the last one ended. Its clients are drawn among those available then
(:meth:`raysim.system.model.SystemModel.sample_available`; with ``availability.mode=always`` exactly as without a
system model). A client that drops out (``system.dropout``) never reports and is not trained. Each trained client's
job takes :func:`raysim.system.model.job_duration` of its real bytes down and up and the samples its local steps
took. Then:

- no deadline: the round waits for every client that did not drop out; it lasts as long as its slowest one (an
  oracle: the server knows at once who will never report);
- ``system.report_timeout_s``, no deadline: the server waits for every client it started until the timeout, as a
  deployed server must (it cannot know who dropped out): the round ends at its last report when every started
  client reports in time, else at the timeout; a client that would report after it is cut off (``late``);
- ``system.deadline_s``: the round starts ceil(K (1 + rho)) clients (``system.over_selection``) and keeps the first
  K to report by the deadline, as in Bonawitz et al., "Towards federated learning at scale: system design" (SysML
  2019), section 2.2; it ends when the K-th report arrives, else at the deadline. A client that would report late is
  dropped (``system.late=drop``) or does partial work (``partial``): the local steps that fit before the deadline,
  as FedProx's stragglers do (Li et al., MLSys 2020); a client that fits no step is dropped.

With ``system.availability.whole_job``, a client that would report in time but whose availability ends before its
report (:func:`raysim.system.presence.stays_available`) leaves mid-job and never reports: it counts with the
dropouts. With ``system.min_reports``, a round with fewer reports is abandoned (Bonawitz et al. 2019, section 2.2: a
round that does not get enough reports before its timeout is abandoned): it takes its time and changes no model.

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
from raysim.sections.system import min_reports, selected_count
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
                          f"any moment, so the run would wait (system.wait_s={float(system.wait_s):g} s at a time) "
                          f"for ever; make clients available a larger share of the time")


MAX_SIM_S = float(2 ** 62)  # simulated seconds a run may reach: TensorBoard's sim_time steps are whole seconds, int64


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
    terms = {"latency": t.latency, "down": bytes_each_way / t.down,
             "speed": float(model.work(who, work[who])) / t.speed, "up": bytes_each_way / t.up}
    trait = max(terms, key=lambda k: terms[k] if math.isfinite(terms[k]) else math.inf)
    key = {"lognormal": f"system.{trait}", "tiers": "system.tiers", "csv": "system.csv",
           "fedscale": "system.capacity"}[cfg.system.traits]
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
    late: list[int] = field(default_factory=list)  # missed the deadline (or the report timeout) and report nothing
    surplus: list[int] = field(default_factory=list)  # reported in time, after the first K
    left: list[int] = field(default_factory=list)  # left mid-job (availability.whole_job) and report nothing
    abandoned: bool = False  # fewer reports than system.min_reports: the round changes no model


def settle(full_s: dict[int, float], partial_s: dict[int, tuple[float, int]], target: int,
           deadline_s: Optional[float], idle_s: float, *, timeout_s: Optional[float] = None, missing: int = 0,
           needed: Optional[int] = None) -> Settlement:
    """The round's outcome from each trained client's full job time (``full_s``) and, for a late client that can do
    partial work, (its partial job's time, its sample budget) (``partial_s``); ``target`` is K. Ties go to the
    lower client id; a round in which nobody reports lasts ``idle_s``. ``timeout_s`` (no deadline): the server waits
    that long unless every client it started reports, ``missing`` being the started clients that never will (dropped
    out, left); ``needed``: the reports below which the round is abandoned."""
    out = _settle(full_s, partial_s, target, deadline_s, idle_s, timeout_s, missing)
    out.abandoned = needed is not None and len(out.reporters) < needed
    return out


def _settle(full_s: dict[int, float], partial_s: dict[int, tuple[float, int]], target: int,
            deadline_s: Optional[float], idle_s: float, timeout_s: Optional[float], missing: int) -> Settlement:
    if deadline_s is None and timeout_s is None:
        return Settlement(round_s=max(full_s.values(), default=idle_s), reporters=sorted(full_s))
    if deadline_s is None:
        assert timeout_s is not None
        late = sorted(c for c, s in full_s.items() if s > timeout_s)
        if not full_s and not missing:
            round_s = idle_s  # nobody started
        elif missing or late:
            round_s = timeout_s  # the server cannot tell a slow client from one that will never report
        else:
            round_s = max(full_s.values())
        return Settlement(round_s=float(round_s), reporters=sorted(c for c in full_s if c not in set(late)),
                          late=late)
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
               started: int, now_s: float = 0.0, dropped: int = 0) -> Settlement:
        """The round's outcome for its trained clients' ``results`` (client -> TrainResult) and the ``samples``
        each one's steps took, of ``started`` clients (dropouts included, ``dropped`` of them), the round starting
        at ``now_s``: a round that started clients of which none reports waits for its deadline; one that started
        none waits ``system.wait_s`` before the next samples again."""
        deadline, timeout = self.system.deadline_s, self.system.report_timeout_s
        full_s, partial_s = {}, {}
        ids = list(results)
        table = self.model.traits_many(np.array(ids, dtype=np.int64)) if ids else ()  # all the traits at once
        for cid, row in zip(ids, table):
            r, traits = results[cid], ClientTraits(*(float(v) for v in row))
            work = float(self.model.work(cid, samples[cid]))  # samples x epochs (x FLOPs per sample)
            full_s[cid] = job_duration(traits, bytes_down[cid], r.upload_bytes, work)
            if deadline is not None and full_s[cid] > deadline and self.system.late == "partial" and r.num_samples:
                epochs = max(1, round(samples[cid] / r.num_samples))
                fit = self.model.samples_within(cid, bytes_down[cid], r.upload_bytes, deadline)
                budget = samples_in_budget(r.num_samples, self.cfg.train.batch_size, epochs, fit)
                if budget > 0:
                    partial_s[cid] = (job_duration(traits, bytes_down[cid], r.upload_bytes,
                                                   float(self.model.work(cid, budget))), budget)
        left = self._left(full_s, partial_s, now_s) if self.system.availability.whole_job else []
        idle = deadline if deadline is not None and started else self.system.wait_s
        needed = min_reports(self.system.min_reports, self.target) if self.system.min_reports is not None else None
        out = settle(full_s, partial_s, self.target, deadline, idle, timeout_s=timeout, missing=dropped + len(left),
                     needed=needed)
        out.left = left
        return out

    def _left(self, full_s: dict[int, float], partial_s: dict[int, tuple[float, int]], now_s: float) -> list[int]:
        """The clients that would report in time but leave before their report (removed from ``full_s`` and
        ``partial_s``); a client late anyway stays late."""
        from raysim.system.presence import stays_available

        limit = self.system.deadline_s if self.system.deadline_s is not None else self.system.report_timeout_s
        report_at = {}
        for cid, s in full_s.items():
            if limit is None or s <= limit:
                report_at[cid] = s
            elif cid in partial_s:
                report_at[cid] = partial_s[cid][0]
        ids = sorted(report_at)
        if not ids:
            return []
        stays = stays_available(self.model, np.array(ids, dtype=np.int64), now_s,
                                now_s + np.array([report_at[c] for c in ids]))
        left = [c for c, ok in zip(ids, stays.tolist()) if not ok]
        for cid in left:
            full_s.pop(cid)
            partial_s.pop(cid, None)
        return left
