"""The driver: the one round loop of raysim.

Each round: the schedule trains its clients and gathers their reports -> the reduction and the algorithm's server
step -> metrics -> evaluation -> ``on_round_end`` -> log -> checkpoint. The round's features are stages
(``raysim.stages``: privacy, attacks, robust rules, the simulated clock, FedAsync/FedBuff), built from the config
and taking part at declared points; no step here tests for a feature. ``run()`` yields each round's metrics, so the
CLI prints progress and a Tune trial reports every round. The driver lives in the process that launched the run
(the CLI, a notebook, a Tune trial), on the node that holds the run directory; its jobs run on a pool of Ray worker
actors (``engine.backend=ray``) or in the same process (``inline``): see ``raysim.engine.executor``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch

from raysim.algorithms.base import ClientUpdate, RoundUpdates, SummedUpload
from raysim.algorithms.central import reserved_jobs
from raysim.config import to_flat_dict
from raysim.data import build_federated_data
from raysim.engine.checkpointing import restore_checkpoint, save_checkpoint
from raysim.engine.evaluation import Evaluation
from raysim.engine.executor import Executor, InlineExecutor, RayExecutor
from raysim.engine.jobs import CallResult, CentralCall, ProbeCall, ServerCall, ServerTrainJob, TrainJob, TrainResult
from raysim.engine.plan import RoundSum, clients_per_call, group_size, plan_round
from raysim.engine.reduction import round_mean
from raysim.engine.sampling import draw_clients
from raysim.engine.state import ClientHistoryStore, ClientStateStore, has_checkpoint
from raysim.engine.vectorize_probe import run_stack_size
from raysim.errors import OutOfMemory, RunStopped
from raysim.fsutil import WriteFailed, run_dir_write, run_stopped
from raysim.models import build_model
from raysim.registry import get_algorithm, import_plugins
from raysim.runlog import RunLog
from raysim.stages import Downloads, Reports, RoundContext, StageSetup, build_stages
from raysim.trees import all_finite, detached_cpu, nbytes

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


class Driver:
    """The round loop, in the launching process; its jobs run in that process too (``inline=True``) or on Ray
    worker actors (the workers the runner created, in ``placement_group`` for a Tune trial)."""

    def __init__(self, cfg: ExperimentConfig, run_dir: str, resume: bool, placement_group: Any = None, *,
                 inline: bool = False, device: str = "cpu", workers: Optional[list[Any]] = None):
        self._stop = threading.Event()
        self._placement_group = placement_group
        self._changing = False  # True between a round's first change of state and its end (see run())
        self.executor: Executor = InlineExecutor(cfg, device) if inline else RayExecutor(cfg, placement_group)
        try:
            self._setup(cfg, run_dir, resume, workers)
        except BaseException:
            self.shutdown()  # the replacements a central job's pool made, too
            raise

    def _setup(self, cfg: ExperimentConfig, run_dir: str, resume: bool, workers: Optional[list[Any]]) -> None:
        """Everything before round 1. The driver uses no GPU: central training in ``prepare_data`` (FAPD's teacher,
        FedPCL's stand-ins) runs as a job on the executor, on a worker's reserved share (raysim.algorithms.central)."""
        torch.set_num_threads(1)
        import_plugins(cfg.plugins)
        self.cfg = cfg
        self._config_record = to_flat_dict(cfg)  # what every checkpoint records it was made with (resume checks it)
        self.run_dir = Path(run_dir)
        self.algorithm = get_algorithm(cfg.algorithm.name)(cfg)
        self.stages = build_stages(cfg)  # after the plugins, whose stages register on import
        for stage in self.stages:  # before any worker starts: an unreachable target ε is one line at once
            stage.prepare()
        self.schedule = self.stages.schedule
        self.executor.start(workers)  # under Ray: the runner's workers (created when None), data to come
        with reserved_jobs(lambda train: self.executor.run([CentralCall(train)])[0]):
            self.data = self.algorithm.prepare_data(build_federated_data(cfg))
        self.algorithm.check(cfg, self.data)
        initial = build_model(cfg, cfg.model.for_client(0), self.data.input_shape(0), self.data.num_classes, 0,
                              self.algorithm)
        setup = StageSetup(self.data, initial.state_dict(), self.algorithm, cfg.clients.per_round)
        for stage in self.stages:
            stage.check(setup)
        self.executor.attach(self.data)
        self.states = ClientStateStore(self.executor)
        self.history = ClientHistoryStore(self.algorithm.server_history, self.executor)  # server_keep's window
        self.evaluation = Evaluation(cfg, self.executor, self.algorithm, self.data, self.states.get, self.downloads)
        self.totals: dict[str, Any] = {"bytes_up_total": 0, "bytes_down_total": 0, "wall_s_total": 0.0}
        self.round = 0
        self._client_s: Optional[float] = None  # running mean of one client update's time (calls' sizes)
        self._checkpointed = 0  # the round of the checkpoint on disk
        self.server_state = self.algorithm.init_server_state(initial.state_dict())
        # engine.vectorize: clients per stack (1: one at a time; None: auto, chosen by a probe at the first round)
        self.stack_size, self.vectorize_why = run_stack_size(cfg, self.algorithm, initial, self.stages)
        if resume:
            restored = restore_checkpoint(self.run_dir, self.states, self.history, self.stages, self)
            self.round = self._checkpointed = restored.round
            if self.stack_size is None and restored.vectorize:
                self.stack_size = restored.vectorize  # auto's choice stands for the whole run
                self.vectorize_why = "the probe's choice, kept in the checkpoint"
            self.server_state = restored.server_state
            self.totals.update(restored.totals)
        with self._writing("metrics.jsonl"):
            self.log = RunLog(self.run_dir, tensorboard=cfg.log.tensorboard, per_client_max=cfg.log.per_client_max,
                              resume_round=self.round if resume else 0)
        if cfg.log.tensorboard:  # HParams and the custom-scalars page, for every run (again on resume: rounds may grow)
            from raysim.tboard import write_run_header

            with self._writing("TensorBoard's events"):
                write_run_header(self.run_dir, cfg, self.algorithm.tensorboard_charts)

    # ------------------------------------------------------------------ control (callable while run() streams)
    def start(self) -> int:
        """The round the run continues after (the executor got its workers and the data while the driver was made)."""
        return self.round

    def worker_info(self) -> list[dict]:
        return self.executor.info()

    def footprint(self) -> dict[str, int]:
        """Sizes of the driver's per-client bookkeeping, which must follow the clients that were sampled or hold
        state, never ``clients.num``: state references, kept history, the fixed evaluation clients, the pickled
        dataset."""
        import pickle

        fixed = self.evaluation.fixed
        return {"client_states": len(self.states), "history_clients": len(self.history.index()),
                "eval_clients": len(fixed) if fixed is not None else 0,
                "data_bytes": len(pickle.dumps(self.data, protocol=5))}

    def progress(self) -> tuple[int, int, int, str]:
        """(round in progress, jobs done, jobs in this phase, "train" | "evaluate"): for a live progress line."""
        executor = getattr(self, "executor", None)
        done, total, kind = executor.progress if executor is not None else (0, 0, "")
        return self.round + 1, done, total, kind

    def shutdown(self) -> None:
        """Release the workers now (an interrupted ``run()`` generator may never reach its ``finally``)."""
        self._stop.set()
        schedule = getattr(self, "schedule", None)
        if schedule is not None:
            schedule.close()
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown()

    def request_stop(self) -> None:
        """Finish the current round, checkpoint, and end ``run()`` (Ctrl-C)."""
        self._stop.set()

    # ------------------------------------------------------------------ the round loop
    def run(self) -> Iterator[dict]:
        self.start()  # a no-op once the runner has called it
        try:
            while self.round < self.cfg.rounds and not self._stop.is_set():
                if self.stages.stop_before(self.round + 1):  # a stage ends the run (a spent privacy budget)
                    self._stop.set()
                    break
                yield self.run_round(self.round + 1)
            if self.round > self._checkpointed:  # stopped early (Ctrl-C, SIGTERM) between log.checkpoint_every
                with self._writing("the checkpoint"):
                    self.checkpoint()
        except RunStopped as exc:
            # the last complete round, whatever log.checkpoint_every says; and after running out of memory before any
            # round completed, round 0, so that the run resumes with a smaller share instead of being removed. Never
            # once this round has begun to change the server's or the clients' state: that state is no round's.
            due = self.round > self._checkpointed or (isinstance(exc, OutOfMemory) and not has_checkpoint(self.run_dir))
            if not isinstance(exc, WriteFailed) and not self._changing and due:
                with self._writing("the checkpoint"):
                    self.checkpoint()
            raise
        finally:
            failing = sys.exc_info()[1] is not None
            self.schedule.close()
            try:
                with self._writing("metrics.jsonl and TensorBoard's events"):
                    self.log.close()
            except WriteFailed:
                if not failing:  # else the first error is the one to report
                    raise
            finally:  # a run that ended: no call in flight, so its workers may serve the next (warm_workers)
                self.executor.shutdown(keep_workers=not failing)

    def _writing(self, what: str) -> contextlib.AbstractContextManager:
        """A failed write to the run directory stops the run in one line (:func:`raysim.fsutil.run_dir_write`)."""
        return run_dir_write(self.run_dir, what, self._checkpointed)

    def run_round(self, rnd: int) -> dict:
        """One round, as named steps."""
        start = time.perf_counter()
        self._changing = self.schedule.changes_state_in_training
        reports = self.schedule.run_round(rnd, self)  # who trained and reported, through the one plan
        if reports.skipped and not reports.finished:
            raise RunStopped(f"every client of round {rnd} ({len(reports.skipped)}) returned a non-finite (NaN/Inf) "
                             f"update, so the round had nothing to aggregate and the run stopped (lower train.lr)")
        self._changing = True  # until the round is finished, the state held here is neither this round's nor the last
        ctx = self._round_context(rnd, reports)
        self._keep_history(ctx.updates, rnd)
        self._server_step(ctx)
        metrics = self._round_metrics(ctx, reports)
        client_counts = self.evaluation.after_round(rnd, reports.clients, self.server_state, self.stages, metrics)
        metrics.update(self.algorithm.on_round_end(rnd, metrics, self.server_state))
        self.schedule.end_round(rnd, self)
        self._finish_round(rnd, metrics, reports, client_counts, start)
        return metrics

    # ------------------------------------------------------------------ what the driver lends the schedule
    def put(self, obj: Any) -> Any:
        return self.executor.put(obj)

    def payload(self, rnd: int) -> dict:
        """What every client of round ``rnd`` downloads, as the stages send it (``rnd`` <= 0: the evaluation's)."""
        if rnd > 0:
            return self.stages.download(self.algorithm.server_payload(self.server_state, rnd), rnd)
        return self.algorithm.eval_payload(self.server_state)

    def downloads(self, clients: list[int], rnd: int) -> Downloads:
        """The shared payload, put once, and each client's own payload (``client_payload``, only where the algorithm
        sends one), with their bytes: the shared payload counted once per client, a client's own for that client."""
        shared = self.payload(rnd)
        own: dict[int, Any] = {}
        own_bytes: dict[int, int] = {}
        for cid in clients:
            personal = self.algorithm.client_payload(self.server_state, cid, rnd)
            if personal is not None:
                own[cid] = self.executor.put(personal)
                own_bytes[cid] = self._wire(nbytes(personal), rnd)
        shared_bytes = self._wire(nbytes(shared), rnd)
        return Downloads(shared, self.executor.put(shared), own, shared_bytes, own_bytes,
                         int(shared_bytes * len(clients) + sum(own_bytes.values())))

    def _wire(self, n: int, rnd: int) -> int:
        """The bytes a payload of ``n`` tensor bytes takes on the wire (the stages'; evaluation's is not sent)."""
        return self.stages.download_bytes(n, rnd) if rnd > 0 else n

    def sample(self, rnd: int, count: int) -> list[int]:
        return draw_clients(self.cfg.seed, rnd, self.cfg.clients.num, count)

    def job(self, client: int, rnd: int, payload_ref: Any, own_ref: Any = None, stream: tuple[int, ...] = (),
            params: Optional[dict] = None) -> TrainJob:
        stage = {**self.stages.job_params(rnd), **(params or {})}
        return TrainJob(client_id=client, round=rnd, payload_ref=payload_ref, own_payload_ref=own_ref, stream=stream,
                        stage=stage, alone=self.stages.trains_alone(stage))

    def train(self, jobs: list[TrainJob], summable: bool) -> tuple[dict[int, Any], Any]:
        """Run training ``jobs`` (distinct clients) as the plan cuts them, one plan per round's payload (the
        asynchronous modes train jobs of several server versions at once); returns ({client: (TrainResult, state
        handle)}, the round's upload sum (:class:`~raysim.engine.plan.RoundSum`: the groups' sums added in group
        order as their calls come in), or None where the uploads travel one by one: the algorithm needs each
        (``sums_uploads``), the schedule does, or a stage does, or ``engine.partial_sums`` is off."""
        group = group_size(self.cfg.engine.sum_group, len(jobs)) if self.algorithm.sums_uploads else 0
        summed = self.cfg.engine.partial_sums and group > 0 and summable and not self.stages.needs_every_upload
        sum_group = group if summed else 0
        states = [self.states.get(j.client_id) for j in jobs]
        if self.stack_size is None and jobs:  # engine.vectorize=auto: a probe on this round's clients, once a run
            self.stack_size, _ = self.executor.run([ProbeCall(jobs=jobs, states=states)])[0]
            self.vectorize_why = f"chosen by a probe in round {jobs[0].round}; it stands for the whole run"
        per_call = clients_per_call(self.cfg.engine.clients_per_call, self._client_s, len(jobs),
                                    self.executor.slots)
        weighting = self.stages.weighting(self.algorithm.sum_weighting)
        calls = []
        for rnd in sorted({j.round for j in jobs}):
            members = [i for i, j in enumerate(jobs) if j.round == rnd]
            calls += plan_round([jobs[i] for i in members], [states[i] for i in members], sum_group=sum_group,
                                stack=self.stack_size, per_call=per_call, workers=self.executor.workers,
                                weighting=weighting)
        done: dict[int, Any] = {}
        total = RoundSum(calls) if sum_group > 0 else None
        outputs = self.executor.run(calls, total.add if total is not None else None)
        for result, state_refs in outputs:
            assert isinstance(result, CallResult)
            done.update((r.client_id, (r, ref)) for r, ref in zip(result.results, state_refs))
            if result.seconds > 0:
                self._client_s = result.seconds if self._client_s is None else \
                    0.7 * self._client_s + 0.3 * result.seconds
        return done, (total.total() if total is not None else None)

    def collect(self, done: dict[int, Any], rnd: int) -> tuple[list[TrainResult], list[int]]:
        """The finite results in client-id order (so aggregation never depends on who finished first), their new
        states kept (once every result was checked: a run stopped here has changed no client's state), and the
        clients whose non-finite update was skipped."""
        finished, skipped = [], []
        for cid in sorted(done):
            result, _ = done[cid]
            if not result.finite:
                if self.cfg.engine.on_nonfinite == "stop":
                    raise RunStopped(f"client {cid} returned a non-finite (NaN/Inf) update in round {rnd}; "
                                     f"{run_stopped(self.round)} (engine.on_nonfinite=skip drops such updates "
                                     f"instead)")
                skipped.append(cid)
                continue
            finished.append(result)
        for result in finished:
            if result.has_state:
                self.states.put(result.client_id, done[result.client_id][1])
        return finished, skipped

    # ------------------------------------------------------------------ the round's steps
    def _round_context(self, rnd: int, reports: Reports) -> RoundContext:
        summed = reports.total is not None
        updates = [ClientUpdate(client_id=r.client_id, upload=SummedUpload() if summed else r.upload,
                                num_samples=r.num_samples, loss=r.loss) for r in reports.finished]
        return RoundContext(round=rnd, updates=updates, total=reports.total, clients=reports.clients,
                            server_state=self.server_state, shared=reports.shared,
                            weighting=self.stages.weighting(self.algorithm.sum_weighting),
                            sum_group=group_size(self.cfg.engine.sum_group, len(reports.clients)), stages=self.stages,
                            meta=reports.meta, on_nonfinite=self.cfg.engine.on_nonfinite, skipped=reports.skipped,
                            abandoned=reports.abandoned)

    def _keep_history(self, updates: list[ClientUpdate], rnd: int) -> None:
        """What the server keeps of each finite update (``server_keep``), into the bounded per-client window."""
        if self.algorithm.server_history < 1:
            return
        for u in updates:
            kept = self.algorithm.server_keep(u, rnd)
            if kept is not None:
                self.history.push(u.client_id, rnd, self.executor.put(kept))

    def _server_step(self, ctx: RoundContext) -> None:
        """The algorithm's ``server_aggregate`` on the round's updates and their mean (``raysim.engine.reduction``),
        then its ``server_train`` (if any) on a worker; a mean released with no reports (DP noise) still moves
        the model. A server model that is no longer finite stops the run. An abandoned round changes nothing."""
        if ctx.abandoned:
            return
        mean, released = round_mean(self.stages, ctx)
        alg, rnd = self.algorithm, ctx.round
        if ctx.updates:
            self.server_state = detached_cpu(alg.server_aggregate(RoundUpdates(ctx.updates, mean), self.server_state,
                                                                  rnd))
            if alg.trains_on_server:
                put = self.executor.put
                work = ServerTrainJob(round=rnd, state_ref=put(self.server_state), updates_ref=put(list(ctx.updates)),
                                      history_refs={u.client_id: self.history.refs(u.client_id) for u in ctx.updates
                                                    if self.history.refs(u.client_id)})
                self.server_state = self.executor.run([ServerCall(work)])[0]
        elif released is not None:
            self.server_state = detached_cpu(alg.server_aggregate_mean(released, self.server_state, rnd))
        if not all_finite(self.server_state):
            raise RunStopped(f"round {rnd}'s server step gave a non-finite (NaN/Inf) server model, so the run stopped "
                             f"(lower train.lr, or choose a robust aggregator.name against an attack)")

    def _round_metrics(self, ctx: RoundContext, reports: Reports) -> dict[str, Any]:
        results = reports.finished
        weights = [r.num_samples for r in results]
        total_w = float(sum(weights)) or 1.0
        metrics: dict[str, Any] = {
            "round": ctx.round,
            "acc_mean": None,
            "acc_global": None,
            "acc_weighted": None,
            "loss": float(sum(r.loss * w for r, w in zip(results, weights)) / total_w) if results else float("nan"),
            "bytes_up": int(sum(r.upload_bytes for r in results)),
            "bytes_down": reports.bytes_down,
            "clients": len(reports.clients),
        }
        for part in sorted({k for r in results for k in r.parts}):
            metrics[f"loss_{part}"] = float(sum(r.parts.get(part, 0.0) * w for r, w in zip(results, weights)) / total_w)
        if reports.skipped:
            metrics["skipped"] = reports.skipped
        if not self.algorithm.has_global_model:
            metrics.pop("acc_global")
        for stage in self.stages:
            if stage is not self.schedule:
                metrics.update(stage.round_metrics(ctx, results))
        metrics.update(reports.metrics)
        return metrics

    def _finish_round(self, rnd: int, metrics: dict[str, Any], reports: Reports,
                      client_counts: dict[int, tuple[int, int]], start: float) -> None:
        """Totals, log, checkpoint."""
        if self.executor.replacements:
            metrics["workers_replaced"] = self.executor.replacements  # cumulative, this invocation
        self.round = rnd
        self._changing = False
        metrics["wall_s"] = time.perf_counter() - start
        self.totals["bytes_up_total"] += metrics["bytes_up"]
        self.totals["bytes_down_total"] += metrics["bytes_down"]
        self.totals["wall_s_total"] += metrics["wall_s"]
        self.totals.update(reports.totals)
        metrics.update(self.totals)
        self.stages.label_metrics(metrics)  # the names they are logged under (privacy: nonprivate/ diagnostics)
        with self._writing("metrics.jsonl and TensorBoard's events"):
            self.log.write(metrics, client_counts)
        if rnd % self.cfg.log.checkpoint_every == 0 or rnd == self.cfg.rounds:
            with self._writing("the checkpoint"):
                self.checkpoint()

    def checkpoint(self) -> None:
        save_checkpoint(self.run_dir, self.round, self.server_state, self.totals, self.states, self.history,
                        self.stages, {"vectorize": self.stack_size, "config": self._config_record},
                        final=self.round >= self.cfg.rounds)
        self._checkpointed = self.round
