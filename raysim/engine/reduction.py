"""The round's reduction: from the round's updates to the mean the algorithm's server step reads.

By default it is the one sum (``raysim.algorithms.aggregation.UploadSum``): taken where the clients trained (the
schedule's reports carry it), or here from the uploads in the same fixed groups, and divided once. A stage may
replace it (:meth:`raysim.stages.Stage.reduce`: a robust rule on the rows, FedBuff's buffered step), read it as the
plain sum (:meth:`raysim.stages.Stage.decode`: secure aggregation's unmasking, in reverse stage order) and finish it
on the server (:meth:`raysim.stages.Stage.release`: DP-FedAvg's noise, released every round, reports or not).
"""

from __future__ import annotations

from typing import Callable, Optional

from raysim.algorithms.aggregation import UploadSum, sum_in_groups
from raysim.stages import RoundContext, StageSet


def round_mean(stages: StageSet, ctx: RoundContext) -> tuple[Callable[[], dict], Optional[dict]]:
    """(the round's mean, as the server step reads it when it does; the mean a stage released, which moves the model
    even when no client reported, else None). The sum is taken here only if something reads it."""
    for stage in stages:
        reduced = stage.reduce(ctx)
        if reduced is not None:
            return reduced, None
    taken: list[UploadSum] = []

    def summed() -> UploadSum:
        if not taken:  # the sum of what travelled, read as the plain sum (secure aggregation unmasks it)
            taken.append(stages.decode(ctx.total if ctx.total is not None else
                                       sum_in_groups(ctx.updates, ctx.clients, ctx.sum_group, ctx.weighting), ctx))
        return taken[0]

    released = next((m for stage in stages if (m := stage.release(summed, ctx)) is not None), None)
    if released is not None:
        return (lambda: released), released
    return (lambda: summed().mean()), None
