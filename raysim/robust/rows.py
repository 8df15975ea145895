"""The round's updates as rows: what robust rules and the attacks on uploads work on.

Each client's update Δ_i = upload_i − global over the floating-point entries the global model holds, flattened into
one float64 row, in the order the server consumes them (client-id order); the integer entries (batch norm's
``num_batches_tracked``) stay apart and take the plain weighted mean. An aggregate row becomes the round's mean
model again with :meth:`UpdateRows.model`: global + row, cast back to each entry's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from raysim.algorithms.aggregation import client_weight, flatten, unflatten, weighted_average


class UpdateRows:
    """``rows`` (n, d) float64, ``weights`` (n,) float64 (the round's weighting), ``clients`` (row order)."""

    def __init__(self, updates: list, global_model: dict, weighting: str):
        self.updates = updates
        self.weighting = weighting
        first = updates[0].upload
        self.keys = [k for k, v in first.items() if v.is_floating_point() and k in global_model]
        self.others = [k for k in first if k not in self.keys]
        self.layout, self.origin = flatten({k: global_model[k] for k in self.keys})
        self.rows = torch.stack([flatten({k: u.upload[k] for k in self.keys})[1] - self.origin for u in updates])
        self.weights = torch.tensor([client_weight(u.num_samples, weighting) for u in updates], dtype=torch.float64)
        self.clients = [u.client_id for u in updates]

    def __len__(self) -> int:
        return self.rows.shape[0]

    def nonfinite(self) -> list[int]:
        """The positions of the rows that cannot make a model: a row that is not finite, or whose model
        global + row is not finite in its entries' own dtypes (an update 1e300 is finite in float64 and inf in
        float32)."""
        bad = ~torch.isfinite(self.rows).all(dim=1)
        models = self.origin + self.rows
        at = 0
        for _, shape, dtype in self.layout:
            size = math.prod(shape)
            if dtype != torch.float64:
                bad |= ~torch.isfinite(models[:, at:at + size].to(dtype)).all(dim=1)
            at += size
        bad |= ~torch.isfinite(models).all(dim=1)
        return [i for i in range(len(self)) if bool(bad[i])]

    def drop(self, positions: list[int]) -> None:
        """Leave the rows at ``positions`` (and their clients, updates and weights) out of the round."""
        keep = [i for i in range(len(self)) if i not in set(positions)]
        self.rows, self.weights = self.rows[keep], self.weights[keep]
        self.updates = [self.updates[i] for i in keep]
        self.clients = [self.clients[i] for i in keep]

    def model(self, aggregate: torch.Tensor) -> dict[str, Any]:
        """The round's mean upload for an aggregate row: global + row for the floating entries, the weighted mean of
        the uploads for the others, in the upload's keys and dtypes."""
        model = unflatten(self.layout, self.origin + aggregate)
        if self.others:
            model.update(weighted_average([{k: u.upload[k] for k in self.others} for u in self.updates],
                                          [client_weight(u.num_samples, self.weighting) for u in self.updates]))
        return {k: model[k] for k in self.updates[0].upload}
