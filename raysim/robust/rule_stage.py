"""The robust rule as a stage of the round (``raysim.stages``): ``aggregator.*`` in place of the one sum.

The rule reads every upload, so the stage turns the sums where the clients trained off. It works on the round's
updates as rows (:class:`raysim.robust.rows.UpdateRows`: Δ_i = upload_i − global of the floating-point entries, one
float64 row per client in client-id order), after every stage that changes the rows has done so (the attacks on
uploads, :mod:`raysim.robust.attack_stage`); the server step then receives global + rule(Δ) where it received the
mean (FedAvg takes it as the model, FedOpt steps towards it). With an attack on the uploads and no rule
(``aggregator.name=mean``) the stage runs the weighted mean on the attacked rows.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, Optional

from raysim.robust.aggregators import aggregate
from raysim.robust.config import most_tolerated, tolerated
from raysim.robust.rows import UpdateRows
from raysim.stages import RoundContext, Stage

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

CENTER_KEY = "aggregator_center"  # centered_clip: the previous round's aggregate, kept in the server state


class RuleStage(Stage):
    """``aggregator.name`` on the round's rows (see the module docstring)."""

    name = "aggregator"
    needs_every_upload = True

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self._reduced_noticed = False

    def reduce(self, ctx: RoundContext) -> Optional[Callable[[], dict]]:
        return lambda: self.mean(ctx)

    def mean(self, ctx: RoundContext) -> dict:
        """The aggregate that replaces the round's mean upload: global + rule(the rows, as the stages left them)."""
        agg, server_state, rnd = self.cfg.aggregator, ctx.server_state, ctx.round
        rows = UpdateRows(ctx.updates, server_state["model"], ctx.weighting)
        ctx.stages.transform_rows(rows, ctx)
        n, f = len(rows), tolerated(self.cfg)
        most = most_tolerated(agg.name, n)
        if most is not None and f > most:  # fewer updates than a round samples (dropouts, skipped non-finite ones)
            if not self._reduced_noticed:
                print(f"raysim: notice: round {rnd}: {agg.name} got {n} updates, which tolerate at most "
                      f"f={max(most, 0)} (aggregator.f={f}); such rounds use the largest f they allow",
                      file=sys.stderr, flush=True)
                self._reduced_noticed = True
            f = max(most, 0)
        if agg.name in ("krum", "multikrum") and n <= 2 * f + 2 or agg.name == "bulyan" and n <= 4 * f + 3:
            name = "median"  # too few updates for the rule at all, even with f = 0: the median is its limit
        else:
            name = agg.name
        m = None if agg.m is None else min(agg.m, n - f)
        center = server_state.get(CENTER_KEY) if agg.name == "centered_clip" else None
        out = aggregate(name, rows.rows, rows.weights, f=f, m=m, bound=agg.norm_bound, tau=agg.tau,
                        iterations=agg.iterations, center=center)
        if agg.name == "centered_clip":
            server_state[CENTER_KEY] = out.clone()
        return rows.model(out)


def rule_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    """A robust rule, or the weighted mean of attacked rows (an attack on the uploads with ``aggregator.name=mean``)."""
    return RuleStage(cfg) if cfg.aggregator.on or cfg.attack.on_uploads else None
