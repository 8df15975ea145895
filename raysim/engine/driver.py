"""The driver actor and the one round loop of raysim.

Each round: sample clients -> dispatch their jobs to the pool -> aggregate through the algorithm's hooks ->
evaluate -> server-side curriculum (``on_round_end``) -> log -> checkpoint. ``run()`` is a Ray streaming generator
that yields each round's metrics, so the CLI prints progress and a Tune trial reports every round.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import ray
import torch

from raysim.data import build_federated_data
from raysim.engine.pool import Job, WorkerPool
from raysim.engine.state import ClientStateStore, read_checkpoint
from raysim.engine.worker import nbytes
from raysim.errors import RunStopped
from raysim.models import build_model
from raysim.registry import get_algorithm, import_plugins
from raysim.runlog import RunLog


class WriteFailed(RunStopped):
    """Writing the run directory failed (a full disk): the run stops; the checkpoint on disk is whole."""


def sample_clients(seed: int, round: int, num: int, fraction: float) -> list[int]:
    """The round's clients, a pure function of (seed, round): resuming needs no saved RNG state."""
    m = max(1, int(round_half_up(fraction * num)))
    rng = np.random.default_rng([seed, round, 104729])
    return sorted(int(c) for c in rng.choice(num, size=m, replace=False))


def round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


