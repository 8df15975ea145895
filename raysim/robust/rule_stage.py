"""The robust rule as a stage of the round (``raysim.stages``): ``aggregator.*`` in place of the one sum.

The rule reads every upload, so the stage turns the sums where the clients trained off. It works on the round's
updates as rows (:class:`raysim.robust.rows.UpdateRows`: Δ_i = upload_i − global of the floating-point entries, one
float64 row per client in client-id order), in a fixed order:

1. every stage that changes the rows does so (the attacks on uploads, :mod:`raysim.robust.attack_stage`);
2. a row that cannot make a model (not finite, or global + row not finite in the upload's dtypes: an attack's
   1e300 in a float32 model) is a non-finite upload: ``engine.on_nonfinite=stop`` stops the run in one line,
   ``skip`` leaves it out (the round's ``skipped`` metric names its client);
3. FoolsGold adds each row to its client's history (the stage's checkpoint state);
4. the pre-aggregation steps: nearest-neighbour mixing (``aggregator.nnm``), then bucketing (``aggregator.bucket``,
   the shuffle drawn from (seed, round)); after them every row counts once;
5. the rule (FLTrust with the server's own update, :mod:`raysim.robust.server_update`).

The server step then receives global + rule(Δ) where it received the mean (FedAvg takes it as the model, FedOpt
steps towards it). With an attack on the uploads and no rule (``aggregator.name=mean``) the stage runs the weighted
mean on the attacked rows.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from raysim.robust.aggregators import aggregate, bucketing, nearest_neighbor_mixing
from raysim.sections.robust import most_tolerated, tolerated
from raysim.robust.rows import UpdateRows
from raysim.seeds import BUCKET_STREAM, job_seed
from raysim.stages import RoundContext, Stage, StageSetup

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

CENTER_KEY = "aggregator_center"  # centered_clip: the previous round's aggregate, kept in the server state
HISTORY_KEY = "aggregator_foolsgold"  # foolsgold: the clients' summed updates, in the checkpoint


class RuleStage(Stage):
    """``aggregator.name`` on the round's rows (see the module docstring)."""

    name = "aggregator"
    needs_every_upload = True

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self._reduced_noticed = False
        self.server: Any = None  # fltrust: the server's own update (raysim.robust.server_update.ServerUpdate)
        self.history: dict[int, torch.Tensor] = {}  # foolsgold: each client's summed updates
        self.dropped: dict[int, list[int]] = {}  # round -> clients whose row was left out as non-finite

    def check(self, setup: StageSetup) -> None:
        """FLTrust's root dataset, drawn and refused here (too few held-out samples) before round 1."""
        if self.cfg.aggregator.name == "fltrust":
            from raysim.robust.server_update import ServerUpdate

            self.server = ServerUpdate(self.cfg, setup)

    def reduce(self, ctx: RoundContext) -> Optional[Callable[[], dict]]:
        return lambda: self.mean(ctx)

    def mean(self, ctx: RoundContext) -> dict:
        """The aggregate that replaces the round's mean upload: global + rule(the rows, as the stages left them)."""
        agg, server_state, rnd = self.cfg.aggregator, ctx.server_state, ctx.round
        rows = UpdateRows(ctx.updates, server_state["model"], ctx.weighting)
        ctx.stages.transform_rows(rows, ctx)
        self._leave_out_nonfinite(rows, ctx)
        if agg.name == "foolsgold":
            for client, row in zip(rows.clients, rows.rows):
                self.history[client] = self.history[client] + row if client in self.history else row.clone()
        x, weights = rows.rows, rows.weights
        f = tolerated(self.cfg)
        if agg.nnm:
            x = nearest_neighbor_mixing(x, min(f, len(x) - 1))
        if agg.bucket:
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(
                job_seed(self.cfg.seed, 0, rnd, BUCKET_STREAM)))
            x = bucketing(x, agg.bucket, order)
        if agg.nnm or agg.bucket:
            weights = torch.ones(len(x), dtype=torch.float64)
        name, f = self._rule_for(len(x), f, rnd)
        m = None if agg.m is None else min(agg.m, len(x) - f)
        center = server_state.get(CENTER_KEY) if agg.name == "centered_clip" else None
        server = None
        if self.server is not None:
            from raysim.robust.server_update import local_steps

            train = self.cfg.train
            steps = local_steps([u.num_samples for u in rows.updates], train.batch_size, train.local_epochs)
            server = self.server.row(server_state["model"], rows.keys, rnd, steps)
        history = torch.stack([self.history[c] for c in rows.clients]) if agg.name == "foolsgold" else None
        out = aggregate(name, x, weights, f=f, m=m, bound=agg.norm_bound, tau=agg.tau, iterations=agg.iterations,
                        center=center, nu=agg.nu, maxiter=agg.maxiter, server=server, history=history)
        if agg.name == "centered_clip":
            server_state[CENTER_KEY] = out.clone()
        return rows.model(out)

    def _leave_out_nonfinite(self, rows: UpdateRows, ctx: RoundContext) -> None:
        """Step 2 of the module docstring: stop, or leave the rows that cannot make a model out of the round."""
        from raysim.errors import RunStopped

        bad = rows.nonfinite()
        if not bad:
            return
        clients = [rows.clients[i] for i in bad]
        attack = self.cfg.attack
        how = f" after attack.name={attack.name}" if attack.on_uploads else ""
        if ctx.on_nonfinite == "stop":
            raise RunStopped(f"client {clients[0]}'s update in round {ctx.round} is not finite{how} (NaN/Inf, or "
                             f"global + update overflows the model's dtype); the run stopped before the round's "
                             f"server step (engine.on_nonfinite=skip drops such updates instead)")
        if len(bad) == len(rows):
            raise RunStopped(f"every update of round {ctx.round} is not finite{how} (NaN/Inf, or global + update "
                             f"overflows the model's dtype): nothing is left to aggregate")
        rows.drop(bad)
        self.dropped[ctx.round] = clients

    def _rule_for(self, n: int, f: int, rnd: int) -> tuple[str, int]:
        """The rule and f that ``n`` rows allow: fewer rows than a round samples (dropouts, skipped non-finite
        updates, buckets) use the largest f they allow, with a notice once; too few for the rule at all, even with
        f = 0, take the median, its limit."""
        agg = self.cfg.aggregator
        most = most_tolerated(agg.name, n)
        if most is not None and f > most:
            if not self._reduced_noticed:
                print(f"raysim: notice: round {rnd}: {agg.name} got {n} updates, which tolerate at most "
                      f"f={max(most, 0)} (aggregator.f={f}); such rounds use the largest f they allow",
                      file=sys.stderr, flush=True)
                self._reduced_noticed = True
            f = max(most, 0)
        if agg.name in ("krum", "multikrum") and n <= 2 * f + 2 or agg.name == "bulyan" and n < 4 * f + 3:
            return "median", f
        return agg.name, f

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        """The clients whose row was left out as non-finite join the round's ``skipped``."""
        dropped = self.dropped.pop(ctx.round, [])
        if not dropped:
            return {}
        return {"skipped": sorted(set(ctx.skipped) | set(dropped))}

    def state(self) -> dict:
        if self.cfg.aggregator.name != "foolsgold":
            return {}
        clients = sorted(self.history)
        rows = torch.stack([self.history[c] for c in clients]) if clients else torch.zeros(0, dtype=torch.float64)
        return {HISTORY_KEY: {"clients": torch.tensor(clients, dtype=torch.int64), "history": rows}}

    def load(self, ckpt: dict) -> None:
        saved = ckpt.get(HISTORY_KEY)
        if self.cfg.aggregator.name == "foolsgold" and saved is not None:
            self.history = {int(c): row for c, row in zip(saved["clients"].tolist(), saved["history"])}


def rule_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    """A robust rule, or the weighted mean of attacked rows (an attack on the uploads with ``aggregator.name=mean``)."""
    return RuleStage(cfg) if cfg.aggregator.on or cfg.attack.on_uploads else None
