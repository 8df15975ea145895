"""Evaluation after a round's server step, through the executor like every other job.

- personalised accuracy (``acc_mean``, ``acc_weighted``): each evaluated client's test accuracy with the model it
  would use after the round (``eval_setup``, ``predict``), in chunks of clients over the workers' slots;
- the global model's accuracy on the official test split that no client holds (``acc_global`` with
  ``data.test_split=official``), its rows shared out among the workers in whole blocks of ``eval.chunk``;
- the stages' own evaluations (``raysim.stages.StageEvaluation``: the backdoor's success rate), each one call.

The evaluated clients are the run's fixed set (``eval.clients``) or the round's clients; the numbers never depend on
how the calls are cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from raysim.engine.jobs import StageEvalCall
from raysim.engine.plan import plan_evaluation, plan_server_test
from raysim.engine.sampling import fixed_eval_clients
from raysim.stages import Downloads, StageSet

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig
    from raysim.engine.executor import Executor


class Evaluation:
    """The run's evaluation: what is due after a round, and how each part runs on the executor."""

    def __init__(self, cfg: ExperimentConfig, executor: Executor, algorithm: Any, data: Any,
                 states: Callable[[int], Any], downloads: Callable[[list[int], int], Downloads]):
        self.cfg, self.executor, self.algorithm, self.data = cfg, executor, algorithm, data
        self.states, self.downloads = states, downloads
        self.fixed = fixed_eval_clients(cfg.seed, cfg.clients.num, cfg.eval.clients)  # None: the round's clients

    def after_round(self, rnd: int, clients: list[int], server_state: dict, stages: StageSet,
                    metrics: dict[str, Any]) -> dict[int, tuple[int, int]]:
        """Evaluate when it is due (every ``eval.every`` rounds and after the last), then every stage's evaluations;
        fills ``acc_mean``, ``acc_weighted`` (and ``acc_global``) and the stages' keys, and returns each evaluated
        client's (correct, total)."""
        counts: dict[int, tuple[int, int]] = {}
        if rnd % self.cfg.eval.every == 0 or rnd == self.cfg.rounds:
            counts, pooled = self.clients(clients if self.fixed is None else self.fixed, rnd)
            client_acc = {c: n / t for c, (n, t) in counts.items()}
            metrics["acc_mean"] = float(np.mean(list(client_acc.values()))) if client_acc else None
            metrics["acc_weighted"] = pooled  # total correct / total test samples over the evaluated clients
            if self.algorithm.has_global_model:
                metrics["acc_global"] = pooled
                # data.test_split=official: the split no client holds (on-demand data has none)
                if getattr(self.data, "server_test", None) is not None:
                    metrics["acc_global"] = self.server_test(rnd, server_state)
        for stage in stages:
            for evaluation in stage.evaluations(rnd):
                metrics[evaluation.key] = self.stage(evaluation, rnd, server_state)
        return counts

    def clients(self, clients: Any, rnd: int) -> tuple[dict[int, tuple[int, int]], Optional[float]]:
        """Personalised (correct, total) test counts per client, and the pooled accuracy over all their samples."""
        clients = [c for c in clients if self.data.num_test(c) > 0]
        down = self.downloads(clients, -1)
        calls = plan_evaluation(clients, rnd, down.shared_ref, down.own, self.states, self.executor.slots)
        done = self.executor.run(calls)
        rows = [row for chunk_rows in done for row in chunk_rows]
        counts = {r.client_id: (r.correct, r.total) for r in rows}
        total = sum(r.total for r in rows)
        pooled = sum(r.correct for r in rows) / total if total else None
        return counts, pooled

    def server_test(self, rnd: int, server_state: dict) -> Optional[float]:
        """Accuracy on the official test split of the model a client without personal state would use after this
        round (the global model), for the pseudo-client ``data.server_client_id``: its rows shared out among the
        workers in whole blocks of ``eval.chunk``, the block each prediction is computed in whatever the split."""
        sid = self.data.server_client_id
        payload = self.executor.put(self.algorithm.eval_payload(server_state))
        calls = plan_server_test(sid, self.data.num_test(sid), self.cfg.eval.chunk, self.executor.workers, rnd,
                                 payload)
        rows = [done[0] for done in self.executor.run(calls)]
        total = sum(r.total for r in rows)
        return sum(r.correct for r in rows) / total if total else None

    def stage(self, evaluation: Any, rnd: int, server_state: dict) -> Optional[float]:
        """A stage's evaluation of the global model, one call on a worker."""
        payload = self.executor.put(self.algorithm.eval_payload(server_state))
        return self.executor.run([StageEvalCall(evaluation, payload, rnd)])[0]
