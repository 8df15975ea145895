"""The driver and the one round loop of raysim.

Each round: sample clients -> dispatch their jobs to the executor -> aggregate through the algorithm's hooks ->
evaluate -> server-side curriculum (``on_round_end``) -> log -> checkpoint. ``run()`` yields each round's metrics,
so the CLI prints progress and a Tune trial reports every round. The driver lives in the process that launched the
run (the CLI, a notebook, a Tune trial), on the node that holds the run directory; its jobs run on a pool of Ray
worker actors (``engine.backend=ray``) or in the same process (``inline``): see ``raysim.engine.executor``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import numpy as np
import torch

from raysim.algorithms.aggregation import UploadSum, sum_in_groups
from raysim.algorithms.base import ClientUpdate, RoundUpdates, SummedUpload
from raysim.algorithms.central import reserved_jobs
from raysim.config import to_flat_dict
from raysim.data import build_federated_data
from raysim.engine.executor import Executor, InlineExecutor, RayExecutor
from raysim.engine.jobs import CallResult, CentralCall, ProbeCall, ServerCall, ServerTrainJob, TrainJob, TrainResult
from raysim.engine.plan import (RoundSum, clients_per_call, cohort_size, group_size, plan_evaluation, plan_round,
                                plan_server_test)
from raysim.engine.sampling import draw_clients, eval_cohort, sample_clients
from raysim.engine.vectorize_probe import run_cohort_size
from raysim.engine.state import (ClientHistoryStore, ClientStateStore, checkpoint_dir, checksums, has_checkpoint,
                                 read_checkpoint)
from raysim.errors import OutOfMemory, RunStopped
from raysim.fsutil import WriteFailed, run_dir_write
from raysim.models import build_model
from raysim.privacy.rounds import RoundPrivacy
from raysim.registry import get_algorithm, import_plugins
from raysim.robust.step import RobustStep
from raysim.runlog import RunLog
from raysim.system.clock import RoundClock, Settlement
from raysim.trees import detached_cpu, nbytes

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


def _update(result: TrainResult, summed: bool) -> ClientUpdate:
    return ClientUpdate(client_id=result.client_id, upload=SummedUpload() if summed else result.upload,
                        num_samples=result.num_samples, loss=result.loss)


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
            self.executor.shutdown()  # the replacements a central job's pool made, too
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
        self.privacy = RoundPrivacy(cfg)  # before any worker starts: an unreachable target ε is one line at once
        # system.enabled: the simulated clock (its files are read here, before any work starts)
        self.clock = RoundClock(cfg, cohort_size(cfg.clients.num, cfg.clients.fraction)) \
            if cfg.system.enabled else None
        self.executor.start(workers)  # under Ray: the runner's workers (created when None), data to come
        with reserved_jobs(lambda train: self.executor.run([CentralCall(train)])[0]):
            self.data = self.algorithm.prepare_data(build_federated_data(cfg))
        self.algorithm.check(cfg, self.data)
        # aggregator.* / attack.*: the robust rule, the upload attacks and the backdoor's success rate (None: off)
        self.robust = RobustStep(cfg) if cfg.aggregator.on or cfg.attack.on else None
        if self.robust is not None:
            self.robust.check(self.data)
        self.executor.attach(self.data)
        self._eval_cohort = eval_cohort(cfg.seed, cfg.clients.num, cfg.eval.clients)  # None: the sampled clients
        self.states = ClientStateStore(self.executor)
        # server_keep's per-client window
        self.history = ClientHistoryStore(self.algorithm.server_history, self.executor)
        self.totals = {"bytes_up_total": 0, "bytes_down_total": 0, "wall_s_total": 0.0}
        self.round = 0
        self._client_s: Optional[float] = None  # running mean of one client update's time (calls' sizes)
        self._download_bytes: tuple[int, dict[int, int]] = (0, {})  # the round's shared and own payload bytes
        self._checkpointed = 0  # the round of the checkpoint on disk
        initial = build_model(cfg, cfg.model.for_client(0), self.data.input_shape(0), self.data.num_classes, 0,
                              self.algorithm)
        self.server_state = self.algorithm.init_server_state(initial.state_dict())
        if self.clock is not None:
            self.totals["sim_time_s"] = 0.0  # simulated seconds at the end of the last aggregation
            self.clock.check_deadline(self.data.num_train, nbytes(initial.state_dict()))
        # engine.vectorize: clients per cohort (1: one at a time; None: auto, chosen by a probe at the first round)
        self.cohort_size, self.vectorize_why = run_cohort_size(cfg, self.algorithm, initial)
        if resume:
            ckpt = read_checkpoint(self.run_dir)
            self.round = self._checkpointed = int(ckpt["round"])
            if self.cohort_size is None and ckpt.get("vectorize"):
                self.cohort_size = int(ckpt["vectorize"])  # auto's choice stands for the whole run
                self.vectorize_why = "the probe's choice, kept in the checkpoint"
            self.server_state = ckpt["server_state"]
            self.totals.update(ckpt["totals"])
            self.states.load(checkpoint_dir(self.run_dir), ckpt["client_files"], checksums(ckpt, "clients"))
            self.history.load(checkpoint_dir(self.run_dir), ckpt.get("history", {}), checksums(ckpt, "history"))
            self.privacy.load(ckpt)  # the adaptive clip norm, DP-SGD's steps and ε per client
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
        state, never ``clients.num``: state references, kept history, the evaluation cohort, the pickled dataset."""
        import pickle

        cohort = self._eval_cohort
        return {"client_states": len(self.states), "history_clients": len(self.history.index()),
                "eval_cohort": len(cohort) if cohort is not None else 0,
                "data_bytes": len(pickle.dumps(self.data, protocol=5))}

    def progress(self) -> tuple[int, int, int, str]:
        """(round in progress, jobs done, jobs in this phase, "train" | "evaluate"): for a live progress line."""
        executor = getattr(self, "executor", None)
        done, total, kind = executor.progress if executor is not None else (0, 0, "")
        return self.round + 1, done, total, kind

    def shutdown(self) -> None:
        """Release the workers now (an interrupted ``run()`` generator may never reach its ``finally``)."""
        self._stop.set()
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
                if self.privacy.budget_spent(self.round + 1):
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
        sampled, dropouts = self._sample(rnd)
        bytes_down, results, total = self._train_clients(sampled, rnd)
        results, settled = self._meet_deadline(results, rnd, len(sampled) + len(dropouts))
        finished, kept, skipped = self._collect(results, rnd)
        updates = [_update(r, total is not None) for r in finished]
        self._changing = True  # until the round is finished, the state held here is neither this round's nor the last
        self._keep_history(updates, rnd)
        self._aggregate(updates, rnd, sampled, total)
        for cid, ref in kept:
            self.states.put(cid, ref)
        metrics = self._round_metrics(rnd, sampled, finished, skipped, bytes_down)
        metrics.update(self.privacy.round_metrics(rnd, finished))
        if settled is not None:
            metrics.update(self._advance_clock(settled, dropouts))
        client_counts = self._evaluate_round(rnd, sampled, metrics)
        if self.robust is not None and self.cfg.attack.backdoor:
            metrics["attack/asr"] = self.robust.attack_success_rate(self)
        metrics.update(self.algorithm.on_round_end(rnd, metrics, self.server_state))
        self._finish_round(rnd, metrics, client_counts, start)
        return metrics

    # ------------------------------------------------------------------ the round's steps
    def _sample(self, rnd: int) -> tuple[list[int], list[int]]:
        """(the round's clients to train, the clients that started and dropped out): ``sample_clients``, or with
        ``system.enabled`` those of the available clients that the clock starts (``raysim.system.clock``)."""
        if self.clock is None:
            poisson = self.privacy.sample(rnd)
            if poisson is not None:
                return poisson, []
            return sample_clients(self.cfg.seed, rnd, self.cfg.clients.num, self.cfg.clients.fraction), []
        return self.clock.sample(rnd, self.totals["sim_time_s"], draw_clients)

    def _meet_deadline(self, done: dict[int, Any], rnd: int,
                       started: int) -> tuple[dict[int, Any], Optional[Settlement]]:
        """``system.enabled``: who of the trained clients reports in simulated time; the partial clients
        (``system.late=partial``) trained again with their step budgets. Off: everything as it came."""
        if self.clock is None:
            return done, None
        shared_bytes, own_bytes = self._download_bytes
        settled = self.clock.settle({c: r for c, (r, _) in done.items()},
                                    {c: shared_bytes + own_bytes.get(c, 0) for c in done}, started)
        kept = {c: done[c] for c in settled.reporters if c not in settled.budgets}
        if settled.budgets:
            _, partial, _ = self._train_clients(sorted(settled.budgets), rnd, settled.budgets)
            kept.update(partial)
        return kept, settled

    def _advance_clock(self, settled: Settlement, dropouts: list[int]) -> dict[str, Any]:
        """The round's simulated seconds onto the clock (``sim_time_s`` goes to the metrics with the totals)."""
        self.totals["sim_time_s"] += settled.round_s
        return {"round_sim_s": settled.round_s, "dropouts": len(dropouts), "late": len(settled.late),
                "partial": len(settled.budgets), "surplus": len(settled.surplus)}

    def _downloads(self, clients: list[int], rnd: int) -> tuple[Any, dict[int, Any], int]:
        """(shared payload ref, per-client payload refs, bytes_down): the shared payload is put once; a client's
        own payload (``client_payload``) only where the algorithm sends one, and counted for that client."""
        shared = self._shared_payload(rnd)
        own, own_bytes = self._own_payloads(clients, rnd)
        if rnd > 0:  # each trained client's bytes down, for the simulated clock
            self._download_bytes = (nbytes(shared), own_bytes)
            self.privacy.downloaded(shared.get("model") or {})  # DP-FedAvg: what the round's deltas are taken from
        return self.executor.put(shared), own, int(nbytes(shared) * len(clients) + sum(own_bytes.values()))

    def _shared_payload(self, rnd: int) -> dict:
        """What every client of round ``rnd`` downloads (``rnd`` <= 0: the evaluation's)."""
        return (self.algorithm.server_payload(self.server_state, rnd) if rnd > 0
                else self.algorithm.eval_payload(self.server_state))

    def _own_payloads(self, clients: list[int], rnd: int) -> tuple[dict[int, Any], dict[int, int]]:
        """Each client's own payload ref (``client_payload``, where the algorithm sends one) and its bytes."""
        own: dict[int, Any] = {}
        own_bytes: dict[int, int] = {}
        for cid in clients:
            personal = self.algorithm.client_payload(self.server_state, cid, rnd)
            if personal is not None:
                own[cid] = self.executor.put(personal)
                own_bytes[cid] = nbytes(personal)
        return own, own_bytes

    def _sum_group(self, sampled: list[int]) -> int:
        """Clients per group of this round's sum (``engine.sum_group``); 0: the algorithm needs every upload."""
        return group_size(self.cfg.engine.sum_group, len(sampled)) if self.algorithm.sums_uploads else 0

    def _train_clients(self, sampled: list[int], rnd: int, budgets: Optional[dict[int, int]] = None,
                       ) -> tuple[int, dict[int, Any], Optional[UploadSum]]:
        """Run the sampled clients' training calls, as the round's plan cuts them (``raysim.engine.plan``); returns
        (bytes_down, {client: (TrainResult, state handle)}, and the round's one upload sum where the uploads were
        summed where they trained, else None). ``budgets``: client -> the samples its steps may take
        (``system.late=partial``)."""
        shared_ref, own, bytes_down = self._downloads(sampled, rnd)
        budgets = budgets or {}
        clip = self.privacy.clip
        jobs = [TrainJob(client_id=c, round=rnd, payload_ref=shared_ref, own_payload_ref=own.get(c),
                         max_samples=budgets.get(c), clip=clip) for c in sampled]
        group = self._sum_group(sampled)
        # with a deadline (system.deadline_s), who reports is known only from the uploads: every upload travels
        # a robust aggregator (aggregator.name) or an attack on the uploads needs each upload on the driver
        summed = (self.cfg.engine.partial_sums and group > 0 and not (self.clock and self.clock.needs_every_upload)
                  and not (self.robust is not None and self.robust.needs_uploads))
        done, total = self._run_training(jobs, group if summed else 0)
        return bytes_down, done, total

    def _run_training(self, jobs: list[TrainJob], sum_group: int) -> tuple[dict[int, Any], Optional[UploadSum]]:
        """Run training ``jobs`` (distinct clients) as the plan cuts them, one plan per round's payload (the
        asynchronous modes train jobs of several server versions at once); returns ({client: (TrainResult, state
        handle)}, the round's upload sum (:class:`~raysim.engine.plan.RoundSum`: the groups' sums added in group
        order as their calls come in), None when ``sum_group`` is 0)."""
        states = [self.states.get(j.client_id) for j in jobs]
        if self.cohort_size is None and jobs:  # engine.vectorize=auto: a probe on this round's clients, once a run
            self.cohort_size, _ = self.executor.run([ProbeCall(jobs=jobs, states=states)])[0]
            self.vectorize_why = f"chosen by a probe in round {jobs[0].round}; it stands for the whole run"
        per_call = clients_per_call(self.cfg.engine.clients_per_call, self._client_s, len(jobs),
                                    self.executor.slots)
        calls = []
        for rnd in sorted({j.round for j in jobs}):
            members = [i for i, j in enumerate(jobs) if j.round == rnd]
            calls += plan_round([jobs[i] for i in members], [states[i] for i in members], sum_group=sum_group,
                                cohort=self.cohort_size, per_call=per_call, workers=self.executor.workers,
                                weighting=self.privacy.weighting(self.algorithm.weighting))
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

    def _collect(self, done: dict[int, Any], rnd: int) -> tuple[list[TrainResult], list[tuple[int, Any]], list[int]]:
        """The finite results in client-id order (so aggregation never depends on who finished first), the states
        to keep, and the clients whose non-finite update was skipped."""
        finished, kept, skipped = [], [], []
        for cid in sorted(done):
            result, state_ref = done[cid]
            if not result.finite:
                if self.cfg.engine.on_nonfinite == "stop":
                    raise RunStopped(f"client {cid} returned a non-finite (NaN/Inf) update in round {rnd}; the run "
                                     f"stopped with round {self.round} checkpointed (engine.on_nonfinite=skip drops "
                                     f"such updates instead)")
                skipped.append(cid)
                continue
            finished.append(result)
            if result.has_state:
                kept.append((cid, state_ref))
        return finished, kept, skipped

    def _keep_history(self, updates: list[ClientUpdate], rnd: int) -> None:
        """What the server keeps of each finite update (``server_keep``), into the bounded per-client window."""
        if self.algorithm.server_history < 1:
            return
        for u in updates:
            kept = self.algorithm.server_keep(u, rnd)
            if kept is not None:
                self.history.push(u.client_id, rnd, self.executor.put(kept))

    def _aggregate(self, updates: list[ClientUpdate], rnd: int, sampled: list[int],
                   total: Optional[UploadSum]) -> None:
        """The algorithm's aggregation on the driver, then its server-side training (if any) on a worker. With a
        summed aggregation, ``server_aggregate`` gets the round's mean from the one sum: the groups' sums added in
        group order, whether the workers took them or the driver does here from per-client uploads, in the same
        groups (``raysim.algorithms.aggregation``)."""
        if self.privacy.central is not None:
            self._private_step(updates, rnd, sampled, total)
            return
        if not updates:
            return
        size, weighting = group_size(self.cfg.engine.sum_group, len(sampled)), self.algorithm.weighting

        def mean() -> dict:
            if self.robust is not None and self.robust.needs_uploads:
                return self.robust.mean(updates, self.server_state, rnd, weighting)
            summed = total if total is not None else sum_in_groups(updates, sampled, size, weighting)
            return summed.mean()

        self._server_step(RoundUpdates(updates, mean), rnd)

    def _private_step(self, updates: list[ClientUpdate], rnd: int, sampled: list[int],
                      total: Optional[UploadSum]) -> None:
        """DP-FedAvg's server step: the clipped deltas' sum (the one sum, uniform weights), noised once, over the
        fixed denominator, added to the download: the round's mean for the algorithm's ``server_aggregate``."""
        if total is None:
            total = sum_in_groups(updates, sampled, group_size(self.cfg.engine.sum_group, len(sampled)), "uniform")
        model = self.privacy.release(total, rnd)
        if updates:
            self._server_step(RoundUpdates(updates, lambda: model), rnd)
        else:  # nobody reported: the noise still moves the model
            self.server_state = detached_cpu(self.algorithm.server_aggregate_mean(model, self.server_state, rnd))

    def _server_step(self, round_updates: RoundUpdates, rnd: int) -> None:
        """The algorithm's ``server_aggregate`` on the round's updates, then its ``server_train`` (if any)."""
        updates = list(round_updates)
        self.server_state = detached_cpu(self.algorithm.server_aggregate(round_updates, self.server_state, rnd))
        if self.algorithm.trains_on_server:
            put = self.executor.put
            work = ServerTrainJob(round=rnd, state_ref=put(self.server_state), updates_ref=put(list(updates)),
                                  history_refs={u.client_id: self.history.refs(u.client_id) for u in updates
                                                if self.history.refs(u.client_id)})
            self.server_state = self.executor.run([ServerCall(work)])[0]

    def _round_metrics(self, rnd: int, sampled: list[int], results: list[TrainResult], skipped: list[int],
                       bytes_down: int) -> dict[str, Any]:
        weights = [r.num_samples for r in results]
        total_w = float(sum(weights)) or 1.0
        metrics: dict[str, Any] = {
            "round": rnd,
            "acc_mean": None,
            "acc_global": None,
            "acc_weighted": None,
            "loss": float(sum(r.loss * w for r, w in zip(results, weights)) / total_w) if results else float("nan"),
            "bytes_up": int(sum(r.upload_bytes for r in results)),
            "bytes_down": bytes_down,
            "clients": len(sampled),
        }
        if self.cfg.engine.vectorize != "off":
            metrics["vectorize"] = self.cohort_size  # clients per cohort (1: one at a time)
        for part in sorted({k for r in results for k in r.parts}):
            metrics[f"loss_{part}"] = float(sum(r.parts.get(part, 0.0) * w for r, w in zip(results, weights)) / total_w)
        if skipped:
            metrics["skipped"] = skipped
        if not self.algorithm.has_global_model:
            metrics.pop("acc_global")
        return metrics

    def _evaluate_round(self, rnd: int, sampled: list[int], metrics: dict[str, Any]) -> dict[int, tuple[int, int]]:
        """Evaluate when it is due; fills ``acc_mean``, ``acc_weighted`` (and ``acc_global``) and returns each
        evaluated client's (correct, total)."""
        cfg = self.cfg
        if not (rnd % cfg.eval.every == 0 or rnd == cfg.rounds):
            return {}
        counts, pooled = self._evaluate(sampled if self._eval_cohort is None else self._eval_cohort, rnd)
        client_acc = {c: n / t for c, (n, t) in counts.items()}
        metrics["acc_mean"] = float(np.mean(list(client_acc.values()))) if client_acc else None
        metrics["acc_weighted"] = pooled  # total correct / total test samples over the evaluated clients
        if self.algorithm.has_global_model:
            metrics["acc_global"] = pooled
            # data.test_split=official: the split no client holds (on-demand data has none)
            if getattr(self.data, "server_test", None) is not None:
                metrics["acc_global"] = self._evaluate_server_test(rnd)
        return counts

    def _finish_round(self, rnd: int, metrics: dict[str, Any], client_counts: dict[int, tuple[int, int]],
                      start: float) -> None:
        """Totals, log, checkpoint."""
        if self.executor.replacements:
            metrics["workers_replaced"] = self.executor.replacements  # cumulative, this invocation
        self.round = rnd
        self._changing = False
        metrics["wall_s"] = time.perf_counter() - start
        self.totals["bytes_up_total"] += metrics["bytes_up"]
        self.totals["bytes_down_total"] += metrics["bytes_down"]
        self.totals["wall_s_total"] += metrics["wall_s"]
        metrics.update(self.totals)
        with self._writing("metrics.jsonl and TensorBoard's events"):
            self.log.write(metrics, client_counts)
        if rnd % self.cfg.log.checkpoint_every == 0 or rnd == self.cfg.rounds:
            with self._writing("the checkpoint"):
                self.checkpoint()

    def _evaluate(self, clients: Any, rnd: int) -> tuple[dict[int, tuple[int, int]], Optional[float]]:
        """Personalised (correct, total) test counts per client, and the pooled accuracy over all their samples."""
        clients = [c for c in clients if self.data.num_test(c) > 0]
        shared_ref, own, _ = self._downloads(clients, -1)
        calls = plan_evaluation(clients, rnd, shared_ref, own, self.states.get, self.executor.slots)
        done = self.executor.run(calls)
        rows = [row for chunk_rows in done for row in chunk_rows]
        counts = {r.client_id: (r.correct, r.total) for r in rows}
        total = sum(r.total for r in rows)
        pooled = sum(r.correct for r in rows) / total if total else None
        return counts, pooled

    def _evaluate_server_test(self, rnd: int) -> Optional[float]:
        """Accuracy on the official test split of the model a client without personal state would use after this
        round (the global model), for the pseudo-client ``data.server_client_id``: its rows shared out among the
        workers in whole blocks of ``eval.chunk``, the block each prediction is computed in whatever the split."""
        sid = self.data.server_client_id
        payload = self.executor.put(self.algorithm.eval_payload(self.server_state))
        calls = plan_server_test(sid, self.data.num_test(sid), self.cfg.eval.chunk, self.executor.workers, rnd,
                                 payload)
        rows = [done[0] for done in self.executor.run(calls)]
        total = sum(r.total for r in rows)
        return sum(r.correct for r in rows) / total if total else None

    def checkpoint(self) -> None:
        history = self.history.save(checkpoint_dir(self.run_dir))  # new entries' files, before server.pt names them
        self.states.save(checkpoint_dir(self.run_dir), self.round,
                         {"server_state": self.server_state, "totals": dict(self.totals), "history": history,
                          "vectorize": self.cohort_size, "config": self._config_record,
                          **self.privacy.state(),
                          **self._checkpoint_extra()},
                         checksums=self.history.checksums)
        self.history.prune(checkpoint_dir(self.run_dir))
        self._checkpointed = self.round

    def _checkpoint_extra(self) -> dict:
        """More of the run's state for ``server.pt`` (the asynchronous modes' event queue); none here."""
        return {}
