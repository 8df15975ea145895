"""Asynchronous aggregation in simulated time: FedAsync and FedBuff, driven by one event queue.

``asynchronous.mode: fedasync | fedbuff`` replaces the synchronous round with a server that never waits for a
cohort. ``concurrency`` clients train at once; when one finishes (in simulated time) its update is applied and
the freed slot starts a new client on the server's newest model:

- **FedAsync** (C. Xie, S. Koyejo, I. Gupta, "Asynchronous Federated Optimization", arXiv:1903.03934, Algorithm 1):
  every arrival is a server step, x ← (1 − α_t)·x + α_t·x_new with α_t = α·s(t − τ), where t − τ is the update's
  staleness (server steps since the client downloaded) and s the paper's constant, polynomial (t − τ + 1)^−a or
  hinge (1 when t − τ ≤ b, else 1/(a(t − τ − b) + 1)) function (:func:`staleness_weight`).
- **FedBuff** (J. Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022,
  arXiv:2106.06639, Algorithm 1): arrivals are buffered; every K-th the server steps
  x ← x + η_g·(1/K)·Σ_i s_i·Δ_i, with Δ_i = y_i − x_{τ_i} the client's change from the model it downloaded and
  s_i = 1/√(1 + staleness) (or 1 without ``staleness_scaling``) (:func:`buffered_target`).

The schedule (:class:`AsyncSchedule`, ``raysim.stages.Schedule``) replaces the synchronous round's: one logical
round is one server step, and the stage's own reduction gives the server step its mean. Either way the server's new
value x̄ goes through the algorithm's own step, ``server_aggregate`` with the round's
mean being x̄: FedAvg, FedProx and UNIDEAL's head averaging take it as the model; the FedOpt family steps its
optimiser towards it (so FedBuff with ``asynchronous.server_lr: 1`` and FedAdam is FedBuff with a server Adam).
Only algorithms whose server step is such a model average (``Algorithm.averages_models``) run here.

**The event queue** (:class:`EventQueue`) orders the jobs in flight by (simulated finish time, client id, job
sequence). A job's duration is known when it starts (``raysim.system.model.SystemModel.duration`` of the real
bytes it downloads and uploads, its training samples times ``train.local_epochs``), so the queue needs no result
to order it. Results are computed lazily: when the earliest job has none yet, every job in flight without one (all
of their inputs, the model version each downloaded, are known) is trained at once, through the driver's one plan
and executor (``RoundRun.train``), concurrently on the workers; results are then applied strictly in queue
order. The numbers depend only on the config and the seed: never on real timing, on ``engine.num_workers``, or on
a worker that died (its calls are re-run with the same inputs).

**Clients.** Each new job (sequence number q) draws its client uniformly among those available at its start time
(``SystemModel.available``) and not already in flight, by a counter hash of (seed, q, attempt)
(``SystemModel.draw_client``); when none is, the slot waits ``system.wait_s`` and draws again. A job trains with
``job_seed(seed, client, round, ASYNC_STREAM, q)``, where its round (``ctx.round``) is the server step its update
aims at (the downloaded version + 1). A job that drops (``SystemModel.dropped(client, q)``), whose client leaves
mid-job (``system.availability.whole_job``) or that would report after ``system.report_timeout_s`` never reports
and is not trained; its slot is freed at the report timeout, or without one at its finish time
(:func:`raysim.system.presence.job_fate`). Without ``system.enabled``, every client has the system section's
default traits (100 samples/s, 1.25 MB/s down, 0.625 MB/s up, 50 ms latency: a job takes 0.05 s + its bytes over
those bandwidths + samples x epochs / 100), is always available and never drops.

**Rounds.** One server step is one logical round: ``metrics.jsonl`` gets one row per step with the usual keys
(``clients``: the updates applied, ``bytes_down``: the downloads of the jobs started since the last step,
``bytes_up``: the applied uploads), ``sim_time_s`` (with the totals, as synchronous rounds log it with
``system.enabled``), ``round_sim_s``, ``staleness_mean``, ``staleness_max`` and ``dropouts`` (the jobs that dropped
since the last step; with ``whole_job``, ``dropouts_left`` of them left mid-job; with a report timeout, ``late``:
the jobs it cut off). The checkpoint after a step holds the queue (every job in flight or waiting, with its times,
client and the server version it downloaded) and names the file of each of those versions' payloads (written once
each, ``checkpoint/versions/``, with its sha256; the newest, the step's own model, is the payload of the server
state it holds, its file written while the next step trains), so ``--resume`` re-trains the jobs in flight from
exactly what they downloaded and continues with the metrics of a run that was never interrupted.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from raysim.algorithms.aggregation import UploadSum, flatten, layout_of, unflatten
from raysim.engine.events import EventQueue, Flight, Wait
from raysim.engine.jobs import TrainResult
from raysim.engine.state import VERSIONS_DIR, safe_load, save_all_durably, server_file, version_file
from raysim.errors import UserError
from raysim.seeds import ASYNC_STREAM
from raysim.stages import Reports, RoundContext, RoundRun, Schedule
from raysim.sections.system import SystemConfig
from raysim.system.clock import check_availability
from raysim.system.model import SystemModel
from raysim.system.presence import DROPPED, LATE, LEFT, job_fate
from raysim.system.stage import check_system_run
from raysim.trees import copy_tree, nbytes

MAX_WAITS = 100_000  # a slot that found no available client this many times in a row stops the run
MAX_SILENT = 10_000  # this many jobs in a row that never report stop the run (raysim.system.presence refuses,
# before round 1, a run whose clients would finish a job with a chance below ONOFF_NEVER)


# ---------------------------------------------------------------------------------------------- the math
def staleness_weight(kind: str, staleness: int, a: float, b: float) -> float:
    """FedAsync's s(t − τ): ``constant`` 1, ``polynomial`` (t − τ + 1)^−a, ``hinge`` 1 if t − τ ≤ b else
    1/(a(t − τ − b) + 1)."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((staleness + 1.0) ** (-a))
    return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)


