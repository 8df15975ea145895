"""A sweep's results: one row per trial from raysim's record of the sweep and the trial's run directory;
results.csv/.md, best.yaml and each trial's TensorBoard HParams."""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from raysim.config import load_config, to_yaml
from raysim.fsutil import atomic_write_text
from raysim.tables import markdown_table, metric_cell, short_value
from raysim.tboard import saved_hparams, write_hparams
from raysim.tune.spec import SweepSpec
from raysim.tune.trials import ERROR_FILE


@dataclass
class SweepResult:
    sweep_dir: Path
    rows: list[dict]  # one per trial, best first
    best: Optional[dict]
    table_md: str


def collect_trials(spec: SweepSpec, sweep_dir: Path) -> list[dict]:
    """One row per trial from raysim's record of the sweep (``raysim.tune.state``) and the trial's run directory,
    best first."""
    from raysim.runlog import read_metrics

    if spec.naming == "seed" and not (sweep_dir / "tune").is_dir():  # a seed set run in-process: no Tune
        trials = seed_trials(spec, sweep_dir)
    else:
        trials = _recorded_trials(sweep_dir)
    rows = []
    for trial in trials:
        values = {k: trial["config"].get(k) for k in spec.space}
        if trial.get("missing"):  # an Optuna trial not suggested yet: no values, no run directory
            rows.append({"trial": "(not started)", "trial_id": trial["trial_id"], **values,
                         f"best_{spec.metric}": None, "best_round": None, "rounds": "0/?", "status": "unfinished",
                         "run_dir": ""})
            continue
        run_dir = trial_run_dir(spec, sweep_dir, trial["trial_id"], trial["config"])
        metrics = read_metrics(run_dir / "metrics.jsonl")
        scored = [m for m in metrics if m.get(spec.metric) is not None]
        best = (max if spec.mode == "max" else min)(scored, key=lambda m: m[spec.metric]) if scored else None
        rounds = _total_rounds(run_dir)
        ran = metrics[-1]["round"] if metrics else 0
        cause = trial_error(run_dir)
        if trial["status"] == "ERROR" or (cause and trial["status"] != "TERMINATED"):
            status = f"error: {cause}" if cause else "error"
        elif rounds is not None and ran >= rounds:
            status = "done"
        elif trial["status"] in ("TERMINATED", "PAUSED"):
            status = "stopped"  # by the scheduler (ASHA, median stopping; HyperBand pauses the trials it drops)
        else:
            status = "unfinished"  # the sweep was interrupted; --resume continues it
        rows.append({"trial": spec.names.row_name(run_dir, trial["trial_id"]),
                     "trial_id": trial["trial_id"], **values,
                     f"best_{spec.metric}": best[spec.metric] if best else None,
                     "best_round": best["round"] if best else None,
                     "rounds": f"{ran}/{rounds if rounds is not None else '?'}", "status": status,
                     "run_dir": str(run_dir)})
    spec.names.sort(rows, spec.metric, spec.mode)
    return rows


def seed_trials(spec: SweepSpec, sweep_dir: Path) -> list[dict]:
    """The trials of a seed set run in-process (no Tune state to read): one per seed, its status read from its
    run directory (``TERMINATED``: all rounds done; ``ERROR``: an ``error.txt``; else ``PENDING``)."""
    from raysim.runlog import read_metrics

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


def trial_run_dir(spec: SweepSpec, sweep_dir: Path, trial_id: str, config: dict) -> Path:
    return spec.trials_dir(sweep_dir) / spec.names.run_dir_name(trial_id, config)


def trial_error(run_dir: Path) -> Optional[str]:
    """A failed trial's one-line cause (``error.txt`` in its run directory), or None."""
    try:
        text = (run_dir / ERROR_FILE).read_text().strip()
    except OSError:
        return None
    return text.splitlines()[0] if text else None


