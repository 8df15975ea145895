"""The sweep's scheduler (ASHA, HyperBand, median stopping, FIFO) and searcher (random, grid, Optuna) from its
spec."""

from __future__ import annotations

from typing import Any, Optional

from raysim.tune.spec import SweepError, SweepSpec


def _scheduler(spec: SweepSpec, rounds: int) -> Any:
    """Trial schedulers count rounds: ASHA and HyperBand stop weak trials at rungs, median stopping stops a trial
    whose best so far is below the median of the others' running averages at the same round."""
    name, opts = spec.scheduler["name"], spec.scheduler
    if name == "fifo":
        return None
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler, MedianStoppingRule

    if name == "hyperband":
        return HyperBandScheduler(time_attr="round", max_t=rounds, reduction_factor=opts.get("reduction_factor", 2))
    if name == "median":
        return MedianStoppingRule(time_attr="round", grace_period=opts.get("grace_period", 1),
                                  min_samples_required=opts.get("min_samples_required", 3))
    return ASHAScheduler(time_attr="round", max_t=rounds, grace_period=opts.get("grace_period", 1),
                         reduction_factor=opts.get("reduction_factor", 2))


def _searcher(spec: SweepSpec) -> Any:
    """Tune's own random/grid generator (None), or seeded by ``search.seed`` when given. Optuna: TPE through
    Tune's OptunaSearch adapter; Tune saves its state with the experiment, so ``--resume`` continues the same
    study."""
    search = spec.search if isinstance(spec.search, dict) else {"name": "random"}
    if search.get("name", "random") == "random":
        if search.get("seed") is None:
            return None
        from ray.tune.search.basic_variant import BasicVariantGenerator

        return BasicVariantGenerator(random_state=int(search["seed"]))  # the same trials on every rerun
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=search.get("seed"),
                                         n_startup_trials=int(search.get("startup_trials", 5)))
    return OptunaSearch(sampler=sampler)


def draw_trials(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every trial of a random or grid sweep, drawn when the sweep starts, by Tune's own generator (seeded by
    ``search.seed`` when given: the same trials on every rerun): each trial's value of every searched key."""
    if spec.num_samples == 1 and len(spec.space) == 1 and "grid" in next(iter(spec.space.values())):
        (key, dist), = spec.space.items()  # one grid (a seed set): Tune's order is the grid's, listed here at once
        return [{key: value} for value in dist["grid"]]
    from ray.tune.experiment import Experiment

    from raysim.tune.trials import _param_space

    generator = _searcher(spec)
    if generator is None:
        from ray.tune.search.basic_variant import BasicVariantGenerator

        generator = BasicVariantGenerator()
    generator.add_configurations([Experiment("draw", _never_run, config=_param_space(spec),
                                             num_samples=spec.num_samples)])
    drawn = []
    while (trial := generator.next_trial()) is not None:
        drawn.append({key: trial.config[key] for key in spec.space})
    return drawn


def _never_run(config: dict) -> None:
    """The trainable named while drawing trials; nothing runs it."""


def recorded_search(spec: SweepSpec, state: Any, to_run: list, new: int) -> Any:
    """The searcher of every sweep: it hands Tune the recorded trials to run (again) first, each with its name
    (``TRIAL_KEY``), then, for Optuna, ``new`` trials that Optuna suggests, each recorded before it starts.

    On a resume, Optuna's new study is told the trials that ended (their values and the last value of the metric,
    as Tune's OptunaSearch tells a study when a trial completes), and the trials that run again as they end, so its
    suggestions build on every trial of the sweep. Tune saves no state of this searcher (``save`` writes nothing):
    the record is raysim's (``raysim.tune.state``)."""
    from ray.tune.search import Searcher

    from raysim.tune.state import TRIAL_KEY

    inner = _searcher(spec) if new else None
    if inner is None and new:
        raise SweepError("sweep key 'search.name': only Optuna suggests trials as the sweep goes")

    class RecordedSearch(Searcher):
        def __init__(self) -> None:
            super().__init__(metric=spec.metric, mode=spec.mode)
            self.queue, self.new_left = list(to_run), new
            self.trials: dict[str, tuple[Any, bool]] = {}  # Tune's trial id -> (record, suggested by Optuna)

        def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict, **more: Any) -> bool:
            if inner is not None:
                inner.set_search_properties(metric, mode, config, **more)
                for record in state.trials:  # what the sweep learnt before this resume
                    if record.status == "ended":
                        self._tell(record, record.value)
            return True

        def _tell(self, record: Any, value: Optional[float]) -> None:
            inner.add_evaluated_point(record.values, value, pruned=value is None)

        def suggest(self, trial_id: str) -> Optional[dict]:
            if self.queue:
                record = self.queue.pop(0)
                self.trials[trial_id] = (record, False)
                return {**record.values, TRIAL_KEY: record.name}
            if inner is None or self.new_left <= 0:
                return Searcher.FINISHED
            values = inner.suggest(trial_id)
            if values is None or values == Searcher.FINISHED:
                return values
            self.new_left -= 1
            record = state.add(trial_id, values)
            self.trials[trial_id] = (record, True)
            return {**record.values, TRIAL_KEY: record.name}

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            record, suggested = self.trials.get(trial_id, (None, False))
            if suggested:
                inner.on_trial_result(trial_id, result)

        def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
            record, suggested = self.trials.get(trial_id, (None, False))
            if suggested:
                inner.on_trial_complete(trial_id, result=result, error=error)
            elif inner is not None and record is not None and not error:
                value = (result or {}).get(spec.metric)
                self._tell(record, value if isinstance(value, (int, float)) else None)

        def save(self, checkpoint_path: str) -> None:
            pass  # raysim's record is the sweep's state; Tune's copy of a searcher would be a pickle

        def restore(self, checkpoint_path: str) -> None:
            raise SweepError("raysim restores no searcher from Ray Tune's files")

    return RecordedSearch()