def buffer_weight(staleness: int, scaling: bool) -> float:
    """FedBuff's staleness scaling of one buffered update: 1/√(1 + staleness) (1 when off)."""
    return 1.0 / math.sqrt(1.0 + staleness) if scaling else 1.0


def mix(x: dict, new: dict, alpha: float) -> dict:
    """FedAsync's x̄ = (1 − α)·x + α·x_new: the one sum (:class:`UploadSum`) of x weighted 1 − α and x_new weighted
    α, in float64, cast back to each tensor's dtype (integers rounded)."""
    total = UploadSum()
    total.add(0, x, 1.0 - alpha)
    try:
        total.add(1, new, alpha)
    except ValueError:
        raise ValueError("an asynchronous update's keys, shapes or dtypes differ from the server model's") from None
    return total.sum()


def buffered_target(x: dict, buffered: list[tuple[dict, dict, float]], server_lr: float, size: int) -> dict:
    """FedBuff's x̄ = x + η_g·(1/K)·Σ_i w_i·(y_i − x_{τ_i}) over ``buffered`` (upload y_i, the model x_{τ_i} it
    started from, weight w_i), K = ``size``: the one sum (:class:`UploadSum`) of the changes y_i − x_{τ_i}, each
    weighted w_i, in arrival order and in float64; its mean Σ / Σ w scaled by η_g·Σ w / K and added to x in float64,
    cast back to each tensor's dtype. Each start model (few: the buffered jobs share few versions) is flattened
    once."""
    layout, x64 = flatten(x)
    total = UploadSum()
    starts: dict[int, torch.Tensor] = {}
    for i, (upload, start, weight) in enumerate(buffered):
        if id(start) not in starts:
            start_layout, starts[id(start)] = flatten(start)
            if start_layout != layout:
                raise ValueError("an asynchronous update's keys, shapes or dtypes differ from the server model's")
        if layout_of(upload) != layout:
            raise ValueError("an asynchronous update's keys, shapes or dtypes differ from the server model's")
        total.add(i, upload, weight, origin=starts[id(start)])
    if not total.clients or total.weight == 0:
        return unflatten(layout, x64)
    _, mean = flatten(total.mean(in_float64=True))
    return unflatten(layout, x64 + mean * (server_lr * total.weight / size))


@dataclass
class Version:
    """A server model version that jobs in flight downloaded: its payload's handle, the payload (for FedBuff's
    Δ = y − x_τ and the checkpoint), its bytes, and the bytes of its model's shared entries (a job's upload)."""

    ref: Any
    payload: dict
    bytes: int = field(init=False)
    model_bytes: int = field(init=False)

    def __post_init__(self) -> None:  # counted once a version, not once a job
        self.bytes = nbytes(self.payload)
        self.model_bytes = nbytes(self.payload.get("model", {}))