class Driver:
    """The actor body; ``ray.remote`` is applied by the runner (it pins the driver to the caller's node)."""

    def __init__(self, cfg: Any, run_dir: str, resume: bool, placement_group: Any = None):
        # Ray reports an exception raised in an actor's __init__ as a bare ActorDiedError (the cause is lost), so
        # setup errors (missing data, damaged checkpoint) are kept and raised from the first method call instead.
        self._setup_error: Optional[BaseException] = None
        self.pool: Optional[WorkerPool] = None  # made by start(), with the workers the host created
        self._stop = threading.Event()
        self._placement_group = placement_group
        try:
            self._setup(cfg, run_dir, resume)
        except Exception as exc:  # noqa: BLE001 - re-raised unchanged by start()
            self._setup_error = exc

    def _setup(self, cfg: Any, run_dir: str, resume: bool) -> None:
        torch.set_num_threads(1)
        import_plugins(cfg.plugins)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.algorithm = get_algorithm(cfg.algorithm.name)(cfg)
        self.data = self.algorithm.prepare_data(build_federated_data(cfg))
        self.algorithm.check(cfg, self.data)
        self.data_ref = ray.put(self.data)  # once per run; jobs carry client ids, never samples
        self.states = ClientStateStore()
        self.totals = {"bytes_up_total": 0, "bytes_down_total": 0, "wall_s_total": 0.0}
        self.round = 0
        self._checkpointed = 0  # the round of the checkpoint on disk
        initial = build_model(cfg, cfg.model.for_client(0), self.data.input_shape(0), self.data.num_classes, 0)
        self.server_state = self.algorithm.init_server_state(initial.state_dict())
        if resume:
            ckpt = read_checkpoint(self.run_dir)
            self.round = self._checkpointed = int(ckpt["round"])
            self.server_state = ckpt["server_state"]
            self.totals.update(ckpt["totals"])
            self.states.load(self.run_dir / "checkpoint", ckpt["client_files"])
        with self._writing("metrics.jsonl"):
            self.log = RunLog(self.run_dir, tensorboard=cfg.log.tensorboard, per_client_max=cfg.log.per_client_max,
                              resume_round=self.round if resume else 0)

    # ------------------------------------------------------------------ control (callable while run() streams)
    def start(self, workers: Optional[list[Any]] = None) -> int:
        """Take the workers (created by the host beside this actor, or here when None), send them the data, and
        return the round the run continues after. A setup error is raised here, with its own message."""
        if self._setup_error is not None:
            raise self._setup_error
        if self.pool is None:
            self.pool = WorkerPool(self.cfg, self.data_ref, self._placement_group, workers)
        return self.round

    def worker_info(self) -> list[dict]:
        return self.pool.info()

    def shutdown(self) -> None:
        """Release the workers now (an interrupted ``run()`` generator may never reach its ``finally``)."""
        self._stop.set()
        if self.pool is not None:
            self.pool.shutdown()

    def request_stop(self) -> None:
        """Finish the current round, checkpoint, and end ``run()`` (Ctrl-C)."""
        self._stop.set()

    # ------------------------------------------------------------------ the round loop
    def run(self) -> Iterator[dict]:
        self.start()  # a no-op once the runner has called it
        try:
            while self.round < self.cfg.rounds and not self._stop.is_set():
                yield self.run_round(self.round + 1)
        except RunStopped as exc:
            if not isinstance(exc, WriteFailed) and self.round > self._checkpointed:
                with self._writing("the checkpoint"):
                    self.checkpoint()  # the last complete round, whatever log.checkpoint_every says
            raise
        finally:
            failing = sys.exc_info()[1] is not None
            try:
                with self._writing("metrics.jsonl and TensorBoard's events"):
                    self.log.close()
            except WriteFailed:
                if not failing:  # else the first error is the one to report
                    raise
            finally:
                self.pool.shutdown()

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """A failed write to the run directory (a full disk, a quota, a lost mount) stops the run in one line.

        The checkpoint is replaced atomically and metrics beyond it are trimmed on resume, so nothing is lost."""
        try:
            yield
        except WriteFailed:
            raise
        except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as a RuntimeError
            if isinstance(exc, OSError):
                reason = exc.strerror or str(exc)
            else:
                free = shutil.disk_usage(self.run_dir).free if self.run_dir.is_dir() else 0
                reason = (f"No space left on device ({free} bytes free)" if free < 16 * 1024 * 1024
                          else f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            raise WriteFailed(f"cannot write {what} in {self.run_dir}: {reason}; the run stopped with round "
                              f"{self._checkpointed} checkpointed (free some space, then resume)") from None

    def run_round(self, rnd: int) -> dict:
        cfg = self.cfg
        start = time.perf_counter()
        sampled = sample_clients(cfg.seed, rnd, cfg.clients.num, cfg.clients.fraction)
        payload = self.algorithm.server_payload(self.server_state, rnd)
        payload_box = [ray.put(payload)]
        jobs = [Job(key=c, method="train", args=({"client": c, "round": rnd}, payload_box, self.states.get(c)),
                    clients=[c], round=rnd) for c in sampled]
        done = self.pool.run(jobs)

        uploads, weights, kept, skipped = [], [], [], []
        for cid in sorted(done):  # client-id order: aggregation never depends on who finished first
            result, state_ref = done[cid]
            if not result["finite"]:
                if cfg.engine.on_nonfinite == "stop":
                    raise RunStopped(f"client {cid} returned a non-finite (NaN/Inf) update in round {rnd}; the run "
                                     f"stopped with round {self.round} checkpointed (engine.on_nonfinite=skip drops "
                                     f"such updates instead)")
                skipped.append(cid)
                continue
            uploads.append(result)
            weights.append(result["num_samples"])
            if result["has_state"]:
                kept.append((cid, state_ref))
        if uploads:
            self.server_state = self.algorithm.server_aggregate(
                [u["upload"] for u in uploads], weights, self.server_state, rnd)
        for cid, ref in kept:
            self.states.put(cid, ref)

        total_w = float(sum(weights)) or 1.0
        metrics: dict[str, Any] = {
            "round": rnd,
            "acc_mean": None,
            "acc_global": None,
            "loss": float(sum(u["loss"] * w for u, w in zip(uploads, weights)) / total_w) if uploads else float("nan"),
            "bytes_up": int(sum(nbytes(u["upload"]) for u in uploads)),
            "bytes_down": int(nbytes(payload) * len(sampled)),
            "clients": len(sampled),
        }
        for part in sorted({k for u in uploads for k in u["parts"]}):
            metrics[f"loss_{part}"] = float(sum(u["parts"].get(part, 0.0) * w for u, w in zip(uploads, weights)) / total_w)
        if skipped:
            metrics["skipped"] = skipped
        client_acc: dict[int, float] = {}
        if rnd % cfg.eval.every == 0 or rnd == cfg.rounds:
            client_acc, pooled = self._evaluate(sampled if cfg.eval.clients == "sampled" else range(cfg.clients.num))
            metrics["acc_mean"] = float(np.mean(list(client_acc.values()))) if client_acc else None
            if self.algorithm.has_global_model:
                metrics["acc_global"] = pooled
        if not self.algorithm.has_global_model:
            metrics.pop("acc_global")
        metrics.update(self.algorithm.on_round_end(rnd, metrics, self.server_state))
        if self.pool.replacements:
            metrics["workers_replaced"] = self.pool.replacements  # cumulative, this invocation
        self.round = rnd
        metrics["wall_s"] = time.perf_counter() - start
        self.totals["bytes_up_total"] += metrics["bytes_up"]
        self.totals["bytes_down_total"] += metrics["bytes_down"]
        self.totals["wall_s_total"] += metrics["wall_s"]
        metrics.update(self.totals)
        with self._writing("metrics.jsonl and TensorBoard's events"):
            self.log.write(metrics, client_acc)
        if rnd % cfg.log.checkpoint_every == 0 or rnd == cfg.rounds:
            with self._writing("the checkpoint"):
                self.checkpoint()
        return metrics

    def _evaluate(self, clients: Any) -> tuple[dict[int, float], Optional[float]]:
        """Personalised test accuracy per client, and the pooled accuracy over all their test samples."""
        clients = [c for c in clients if len(self.data.clients[c].test) > 0]
        payload_box = [ray.put(self.algorithm.eval_payload(self.server_state))]
        n_chunks = max(1, min(len(clients), self.cfg.engine.num_workers * self.cfg.engine.jobs_per_worker))
        chunks = [list(map(int, c)) for c in np.array_split(np.array(clients, dtype=np.int64), n_chunks) if len(c)]
        jobs = [Job(key=i, method="evaluate", args=(chunk, payload_box, [self.states.get(c) for c in chunk]),
                    clients=chunk, round=self.round + 1) for i, chunk in enumerate(chunks)]
        done = self.pool.run(jobs)
        rows = [row for i in sorted(done) for row in done[i]]
        acc = {cid: correct / total for cid, correct, total in rows}
        total = sum(t for _, _, t in rows)
        pooled = sum(c for _, c, _ in rows) / total if total else None
        return acc, pooled

    def checkpoint(self) -> None:
        self.states.save(self.run_dir / "checkpoint", self.round,
                         {"server_state": self.server_state, "totals": dict(self.totals)})
        self._checkpointed = self.round
