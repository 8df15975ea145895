"""WorkerPool: N ClientWorker actors that run any number of virtual-client jobs, surviving worker deaths.

Ray's ActorPool neither replaces dead actors nor re-runs their jobs, so this small pool does: each worker keeps
``jobs_per_worker`` jobs in flight; when one dies its unfinished jobs go back to the queue and a fresh actor takes its
place. Jobs are pure functions of (config, client state, payload, seed), so a re-run gives the same result.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import ray
from ray.exceptions import RayActorError, WorkerCrashedError

from raysim.engine.worker import ClientWorker, enable_fast_tensor_serialization
from raysim.errors import RunStopped

_WORKER_DIED = (RayActorError, WorkerCrashedError)


@dataclass
class Job:
    key: int  # results are returned keyed by this (client id, or chunk index for evaluation)
    method: str  # "train" or "evaluate"
    args: tuple
    clients: list[int]  # for error messages
    round: int
    tries: int = field(default=0)


class WorkerPool:
    def __init__(self, cfg: Any, data_ref: ray.ObjectRef, placement_group: Optional[Any] = None,
                 first_bundle: int = 0):
        enable_fast_tensor_serialization()  # the driver's payload puts and result gets
        self.cfg = cfg
        self._data_ref = data_ref
        self._pg = placement_group
        self._first_bundle = first_bundle
        self._remote_cls = ray.remote(ClientWorker)
        # a worker's first call (info) completes once its process is up; until then no job is queued on it, so the
        # first round starts on the workers that are ready instead of waiting for the slowest cold process start
        self._starting: list[Optional[ray.ObjectRef]] = []
        self.workers: list[Any] = [self._spawn(i) for i in range(cfg.engine.num_workers)]
        self.replacements = 0
        self._closed = False

    def _spawn(self, index: int) -> Any:
        e = self.cfg.engine
        options: dict[str, Any] = {"num_cpus": e.cpus_per_worker, "num_gpus": e.gpus_per_worker, "max_restarts": 0}
        if self._pg is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=self._first_bundle + index)
        actor = self._remote_cls.options(**options).remote(self.cfg, self._data_ref)
        probe = actor.info.remote()
        if index < len(self._starting):
            self._starting[index] = probe
        else:
            self._starting.append(probe)
        return actor

    def info(self) -> list[dict]:
        """pid, device and thread count of every live worker (waits until all have started)."""
        return ray.get([w.info.remote() for w in self.workers])

    def _replace(self, index: int) -> None:
        try:
            ray.kill(self.workers[index], no_restart=True)
        except Exception:  # already gone
            pass
        self.workers[index] = self._spawn(index)
        self.replacements += 1

    def run(self, jobs: list[Job]) -> dict[int, Any]:
        """Run every job once (re-running those whose worker died) and return {job.key: result}."""
        queue: deque[Job] = deque(jobs)
        inflight: dict[ray.ObjectRef, tuple[Job, int, Any]] = {}
        load = [0] * len(self.workers)
        results: dict[int, Any] = {}
        per_worker = self.cfg.engine.jobs_per_worker
        while queue or inflight:
            for w in range(len(self.workers)):
                while queue and load[w] < per_worker and self._starting[w] is None:
                    job = queue.popleft()
                    out = getattr(self.workers[w], job.method).remote(*job.args)
                    wait_ref = out[0] if isinstance(out, list) else out
                    inflight[wait_ref] = (job, w, out)
                    load[w] += 1
            starting = [r for r in self._starting if r is not None]
            ready, _ = ray.wait(list(inflight) + starting, num_returns=1)
            ref = ready[0]
            if ref not in inflight:  # a worker came up (or failed to: its first job then fails as before)
                self._starting[self._starting.index(ref)] = None
                continue
            job, w, out = inflight.pop(ref)
            load[w] -= 1
            try:
                value = ray.get(ref)
            except _WORKER_DIED as exc:
                if self._closed:
                    raise RunStopped("the worker pool was shut down during a round") from None
                lost = [job] + [j for r, (j, jw, _) in list(inflight.items()) if jw == w]
                for r in [r for r, (_, jw, _) in inflight.items() if jw == w]:
                    inflight.pop(r)
                load[w] = 0
                self._replace(w)
                for j in lost:
                    j.tries += 1
                    if j.tries > self.cfg.engine.max_retries:
                        who = f"client {j.clients[0]}" if len(j.clients) == 1 else f"clients {j.clients}"
                        raise RunStopped(f"{who} in round {j.round}: worker died {j.tries} times "
                                         f"(engine.max_retries={self.cfg.engine.max_retries}); last cause: "
                                         f"{_first_line(exc)}") from None
                    queue.appendleft(j)
                continue
            results[job.key] = (value, out[1]) if isinstance(out, list) else value
        return results

    def shutdown(self) -> None:
        self._closed = True
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:
                pass
        self.workers = []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
