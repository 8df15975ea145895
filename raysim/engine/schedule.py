"""The schedule: who trains in a round, when each one reports, and what the server step consumes.

A schedule is the first stage of a run (``raysim.stages.Schedule``), chosen by the config (:func:`schedule_stage`):

- :class:`SyncSchedule`: synchronous rounds. The round's cohort is ``sample_clients`` (a pure function of (seed,
  round)) or what a stage chooses (Poisson sampling); every client trains once, and the server step consumes every
  finite report, in client-id order.
- ``raysim.system.stage.ClockSchedule`` (``system.enabled``): synchronous rounds in simulated time, with
  availability, dropouts and deadlines.
- ``raysim.engine.asynchronous.AsyncSchedule`` (``asynchronous.mode``): FedAsync and FedBuff, arrivals in
  simulated-time order.

Whichever it is, it trains through the driver's one plan and executor (``raysim.stages.RoundRun``: the services the
driver lends it) and returns the round's ``Reports``; the rest of the round (the reduction, the server step, metrics,
evaluation, log and checkpoint) is the driver's, the same for every schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raysim.engine.sampling import sample_clients
from raysim.stages import Reports, RoundRun, Schedule

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


class SyncSchedule(Schedule):
    """Synchronous rounds: the sampled cohort trains once and every finite report is consumed."""

    def run_round(self, rnd: int, run: RoundRun) -> Reports:
        cfg = self.cfg
        clients = run.stages.select(rnd)
        if clients is None:
            clients = sample_clients(cfg.seed, rnd, cfg.clients.num, cfg.clients.fraction)
        run.stages.begin_round(rnd, clients)
        down = run.downloads(clients, rnd)
        jobs = [run.job(c, rnd, down.shared_ref, down.own.get(c)) for c in clients]
        done, total = run.train(jobs, self.summable)
        finished, skipped = run.collect(done, rnd)
        return Reports(finished, skipped, clients, down.bytes_down, down.shared, total)


def schedule_stage(cfg: ExperimentConfig) -> Schedule:
    """The run's schedule: FedAsync/FedBuff (``asynchronous.mode``), the simulated clock (``system.enabled``), or
    synchronous rounds."""
    if cfg.asynchronous.on:
        from raysim.engine.asynchronous import AsyncSchedule

        return AsyncSchedule(cfg)
    if cfg.system.enabled:
        from raysim.system.stage import ClockSchedule

        return ClockSchedule(cfg)
    return SyncSchedule(cfg)