# ---------------------------------------------------------------------------------------------- the schedule
class AsyncSchedule(Schedule):
    """The event queue as the run's schedule: one server step per round, from the arrivals in simulated-time order,
    trained through the one plan (see the module docstring)."""

    name = "asynchronous"
    summable = False  # every arrival's upload is its own term
    changes_state_in_training = True  # the queue changes as the step's events are processed

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.mode = cfg.asynchronous
        self.concurrency = self.mode.concurrency or cfg.clients.per_round
        self.system: Any = None
        self.wait_s = float(cfg.system.wait_s)
        self.queue = EventQueue()
        self.sim_time = 0.0
        self.last_step_time = 0.0
        self.next_seq = 1
        self.pending_down = 0  # bytes downloaded by the jobs started since the last server step
        self.pending_dropped = 0  # jobs that dropped since the last server step
        self.pending_left = self.pending_late = 0  # of them, those whose client left; jobs cut off by the timeout
        self.silent = 0  # jobs in a row that never reported
        self.version = 0  # the server's newest model: steps so far
        self.versions: dict[int, Version] = {}
        self._version_files: dict[int, tuple[str, str]] = {}  # version -> (its file, sha256), written once each
        self._derived: Optional[int] = None  # the newest version, when server.pt's server state gives it (no file)
        self._pending: Optional[tuple[int, Future, Path]] = None  # that version's file, being written meanwhile
        self._writer: Optional[ThreadPoolExecutor] = None
        self.results: dict[int, tuple[TrainResult, Any]] = {}  # job sequence -> its computed (result, state handle)
        self.buffer: list[tuple[Flight, TrainResult]] = []  # FedBuff's arrivals since the last step

    def prepare(self) -> None:
        cfg = self.cfg
        self.system = SystemModel(cfg.system if cfg.system.enabled else SystemConfig(), cfg.seed, cfg.clients.num)
        check_availability(self.system)  # a run no client can ever join: one line now, not minutes of waits

    def check(self, setup: Any) -> None:
        """Before round 1 (raysim.system.stage.check_system_run): FLOPs per sample where speeds are in FLOP/s;
        simulated time the clock cannot count, and a run in which no job could ever report, refused in one line."""
        check_system_run(self.system, self.cfg, setup)


    # ------------------------------------------------------------------ jobs
    def _current_version(self, run: RoundRun) -> Version:
        """The payload of the server's newest model, put once."""
        return self.versions[self.version] if self.version in self.versions else self._make_version(self.version, run)

    def _make_version(self, v: int, run: RoundRun) -> Version:
        """Version ``v`` from the server state as it is now (after step ``v``): its payload, copied and put."""
        shared = copy_tree(run.payload(v + 1))
        self.versions[v] = Version(run.put(shared), shared)
        return self.versions[v]

    def _start_job(self, t: float, run: RoundRun, seq: Optional[int] = None, attempt: int = 0) -> None:
        """Start job ``seq`` (a new one when None) at simulated time ``t`` on the newest model, or let its slot
        wait ``system.wait_s`` when no client can take it."""
        if seq is None:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
        client = self.system.draw_client((seq, attempt), t, self.queue.busy())
        if client is None:
            self.queue.push(Wait(seq, t + self.wait_s, attempt + 1))
            return
        version = self._current_version(run)
        down, up = version.bytes, version.model_bytes  # the upload: the model's shared entries
        samples = run.data.num_train(client) * self.cfg.train.local_epochs
        finish, why = job_fate(self.system, client, seq, t, self.system.duration(client, down, up, samples),
                               self.system.cfg.report_timeout_s)
        self.queue.push(Flight(seq, client, t, finish, self.version, down, up, why))
        self.pending_down += down

    def _train_in_flight(self, run: RoundRun) -> None:
        """Train every job in flight that has no result yet, at once (their downloads are all known)."""
        todo = [f for f in self.queue.flights() if not f.dropped and f.seq not in self.results]
        jobs = [run.job(f.client, f.version + 1, self.versions[f.version].ref, stream=(ASYNC_STREAM, f.seq))
                for f in todo]
        done, _ = run.train(jobs, False)
        for f in todo:
            result, state_ref = done[f.client]
            if result.upload_bytes != f.bytes_up:
                raise UserError(f"algorithm {self.cfg.algorithm.name} declares its server step a model average "
                                f"(averages_models), but client {f.client} uploaded {result.upload_bytes} bytes, not "
                                f"the {f.bytes_up} bytes of the shared model it downloaded")
            self.results[f.seq] = (result, state_ref)

    # ------------------------------------------------------------------ the logical round
    def run_round(self, rnd: int, run: RoundRun) -> Reports:
        """Events in simulated-time order up to the next server step: its arrivals."""
        self.version = rnd - 1
        if not len(self.queue):
            for _ in range(self.concurrency):
                self._start_job(self.sim_time, run)
        wanted = 1 if self.mode.mode == "fedasync" else self.mode.buffer_size
        skipped: list[int] = []
        while len(self.buffer) < wanted:
            head = self.queue.peek()
            if isinstance(head, Flight) and not head.dropped and head.seq not in self.results:
                self._train_in_flight(run)
            event = self.queue.pop()
            if isinstance(event, Wait):
                if event.attempt > MAX_WAITS:
                    raise UserError(f"no client was available to train for {event.attempt} waits of system.wait_s="
                                    f"{self.wait_s:g} simulated seconds (check system.availability)")
                self.sim_time = event.time
                self._start_job(event.time, run, event.seq, event.attempt)
                continue
            self.sim_time = event.finish
            if event.dropped:
                self._count_silent(event.dropped)
            else:
                self.silent = 0
                finished, bad = run.collect({event.client: self.results.pop(event.seq)}, rnd)
                skipped += bad
                self.buffer += [(event, r) for r in finished]
            if len(self.buffer) < wanted:
                self._start_job(self.sim_time, run)
        arrivals, self.buffer = self.buffer, []
        staleness = [self.version - f.version for f, _ in arrivals]
        metrics = {"round_sim_s": self.sim_time - self.last_step_time, "staleness_mean": float(np.mean(staleness)),
                   "staleness_max": int(max(staleness)), "dropouts": self.pending_dropped}
        if self.system.cfg.availability.whole_job:
            metrics["dropouts_left"] = self.pending_left
        if self.system.cfg.report_timeout_s is not None:
            metrics["late"] = self.pending_late
        # (the arrivals downloaded different versions: no one shared payload; the stages that read it, DP-FedAvg's,
        # refuse the asynchronous modes)
        return Reports([r for _, r in arrivals], skipped, [f.client for f, _ in arrivals], self.pending_down, {},
                       None, metrics, totals={"sim_time_s": self.sim_time},
                       meta={"arrivals": arrivals, "staleness": staleness})

    def _count_silent(self, why: int) -> None:
        """A job that never reported (``why``: its cause); this many in a row end the run in one line."""
        self.pending_dropped += why in (DROPPED, LEFT)
        self.pending_left += why == LEFT
        self.pending_late += why == LATE
        self.silent += 1
        if self.silent > MAX_SILENT:
            raise UserError(f"no job reported in {MAX_SILENT} jobs in a row (they dropped out, left mid-job or "
                            f"passed system.report_timeout_s): check system.availability, system.dropout and "
                            f"system.report_timeout_s")

    def reduce(self, ctx: RoundContext) -> Optional[Callable[[], dict]]:
        """The server's new model before the algorithm's step: FedAsync's mix or FedBuff's buffered step."""
        target = self._target(ctx.server_state["model"], ctx.meta["arrivals"], ctx.meta["staleness"])
        return lambda: target

    def _target(self, x: dict, arrivals: list[tuple[Flight, TrainResult]], staleness: list[int]) -> dict:
        m = self.mode
        if m.mode == "fedasync":
            (_, result), = arrivals
            alpha = m.alpha * staleness_weight(m.staleness, staleness[0], float(m.a), m.b)
            return mix(x, result.upload, alpha)
        buffered = [(r.upload, self.versions[f.version].payload["model"], buffer_weight(s, m.staleness_scaling))
                    for (f, r), s in zip(arrivals, staleness)]
        return buffered_target(x, buffered, m.server_lr, m.buffer_size)

    def end_round(self, rnd: int, run: RoundRun) -> None:
        """The new model is version ``rnd``: the freed slot downloads it; versions no job holds any more go."""
        self.last_step_time, self.pending_down, self.pending_dropped = self.sim_time, 0, 0
        self.pending_left = self.pending_late = 0
        self.version = rnd
        self._start_job(self.sim_time, run)
        live = {f.version for f in self.queue.flights()}
        self.versions = {v: p for v, p in self.versions.items() if v in live}

    # ------------------------------------------------------------------ checkpoint
    def save(self, ckpt_dir: Path) -> dict:
        """A version never changes, so each is written once, to ``checkpoint/versions/vVERSION.pt``, before a
        ``server.pt`` names it with its sha256.

        The newest version, the server's model at this step, is the payload of the server state this checkpoint
        holds (``server_payload``, a function of that state, as a synchronous resume's next round relies on): this
        ``server.pt`` names it ``derived``, and its file is written in a thread while the next step trains, to be
        named by the next checkpoint if a job still holds it. (Written here instead, before ``server.pt``, its
        fsync and serialisation were ~1.9 ms of a 100-client step.) Returns the queue, the files of the versions its
        jobs downloaded, and which version the server state gives (the buffer is empty after every server step)."""
        self._settle_pending()
        newest = self.version if self.version in self.versions and self.version not in self._version_files else None
        new = [v for v in sorted(self.versions) if v not in self._version_files and v != newest]
        if new:
            sums = save_all_durably([(self.versions[v].payload, version_file(ckpt_dir, v)) for v in new])
            self._version_files.update({v: (version_file(ckpt_dir, v).name, sums[version_file(ckpt_dir, v).name])
                                        for v in new})
        self._derived = newest
        return {"asynchronous": {"sim_time": self.sim_time, "last_step_time": self.last_step_time,
                                 "next_seq": self.next_seq, "pending_down": self.pending_down,
                                 "pending_dropped": self.pending_dropped, "pending_left": self.pending_left,
                                 "pending_late": self.pending_late, "queue": self.queue.record(),
                                 "versions": {v: list(self._version_files[v]) for v in sorted(self.versions)
                                              if v in self._version_files},
                                 "derived": self._derived}}

    def saved(self, ckpt_dir: Path, final: bool) -> None:
        """Delete the files of versions no job holds any more; start writing the newest one's."""
        for v in [v for v in self._version_files if v not in self.versions]:
            version_file(ckpt_dir, v).unlink(missing_ok=True)
            del self._version_files[v]
        newest = self._derived
        if newest is not None and not final:
            self._writer = self._writer or ThreadPoolExecutor(1, thread_name_prefix="raysim-versions")
            self._pending = (newest, self._writer.submit(save_all_durably, [(self.versions[newest].payload,
                                                                             version_file(ckpt_dir, newest))]),
                             ckpt_dir)

    def _settle_pending(self) -> None:
        """Wait for the version file being written (its error, a full disk, is this checkpoint's) and record it."""
        if self._pending is None:
            return
        v, future, ckpt_dir = self._pending
        self._pending = None
        name = version_file(ckpt_dir, v).name
        self._version_files[v] = (name, future.result()[name])

    def close(self) -> None:
        """A version file written for a checkpoint that never came is removed (a run stopped after a checkpoint
        leaves only what its ``server.pt`` names)."""
        if self._pending is not None:
            v, future, ckpt_dir = self._pending
            self._pending = None
            try:
                future.result()
            except Exception:  # noqa: BLE001 - nothing names this file: its failure matters to no checkpoint (and
                pass  # the run's own error, if it is ending on one, is the one to report)
            version_file(ckpt_dir, v).unlink(missing_ok=True)
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None

    def restore(self, ckpt: dict, ckpt_dir: Path, run: RoundRun) -> None:
        record = ckpt.get("asynchronous")
        if record is None:
            raise UserError(f"{ckpt_dir.parent}: its checkpoint was made by synchronous rounds, so it cannot resume "
                            f"with asynchronous.mode={self.mode.mode}")
        self.version = int(ckpt["round"])
        try:
            self._restore_record(record, ckpt_dir, run)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise UserError(f"{server_file(ckpt_dir.parent)}: its asynchronous record (the event queue, the server "
                            f"versions) is malformed ({type(exc).__name__}: {exc}): the checkpoint is "
                            f"damaged") from None

    def _restore_record(self, record: dict, ckpt: Path, run: RoundRun) -> None:
        self.sim_time, self.last_step_time = float(record["sim_time"]), float(record["last_step_time"])
        self.next_seq, self.pending_down = int(record["next_seq"]), int(record["pending_down"])
        self.pending_dropped = int(record["pending_dropped"])
        self.pending_left, self.pending_late = int(record.get("pending_left", 0)), int(record.get("pending_late", 0))
        self.queue = EventQueue.from_record(record["queue"])
        for v, entry in record["versions"].items():
            if isinstance(entry, dict):  # a checkpoint of raysim before version files: the payload itself
                payload = entry
            else:
                name, digest = entry
                if name != version_file(ckpt, int(v)).name:
                    raise UserError(f"{server_file(ckpt.parent)} names {name!r} for server version {v}, not "
                                    f"{version_file(ckpt, int(v)).name!r}: the checkpoint is damaged")
                payload = safe_load(version_file(ckpt, int(v)), digest)
                self._version_files[int(v)] = (name, digest)
            self.versions[int(v)] = Version(run.put(payload), payload)
        derived = record.get("derived")  # None in a checkpoint of raysim before derived versions
        if derived is not None:
            self._make_version(int(derived), run)  # as it was made after its step, from the restored server state
        folder = ckpt / VERSIONS_DIR
        if folder.is_dir():  # files of a run stopped between writing a version and the server.pt naming it
            named = {name for name, _ in self._version_files.values()}
            for f in folder.iterdir():
                if f.name not in named:
                    f.unlink(missing_ok=True)
