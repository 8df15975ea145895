"""Experiment tracking: MLflow (``log.mlflow``) and Weights & Biases (``log.wandb``), both optional extras.

A run (``raysim run``, ``raysim.run``, each seed of an in-process ``--seeds`` set) logs its whole resolved config as
parameters when it starts and every round's numeric metrics at step = round, through :class:`RunTracker`. Sweeps and
seed sets on Ray Tune use Tune's own ``MLflowLoggerCallback`` / ``WandbLoggerCallback`` (:func:`tune_callbacks`):
one tracked run per trial, with the trial's searched values as parameters and every reported round as a step.

``log.mlflow``: a tracking URI (``sqlite:///mlflow.db``, ``http://host:5000``, ``file:/path/mlruns``), a folder
(``mlruns``: MLflow's file store there), or ``true`` for ``./mlruns``; MLflow 3 refuses a file store unless
``MLFLOW_ALLOW_FILE_STORE=true``, which raysim sets when the store it is given is a folder (``mlflow ui`` then needs
the same). ``log.wandb``: the W&B project (``true``: ``raysim``); the rest is W&B's own environment (``WANDB_MODE=
offline`` runs with no network, ``WANDB_DIR``, ``WANDB_ENTITY``). A resumed run continues the same tracked run (its
ids are kept in the run directory's ``tracking.json``).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional

from raysim.config import ExperimentConfig, mlflow_uri, switched_on, to_flat_dict
from raysim.extras import require_extra

TRACKING_FILE = "tracking.json"
DEFAULT_WANDB_PROJECT = "raysim"


def wandb_project(value: str) -> str:
    return DEFAULT_WANDB_PROJECT if switched_on(value) else value


def _allow_file_store(uri: str) -> None:
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def check_tracking(cfg: ExperimentConfig) -> None:
    """One line naming the extra when ``log.mlflow`` / ``log.wandb`` is set and its package is not installed."""
    if cfg.log.mlflow:
        require_extra("mlflow", "log.mlflow")
    if cfg.log.wandb:
        require_extra("wandb", "log.wandb")


def numeric(metrics: dict) -> dict[str, float]:
    """The round's numbers (no round, lists, None or NaN)."""
    return {k: float(v) for k, v in metrics.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def params(cfg: ExperimentConfig) -> dict[str, str]:
    """The flat resolved config as strings (lists as JSON), without where it was written."""
    return {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in to_flat_dict(cfg).items() if k != "log.dir"}


class RunTracker:
    """The tracked runs of one raysim run: ``start`` when its directory is known, ``log`` each round, ``close``."""

    def __init__(self, cfg: ExperimentConfig):
        check_tracking(cfg)  # before any work starts
        self.cfg = cfg
        self.run_dir: Optional[Path] = None
        self._mlflow: Any = None
        self._mlflow_run: Optional[str] = None
        self._wandb: Any = None

    @property
    def active(self) -> bool:
        return bool(self.cfg.log.mlflow or self.cfg.log.wandb)

    def start(self, run_dir: Path, start_round: int = 0) -> None:
        if not self.active:
            return
        self.run_dir = Path(run_dir)
        ids = self._saved_ids() if start_round else {}
        for key, begin in (("mlflow", self._start_mlflow), ("wandb", self._start_wandb)):
            if getattr(self.cfg.log, key):
                try:
                    begin(ids.get(key))
                except Exception as exc:  # noqa: BLE001 - an unreachable server, a bad URI, no login: one line
                    from raysim.errors import UserError

                    cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                    raise UserError(f"config key 'log.{key}': cannot start tracking at {getattr(self.cfg.log, key)} "
                                    f"({cause})") from None
        from raysim.fsutil import atomic_write_text

        kept = {"mlflow": self._mlflow_run, "wandb": self._wandb.id if self._wandb is not None else None}
        atomic_write_text(self.run_dir / TRACKING_FILE, json.dumps(kept) + "\n", fsync=False)

    def _saved_ids(self) -> dict:
        try:
            return json.loads((self.run_dir / TRACKING_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def _start_mlflow(self, run_id: Optional[str]) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = mlflow_uri(self.cfg.log.mlflow)
        _allow_file_store(uri)
        client = MlflowClient(tracking_uri=uri)
        if run_id is not None:  # a resumed run: the same tracked run, running again
            client.update_run(run_id, status="RUNNING")
        else:
            name = self.cfg.name
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            run_id = client.create_run(experiment_id, run_name=self.run_dir.name,
                                       tags={"raysim.run_dir": str(self.run_dir.resolve())}).info.run_id
            items = [Param(k, v[:6000]) for k, v in params(self.cfg).items()]
            for start in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
                client.log_batch(run_id, params=items[start:start + 100])
        self._mlflow, self._mlflow_run = client, run_id

    def _start_wandb(self, run_id: Optional[str]) -> None:
        import wandb

        self._wandb = wandb.init(project=wandb_project(self.cfg.log.wandb), name=self.run_dir.name,
                                 config=params(self.cfg), id=run_id, resume="allow" if run_id else None,
                                 reinit="create_new", settings=wandb.Settings(silent=True))

    def log(self, metrics: dict) -> None:
        values = numeric(metrics)
        step = int(metrics["round"])
        if self._mlflow is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self._mlflow.log_batch(self._mlflow_run, metrics=[Metric(k, v, now, step) for k, v in values.items()])
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self, status: str = "FINISHED") -> None:
        """``FINISHED``, ``FAILED`` or ``KILLED`` (interrupted: a resume continues it)."""
        if self._mlflow is not None:
            self._mlflow.set_terminated(self._mlflow_run, status=status)
            self._mlflow = None
        if self._wandb is not None:
            self._wandb.finish(exit_code=0 if status == "FINISHED" else 1)
            self._wandb = None


def tune_callbacks(cfg: ExperimentConfig, sweep_dir: Path) -> list:
    """Ray Tune's own logger callbacks for a sweep or a seed set on Tune: one tracked run per trial."""
    check_tracking(cfg)
    callbacks: list = []
    if cfg.log.mlflow:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        uri = mlflow_uri(cfg.log.mlflow)
        _allow_file_store(uri)
        callbacks.append(MLflowLoggerCallback(tracking_uri=uri, experiment_name=cfg.name, save_artifact=False,
                                              tags={"raysim.sweep_dir": str(sweep_dir)}))
    if cfg.log.wandb:
        from ray.air.integrations.wandb import WandbLoggerCallback

        extra = {k: os.environ[v] for k, v in (("mode", "WANDB_MODE"), ("dir", "WANDB_DIR")) if os.environ.get(v)}
        callbacks.append(WandbLoggerCallback(project=wandb_project(cfg.log.wandb), group=Path(sweep_dir).name,
                                             **extra))
    return callbacks