_TUNE_STATUS = {"pending": "PENDING", "ended": "TERMINATED", "paused": "PAUSED", "error": "ERROR"}


def _recorded_trials(sweep_dir: Path) -> list[dict]:
    """Name, status (in Tune's words) and sampled values of every trial the sweep's record holds (one not started
    yet is unfinished, as one that was running); an Optuna sweep stopped before Optuna suggested all its trials
    also gets a row per trial still to come, so that it never reads as a whole sweep."""
    from raysim.tune.state import read_state

    state = read_state(sweep_dir)
    rows = [{"trial_id": t.name, "status": _TUNE_STATUS[t.status], "config": dict(t.values)} for t in state.trials]
    rows += [{"trial_id": f"not-suggested-{i}", "status": "PENDING", "config": {}, "missing": True}
             for i in range(state.new_left())]
    return rows


def _total_rounds(run_dir: Path) -> Optional[int]:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    return int((yaml.safe_load(path.read_text()) or {}).get("rounds", 0)) or None


def finish_sweep(spec: SweepSpec, sweep_dir: Path) -> SweepResult:
    """Write results.csv, results.md, best.yaml and each trial's HParams."""
    rows = collect_trials(spec, sweep_dir)
    columns = ["trial", *spec.space, f"best_{spec.metric}", "best_round", "rounds", "status", "run_dir"]
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in columns})
    write_atomically(sweep_dir / "results.csv", buf.getvalue())
    md_columns = [c for c in columns if c != "run_dir"]
    table = markdown_table(md_columns, [[short_value(row[c]) if c in spec.space else metric_cell(row[c])
                                         for c in md_columns] for row in rows])
    names = spec.names
    best = names.best(rows, spec.metric)
    count = f"{len(rows)} {names.noun}{'s' if len(rows) != 1 else ''}"  # "20 trials", "5 seeds"
    header = [f"# {names.title} {sweep_dir.name}", "",
              f"Base config: `{spec.base or 'built-in defaults'}`; metric: best `{spec.metric}` over rounds "
              f"({spec.mode}); scheduler: {spec.scheduler['name']}; {count}; run directories in "
              f"`{names.run_dirs}/`.", ""]
    header += names.summary(rows, spec.metric, best)
    write_atomically(sweep_dir / "results.md", "\n".join(header + [table]) + "\n")
    if best:
        write_best_config(spec, best, sweep_dir / "best.yaml")
    for row in rows:  # the trial's whole config (the searched keys as Tune chose them), and its best metric
        hparams = saved_hparams(Path(row["run_dir"])) if row["run_dir"] else None  # "": not started
        if hparams is not None:
            write_hparams(Path(row["run_dir"]), {**hparams, **{k: row[k] for k in spec.space}},
                          {f"hparams/best_{spec.metric}": row[f"best_{spec.metric}"]})
    return SweepResult(sweep_dir=sweep_dir, rows=rows, best=best, table_md=table)


def write_best_config(spec: SweepSpec, best: dict, path: Path) -> None:
    """The best trial's resolved config with its run directory cleared, so ``raysim run best.yaml`` starts afresh."""
    cfg = load_config(Path(best["run_dir"]) / "config.yaml")
    cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=None))
    values = ", ".join(f"{k}={short_value(best[k])}" for k in spec.space)
    write_atomically(path, f"# best trial {best['trial']} of sweep {path.parent}: {spec.metric} "
                    f"{best[f'best_{spec.metric}']:.4f} at round {best['best_round']}\n"
                    f"# searched: {values}\n"
                    f"# rerun over seeds: raysim run {path} --seeds 0-4\n" + to_yaml(cfg))


def write_atomically(path: Path, text: str) -> None:
    """A kill while a table is written leaves the old file or the new one, never half of one; fsync, since the
    sweep's files (sweep.yaml above all, which --resume reads back) are its record once Tune is done."""
    atomic_write_text(path, text, fsync=True)
