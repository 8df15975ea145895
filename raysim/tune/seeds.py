"""``raysim run CONFIG --seeds 0-9``: one config over several seeds, run as a grid sweep over ``seed``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from raysim.config import load_config
from raysim.errors import UserError
from raysim.tune.results import SweepResult
from raysim.tune.running import run_sweep
from raysim.tune.spec import SweepSpec, check_spec, spec_from_yaml


def parse_seeds(text: str) -> list[int]:
    """``0-9``, ``0,3,5`` or a mix (``0-4,10``) -> sorted distinct seeds."""
    seeds: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                seeds.update(range(a, b + 1))
            else:
                seeds.add(int(part))
        except ValueError:
            raise UserError(f"--seeds {text!r}: write seeds as 0-9, 0,3,5 or 0-4,10") from None
    if not seeds or min(seeds) < 0:
        raise UserError(f"--seeds {text!r}: give at least one seed >= 0")
    return sorted(seeds)


def seeds_spec(config: Optional[str | Path], overrides: list[str], seeds: list[int]) -> SweepSpec:
    """One config (None: the defaults) over several seeds, as a grid sweep whose trials are named seed-<n>."""
    if config is not None and not Path(config).is_file():
        raise UserError(f"config file not found: {config}")
    fixed = [o for o in overrides if not o.startswith("seed=")]
    base_cfg = load_config(config, fixed)
    spec = SweepSpec(base=str(Path(config).resolve()) if config else None, space={"seed": {"grid": list(seeds)}},
                     fixed=fixed, metric="acc_mean", naming="seed", dir=base_cfg.log.dir)
    check_spec(spec)
    return spec


def run_seeds(config: Optional[str | Path], overrides: list[str], seeds: list[int], *,
              resume_dir: Optional[Path] = None,
              quiet: bool = False, out: Callable[[str], None] = print) -> SweepResult:
    """``raysim run CONFIG --seeds 0-9``: each seed's run in PARENT/seed-<n>, in parallel where it fits."""
    if resume_dir is not None:
        spec = spec_from_yaml(Path(resume_dir) / "sweep.yaml")
        return run_sweep(spec, sweep_dir=Path(resume_dir), resume=True, quiet=quiet, out=out)
    spec = seeds_spec(config, overrides, seeds)
    return run_sweep(spec, quiet=quiet, out=out)


# ---------------------------------------------------------------------------------------------- in-process
def seed_trials(spec: SweepSpec, sweep_dir: Path) -> list[dict]:
    """The trials of a seed set run in-process (no Tune state to read): one per seed, its status read from its
    run directory (``TERMINATED``: all rounds done; ``ERROR``: an ``error.txt``; else ``PENDING``)."""
    from raysim.runlog import read_metrics
    from raysim.tune.trials import ERROR_FILE

    out = []
    for seed in spec.space["seed"]["grid"]:
        run_dir = spec.trials_dir(sweep_dir) / f"seed-{seed}"
        rows = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
        rounds = _configured_rounds(run_dir)
        if (run_dir / ERROR_FILE).is_file():
            status = "ERROR"
        elif rows and rounds is not None and rows[-1]["round"] >= rounds:
            status = "TERMINATED"
        else:
            status = "PENDING"
        out.append({"trial_id": f"seed-{seed}", "status": status, "config": {"seed": seed}})
    return out


def _configured_rounds(run_dir: Path) -> Optional[int]:
    import yaml

    try:
        return int((yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("rounds", 0)) or None
    except (OSError, ValueError, AttributeError):
        return None


def run_seeds_in_process(spec: SweepSpec, first: Any, sweep_dir: Path, *, quiet: bool,
                         out: Callable[[str], None]) -> None:
    """Each seed's run in turn, in this process (``engine.backend`` inline): no Ray, no Tune.

    The same directory layout and resume rules as a seed set on Tune: a done seed is not run again, one with a
    checkpoint continues from it, a failed one records its one-line cause in ``error.txt`` (its traceback goes to
    stderr, with your own frames) and the set goes on; Ctrl-C finishes the round, checkpoints and stops the set."""
    import shutil
    import sys
    import traceback
    from types import SimpleNamespace

    from raysim.engine.runner import run_experiment
    from raysim.engine.state import has_checkpoint
    from raysim.errors import RunStopped
    from raysim.tune.progress import _Progress
    from raysim.tune.trials import ERROR_FILE, TrialSetup, _checkpointed_round, _record_error

    seeds = list(spec.space["seed"]["grid"])
    done = tuple(t["trial_id"] for t in seed_trials(spec, sweep_dir) if t["status"] == "TERMINATED")
    progress = _Progress(spec, len(seeds), first.rounds, quiet, done=done,
                         run_dir=lambda trial: spec.trials_dir(sweep_dir) / trial.trial_id)
    setup = TrialSetup(base=spec.base, fixed=tuple(spec.fixed), trials_dir=str(spec.trials_dir(sweep_dir)),
                       cwd=str(Path.cwd()), naming=spec.naming)
    out(f"raysim: {'resuming' if done else 'starting'} {spec.names.what(len(seeds))} ({first.algorithm.name} on "
        f"{first.data.name}, {first.rounds} rounds each) in this process; directory {sweep_dir}")
    for seed in seeds:
        trial = SimpleNamespace(trial_id=f"seed-{seed}", config={"seed": seed}, last_result={})
        if trial.trial_id in done:
            continue
        run_dir = setup.run_dir({"seed": seed}, trial.trial_id)
        try:
            cfg = setup.config({"seed": seed}, run_dir)
            resume = has_checkpoint(run_dir)
            if resume and _checkpointed_round(run_dir) >= cfg.rounds:
                progress.finished(trial, failed=False)  # ended before a kill that the set never recorded
                continue
            if not resume and run_dir.exists():
                shutil.rmtree(run_dir)  # an earlier attempt that never completed a round
            (run_dir / ERROR_FILE).unlink(missing_ok=True)
            progress.started(trial)

            def on_round(m: dict, trial: Any = trial) -> None:
                trial.last_result = m
                progress.result(trial, m)

            _, _, stopped = run_experiment(cfg, resume=resume, on_round=on_round, handle_sigint=True)
        except KeyboardInterrupt:
            return  # a second Ctrl-C: the set stops at once; the table shows what is unfinished
        except (UserError, RunStopped) as exc:
            _record_error(run_dir, exc)
            progress.finished(trial, failed=True)
            continue
        except Exception as exc:  # noqa: BLE001 - a bug in a hook: its traceback now, and the set goes on
            traceback.print_exc(file=sys.stderr)
            _record_error(run_dir, exc)
            progress.finished(trial, failed=True)
            continue
        if stopped:
            return  # Ctrl-C: this seed checkpointed; the others are unfinished
        progress.finished(trial, failed=False)
