"""How a sweep names its trials: Tune's trial ids (``raysim tune``) or the seed (``raysim run --seeds``).

The one place where a sweep and a seed run differ: where a trial's run directory sits and what it is called, how
the console and the tables name a trial, how rows sort, and what the summary says (a sweep has a best config, seeds
repeat one config, so their summary is a mean). ``SweepSpec.naming`` keeps the strategy's name (it is saved in
``sweep.yaml``); :func:`naming` gives the strategy.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

from raysim.tables import counted, short_value


class TrialNaming:
    """``raysim tune``: trials in SWEEP_DIR/trials/<trial_id>, sorted best first; the best trial is the result."""

    name = "trial"
    noun = "trial"
    title = "Sweep"
    dir_kind = "sweep"  # default directory: runs/<config>-sweep-<time>
    dir_key = "dir"  # the config key that names the sweep directory (for the lock's error)
    run_dirs = "trials/<trial>"
    keeps_run_dirs = False  # a sweep started again gets new trial ids: the lost attempt's run dirs go
    resume_command = "raysim tune --resume"  # + the sweep directory

    def trials_dir(self, sweep_dir: Path) -> Path:
        return sweep_dir / "trials"

    def run_dir_name(self, trial_id: str, config: dict) -> str:
        return trial_id

    def label(self, trial_id: str, config: dict) -> str:
        values = " ".join(f"{k}={short_value(v)}" for k, v in config.items())
        return f"trial {trial_id}" + (f" ({values})" if values else "")

    def row_name(self, run_dir: Path, trial_id: str) -> str:
        return trial_id

    def what(self, total: int) -> str:
        return f"sweep of {counted(total, 'trial')}"

    def sort(self, rows: list[dict], metric: str, mode: str) -> None:
        key, sign = f"best_{metric}", (-1 if mode == "max" else 1)
        rows.sort(key=lambda r: (r[key] is None, sign * (r[key] or 0.0), r["trial"]))

    def best(self, rows: list[dict], metric: str) -> Optional[dict]:
        return next((r for r in rows if r[f"best_{metric}"] is not None), None)

    def summary(self, rows: list[dict], metric: str, best: Optional[dict]) -> list[str]:
        if not best:
            return []
        return [f"Best: trial `{best['trial']}` with {metric} {best[f'best_{metric}']:.4f} "
                f"(round {best['best_round']}); config in `best.yaml`.", ""]

    def progress_best(self, metric: str, best: Optional[tuple[float, str]], per_trial: dict[str, float]) -> str:
        return f"; best {metric} {best[0]:.4f} ({best[1]})" if best else ""


class SeedNaming(TrialNaming):
    """``raysim run --seeds``: runs in PARENT/seed-<n>, sorted by seed; the summary is mean ± std over seeds."""

    name = "seed"
    noun = "seed"
    title = "Seeds"
    dir_kind = "seeds"
    dir_key = "log.dir"
    run_dirs = "seed-<n>"
    keeps_run_dirs = True  # seed-<n> names the same run again: a done one is not rerun
    resume_command = "raysim run --resume"

    def trials_dir(self, sweep_dir: Path) -> Path:
        return sweep_dir

    def run_dir_name(self, trial_id: str, config: dict) -> str:
        return f"seed-{config.get('seed')}"

    def label(self, trial_id: str, config: dict) -> str:
        return f"seed {config.get('seed')}"

    def row_name(self, run_dir: Path, trial_id: str) -> str:
        return run_dir.name

    def what(self, total: int) -> str:
        return counted(total, "seed")

    def sort(self, rows: list[dict], metric: str, mode: str) -> None:
        rows.sort(key=lambda r: r.get("seed", 0))

    def best(self, rows: list[dict], metric: str) -> Optional[dict]:
        return None  # seeds repeat one config: no seed is "the best config"

    def summary(self, rows: list[dict], metric: str, best: Optional[dict]) -> list[str]:
        scored = [r[f"best_{metric}"] for r in rows if r[f"best_{metric}"] is not None]
        if not scored:
            return []
        sd = statistics.stdev(scored) if len(scored) > 1 else 0.0
        return [f"Best {metric}: {statistics.fmean(scored):.4f} ± {sd:.4f} (mean ± std over {len(scored)} seeds).",
                ""]

    def progress_best(self, metric: str, best: Optional[tuple[float, str]], per_trial: dict[str, float]) -> str:
        if not per_trial:
            return super().progress_best(metric, best, per_trial)
        import numpy as np

        values = list(per_trial.values())
        sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        return (f"; best {metric} so far {np.mean(values):.4f} ± {sd:.4f} over {len(values)} "
                f"seed{'s' if len(values) > 1 else ''}")


NAMINGS: dict[str, TrialNaming] = {n.name: n for n in (TrialNaming(), SeedNaming())}


def naming(name: str) -> TrialNaming:
    """The strategy saved as ``name`` in ``sweep.yaml`` ("trial" or "seed")."""
    return NAMINGS[name]

