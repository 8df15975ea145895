"""``raysim tune`` and ``raysim run --seeds``: every Ray Tune trial is one whole raysim run.

A trial reserves its driver and workers with a placement group (bundle 0 for the driver, one bundle per worker), so
concurrent trials share a cluster without oversubscribing it; requests the cluster can never satisfy are refused up
front, since Tune would otherwise leave such trials pending for ever. A trial whose run needs one CPU worker runs it
whole in the trial's own process (no worker process, no object-store traffic), and Tune reuses that process for the
next trial (torch, raysim and the built datasets stay loaded). A seed set whose runs are in-process needs neither Ray
nor Tune: its seeds run several at once, one process per core (``inprocess``, ``seedpool``). Trials report every
round with ``ray.tune.report`` (ASHA stops poor ones early, counting rounds) and write ordinary raysim run
directories inside the sweep directory, so ``raysim report`` and TensorBoard work on them as on any run.

Sweep directory layout::

    SWEEP_DIR/sweep.yaml          the resolved sweep (a copy of the record's, for people; it must agree)
    SWEEP_DIR/trials/<trial>/     one raysim run directory per trial (seeds: seed-<n>/)
    SWEEP_DIR/sweep-state.json    raysim's record: every trial, its values and status (what --resume reads)
    SWEEP_DIR/tune/               Ray Tune's own files (written by Tune, never read by raysim)
    SWEEP_DIR/results.csv, .md    every trial: searched values, best metric, rounds run, status
    SWEEP_DIR/best.yaml           the best trial's config, ready for ``raysim run``

Modules, by concern: ``spec`` (reading and saving sweep files), ``validate`` (checking a sweep before it runs),
``naming`` (trial or seed: run-directory names, labels, summaries), ``trials`` (the Tune trainable), ``progress``
(console lines), ``running`` (the Tuner), ``sweepdir`` (the sweep directory), ``guards`` (how
raysim keeps Tune in line: signals, lost trials, unsaved state, error lines), ``search`` (schedulers and searchers),
``results`` (the tables, best.yaml, HParams), ``seeds`` (``--seeds``), ``state`` (raysim's record of the sweep),
``inprocess``, ``seedrun`` and ``seedpool`` (seed sets without Ray).
This package re-exports what callers import from ``raysim.tune``.
"""

from raysim.tables import markdown_table
from raysim.tune.naming import SeedNaming, TrialNaming, naming
from raysim.tune.progress import _Progress, _progress_callback
from raysim.tune.results import (SweepResult, collect_trials, finish_sweep, trial_error, trial_run_dir,
                                 write_atomically, write_best_config)
from raysim.tune.running import run_sweep
from raysim.tune.search import _scheduler, _searcher
from raysim.tune.seeds import parse_seeds, run_seeds, seeds_spec
from raysim.tune.state import STATE_FILE, read_state, resume_spec, spec_from_yaml
from raysim.tune.spec import (DISTRIBUTIONS, RUN_METRICS, SCHEDULER_KEYS, SCHEDULERS, SEARCHERS, SWEEP_KEYS,
                              SweepError, SweepSpec, check_spec, default_sweep_dir, flatten_space, load_sweep,
                              spec_to_yaml)
from raysim.tune.trials import ERROR_FILE, TrialSetup, one_line_cause, run_trial, trial_bundles
from raysim.tune.validate import candidate_configs, candidate_overrides, check_cluster, validate_sweep

__all__ = [
    "DISTRIBUTIONS", "ERROR_FILE", "RUN_METRICS", "SCHEDULERS", "SCHEDULER_KEYS", "SEARCHERS", "STATE_FILE",
    "SWEEP_KEYS", "SeedNaming", "SweepError", "SweepResult", "SweepSpec", "TrialNaming", "TrialSetup", "_Progress",
    "_progress_callback", "_scheduler", "_searcher", "candidate_configs", "candidate_overrides", "check_cluster",
    "check_spec", "collect_trials", "default_sweep_dir", "finish_sweep", "flatten_space", "load_sweep",
    "markdown_table", "naming", "one_line_cause", "parse_seeds", "read_state", "resume_spec", "run_seeds",
    "run_sweep", "run_trial", "seeds_spec", "spec_from_yaml", "spec_to_yaml", "trial_bundles", "trial_error",
    "trial_run_dir", "validate_sweep", "write_atomically", "write_best_config",
]
