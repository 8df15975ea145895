"""Synchronous rounds in simulated time as the run's schedule (``system.enabled``; ``raysim.stages.Schedule``).

The round's clients are those of the available clients that the clock starts; the ones that drop out are not
trained; the others train once through the one plan; then the clock settles who reports and how long the round took
(:class:`raysim.system.clock.RoundClock`). With ``system.late=partial`` the late clients that can do partial work
train again, each with the step budget that fits before the deadline: the stage's client part ends such a job before
the step that would pass its budget (:class:`_StepBudget`), and reports every job's samples to the clock. The
round's simulated seconds go onto the clock, which is checkpointed with the run's totals (``sim_time_s``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from raysim.stages import ClientPart, Reports, RoundRun, Schedule, StageSetup
from raysim.trees import nbytes

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig
    from raysim.system.clock import RoundClock


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
        """With a deadline the reporters are known only once the uploads' sizes are: every upload travels."""
        return self.cfg.system.deadline_s is None

    def prepare(self) -> None:
        from raysim.system.clock import RoundClock

        self.clock = RoundClock(self.cfg, self.cfg.clients.per_round)

    def check(self, setup: StageSetup) -> None:
        assert self.clock is not None
        self.clock.check_deadline(setup.data.num_train, nbytes(setup.initial))

    def trains_alone(self, params: Any) -> bool:
        return params is not None  # a step budget: the one-client loop

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _StepBudget(params)

    def run_round(self, rnd: int, run: RoundRun) -> Reports:
        clock = self.clock
        assert clock is not None
        sampled, dropouts = clock.sample(rnd, self.now, lambda seed, r, num, count: run.sample(r, count))
        down = run.downloads(sampled, rnd)
        done, total = run.train([run.job(c, rnd, down.shared_ref, down.own.get(c)) for c in sampled], self.summable)
        results = {c: r for c, (r, _) in done.items()}
        settled = clock.settle(results, {c: r.stage[self.name] for c, r in results.items()},
                               {c: down.shared_bytes + down.own_bytes.get(c, 0) for c in done},
                               len(sampled) + len(dropouts))
        kept = {c: done[c] for c in settled.reporters if c not in settled.budgets}
        if settled.budgets:  # the partial clients again, each with the samples its steps may take
            partial = sorted(settled.budgets)
            again = run.downloads(partial, rnd)
            jobs = [run.job(c, rnd, again.shared_ref, again.own.get(c), params={self.name: settled.budgets[c]})
                    for c in partial]
            kept.update(run.train(jobs, False)[0])
        finished, skipped = run.collect(kept, rnd)
        self.now += settled.round_s
        metrics = {"round_sim_s": settled.round_s, "dropouts": len(dropouts), "late": len(settled.late),
                   "partial": len(settled.budgets), "surplus": len(settled.surplus)}
        return Reports(finished, skipped, sampled, down.bytes_down, down.shared, total, metrics,
                       totals={"sim_time_s": self.now})

    def restore(self, ckpt: dict, ckpt_dir: Any, run: RoundRun) -> None:
        self.now = float(ckpt["totals"].get("sim_time_s", 0.0))
