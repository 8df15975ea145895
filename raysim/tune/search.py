"""The sweep's scheduler (ASHA, HyperBand, median stopping, FIFO) and searcher (random, grid, Optuna) from its
spec."""

from __future__ import annotations

from typing import Any

from raysim.tune.spec import SweepSpec


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
