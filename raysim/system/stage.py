"""Synchronous rounds in simulated time as the run's schedule (``system.enabled``; ``raysim.stages.Schedule``).

The round's clients are those of the available clients that the clock starts; the ones that drop out are not
trained; the others train once through the one plan; then the clock settles who reports and how long the round took
(:class:`raysim.system.clock.RoundClock`). With ``system.late=partial`` the late clients that can do partial work
train again, each with the step budget that fits before the deadline: the stage's client part ends such a job before
the step that would pass its budget (:class:`_StepBudget`), and reports every job's samples to the clock. The
round's simulated seconds go onto the clock, which is checkpointed with the run's totals (``sim_time_s``).

An abandoned round (``system.min_reports``) reports nothing to the server step (``Reports.abandoned``): its clients'
results are discarded, none keeps state from it, and it logs ``abandoned: 1`` with the time it took. Before round
1, on the driver, :func:`check_system_run` measures the model's FLOPs per sample where speeds are in FLOP/s and
refuses a configuration in which no client can ever report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from raysim.stages import ClientPart, Reports, RoundRun, Schedule, StageSetup
from raysim.trees import nbytes

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig
    from raysim.system.clock import RoundClock
    from raysim.system.model import SystemModel


def check_system_run(model: SystemModel, cfg: ExperimentConfig, setup: StageSetup) -> None:
    """Before round 1, on the driver, for either clock (``model.cfg``: the system section it runs under): with
    speeds in FLOP/s, each client's training FLOPs per sample (``raysim.system.flops``); then, in one line each,
    traits under which the slowest job outlasts what the clock counts (``raysim.system.clock.check_job_times``) and
    a run in which no client can ever report (its smallest job against the deadline or report timeout, and with
    ``whole_job`` against its longest stretch of availability)."""
    from raysim.system.clock import check_job_times
    from raysim.system.presence import check_reachable

    system = model.cfg
    if system.speed_unit == "flops":
        from raysim.system.flops import sample_costs

        model.sample_cost = sample_costs(cfg, setup.data, setup.algorithm)
    sizes = np.array([setup.data.num_train(c) for c in range(model.num_clients)], dtype=np.float64)
    check_job_times(model, cfg, sizes * cfg.train.local_epochs, nbytes(setup.initial))
    deadline = system.deadline_s
    limit, key = (deadline, "system.deadline_s") if deadline is not None else \
        (system.report_timeout_s, "system.report_timeout_s")
    if limit is None and not system.availability.whole_job:
        return
    partial = deadline is not None and system.late == "partial"
    work = np.minimum(sizes, cfg.train.batch_size) if partial else sizes * cfg.train.local_epochs
    check_reachable(model, work, nbytes(setup.initial), limit, key, "one local step" if partial else "a round's job")


class _StepBudget(ClientPart):
    """The samples a client's job took (the clock's samples x epochs), and, with a budget, the end of its training
    before the step that would pass it."""

    def __init__(self, budget: Optional[int]):
        self.budget = budget

    def fits(self, seen: int, size: int) -> bool:
        return self.budget is None or seen + size <= self.budget

    def report(self, seen: int) -> Any:
        return seen


class ClockSchedule(Schedule):
    """See the module docstring; the clock (which reads the system files) is made on the driver only."""

    name = "clock"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self.clock: Optional[RoundClock] = None
        self.now = 0.0  # simulated seconds at the end of the last round

    @property
    def summable(self) -> bool:  # type: ignore[override]
        """With a deadline or a report timeout, or clients that may leave mid-job, the reporters are known only once
        the uploads' sizes are: every upload travels."""
        system = self.cfg.system
        return system.deadline_s is None and system.report_timeout_s is None and not system.availability.whole_job

    def prepare(self) -> None:
        from raysim.system.clock import RoundClock

        self.clock = RoundClock(self.cfg, self.cfg.clients.per_round)

    def check(self, setup: StageSetup) -> None:
        assert self.clock is not None
        check_system_run(self.clock.model, self.cfg, setup)

    def trains_alone(self, params: Any) -> bool:
        return params is not None  # a step budget: the one-client loop

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _StepBudget(params)

    def run_round(self, rnd: int, run: RoundRun) -> Reports:
        clock = self.clock
        assert clock is not None
        sampled, dropouts = clock.sample(rnd, self.now, lambda seed, r, num, count: run.sample(r, count))
        run.stages.begin_round(rnd, sorted(sampled + dropouts))  # the dropouts started the round too
        down = run.downloads(sampled, rnd)
        done, total = run.train([run.job(c, rnd, down.shared_ref, down.own.get(c)) for c in sampled], self.summable)
        results = {c: r for c, (r, _) in done.items()}
        settled = clock.settle(results, {c: r.stage[self.name] for c, r in results.items()},
                               {c: down.shared_bytes + down.own_bytes.get(c, 0) for c in done},
                               len(sampled) + len(dropouts), self.now, len(dropouts))
        finished: list = []
        skipped: list[int] = []
        if not settled.abandoned:  # an abandoned round's results are discarded: no client keeps state from it
            kept = {c: done[c] for c in settled.reporters if c not in settled.budgets}
            if settled.budgets:  # the partial clients again, each with the samples its steps may take
                partial = sorted(settled.budgets)
                again = run.downloads(partial, rnd)
                jobs = [run.job(c, rnd, again.shared_ref, again.own.get(c), params={self.name: settled.budgets[c]})
                        for c in partial]
                kept.update(run.train(jobs, False)[0])
            finished, skipped = run.collect(kept, rnd)
        self.now += settled.round_s
        metrics = {"round_sim_s": settled.round_s, "dropouts": len(dropouts) + len(settled.left),
                   "late": len(settled.late), "partial": len(settled.budgets), "surplus": len(settled.surplus)}
        system = self.cfg.system
        if system.availability.whole_job:
            metrics["dropouts_left"] = len(settled.left)  # the rest dropped out by system.dropout
        if system.min_reports is not None:
            metrics["abandoned"] = int(settled.abandoned)
        return Reports(finished, skipped, sampled, down.bytes_down, down.shared,
                       None if settled.abandoned else total, metrics, totals={"sim_time_s": self.now},
                       abandoned=settled.abandoned)

    def restore(self, ckpt: dict, ckpt_dir: Any, run: RoundRun) -> None:
        self.now = float(ckpt["totals"].get("sim_time_s", 0.0))
