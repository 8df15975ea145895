"""The one sum: Σ weight·upload over a round's clients, taken where they trained, the same way on every executor.

An algorithm declares once what its clients upload (``Algorithm.uploads``, an :class:`Uploads`): a model average, a
weighted mean, named statistics with their own weights, or uploads kept apart (FedCDA, FedPAC, FedGen, ...). For
all but the last the round's uploads matter only through Σ_i w_i·u_i and Σ_i w_i (each statistic with its own
w_i), so instead of every upload travelling to the driver:

- the round's sampled clients, in id order, are cut into fixed groups (:func:`fixed_groups`: a function of the
  client list and ``engine.sum_group`` alone, never of the workers or of timing);
- a group's clients train in one call, and its worker sums their finite uploads there, in id order
  (:class:`UploadSum`); the per-client results travel without their uploads;
- the driver adds the groups' sums in group order (:meth:`UploadSum.merge`) and divides once
  (:meth:`UploadSum.mean`).

When uploads do reach the driver one by one (``engine.partial_sums=false``), :func:`sum_in_groups` forms the same
groups and takes the same steps, and every other weighted sum of the engine goes through the same
:class:`UploadSum`: an algorithm's own weighted means (:func:`weighted_average`: SCAFFOLD's control variates,
FedDyn's mean), FedBuff's staleness-weighted buffer of model changes (:meth:`UploadSum.add`'s ``origin``), FedAsync's
mix (:meth:`UploadSum.sum`) and the robust rules' weighted mean of the round's rows. There is one summation in
raysim, so the numbers depend neither on where the sums were taken nor on the number of workers. Its public names:
:class:`UploadSum` (``add``, ``add_results``, ``merge``, ``mean``, ``sum``), :func:`sum_in_groups` and
:func:`weighted_average`.

The arithmetic, on one flat float64 buffer per upload (exact for float32 values and for integers below 2**53):
a client adds ``flat * weight`` to its group's buffer (two correctly rounded operations, never a fused
multiply-add, so every IEEE machine gives the same bits), groups are added in order with one vectorised operation
each, and the mean is ``total / Σ weights``, cast back to each tensor's dtype (integers rounded). Against the
per-client formula ``Σ_i u_i · (w_i / Σ w)`` it differs only by float64 round-off, far below float32 resolution.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import torch

# one entry per tensor of an upload, in order: (its key path in the nested dict, shape, dtype)
Layout = tuple[tuple[tuple[str, ...], tuple[int, ...], torch.dtype], ...]


def _leaves(tree: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, path + (key,))
    else:
        where = ".".join(map(str, path)) or "the upload"
        raise TypeError(f"{where}: an upload that is summed (Algorithm.uploads) is a nested dict of tensors, "
                        f"found {type(tree).__name__}")


def layout_and_leaves(tree: dict) -> tuple[Layout, list[torch.Tensor]]:
    """(layout, the tensors in layout order) of a nested dict of tensors; the layout is each tensor's key path,
    shape and dtype, in order."""
    leaves = list(_leaves(tree))
    return tuple((path, tuple(t.shape), t.dtype) for path, t in leaves), [t for _, t in leaves]


def layout_of(tree: dict) -> Layout:
    """The layout of a nested dict of tensors (see :func:`layout_and_leaves`)."""
    return layout_and_leaves(tree)[0]


def flat_views(layout: Layout, flat: torch.Tensor) -> list[torch.Tensor]:
    """The 1-d views of ``flat`` that hold each tensor of ``layout`` (writing to one writes into ``flat``)."""
    return list(torch.split(flat, [math.prod(shape) for _, shape, _ in layout])) if layout else []


def flatten(tree: dict) -> tuple[Layout, torch.Tensor]:
    """(layout, one float64 buffer of every tensor's values in order) of a nested dict of tensors."""
    layout, leaves = layout_and_leaves(tree)
    if not leaves:
        return layout, torch.zeros(0, dtype=torch.float64)
    sizes = [t.numel() for t in leaves]
    flat = torch.empty(sum(sizes), dtype=torch.float64, device=leaves[0].device)
    for view, t in zip(flat.split(sizes), leaves):  # each value converted exactly, straight into its place
        view.copy_(t.detach().reshape(-1))
    return layout, flat


def unflatten(layout: Layout, flat: torch.Tensor) -> dict:
    """The nested dict ``flatten`` took apart, each tensor cast back to its dtype (integers rounded first)."""
    return unflatten_leaves(layout, flat_views(layout, flat))


def unflatten_leaves(layout: Layout, leaves: Sequence[torch.Tensor]) -> dict:
    """The nested dict of ``layout`` from its tensors' flat values, one tensor each, each cast back to its dtype
    (integers rounded first)."""
    out: dict = {}
    for (path, shape, dtype), part in zip(layout, leaves):
        value = part.view(shape)
        value = value.to(dtype) if dtype.is_floating_point or dtype.is_complex else value.round().to(dtype)
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


_NARROW_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _exact_product(dtype: torch.dtype, weight: float) -> bool:
    """Whether every value of ``dtype`` times ``weight`` is exact in float64: a float of at most 24 significant bits
    times a whole weight below 2**29 needs at most 53 bits, so ``add_(u, alpha=w)`` rounds once, as the unfused
    ``u·w`` then ``+`` does, on every IEEE machine (an FMA or not)."""
    return dtype in _NARROW_FLOATS and weight.is_integer() and abs(weight) < 2 ** 29


@dataclass
class UploadSum:
    """Σ weight·upload over some clients (``clients``, in the order they were added) and Σ weight, as one flat
    float64 buffer; what a group's worker returns instead of its clients' uploads.

    A sum of one upload keeps that upload as it came (``single``), so a group of one client travels at the upload's
    own size, not at float64's double; it becomes a buffer, by the same operations, when something is added to it.
    A weight is one number for the whole upload, or one per top-level entry (``Uploads.stats``: each statistic with
    its own weights); ``weight`` then holds the sum of each."""

    clients: list[int] = field(default_factory=list)
    weight: Any = 0.0  # float, or {top-level key: float} for named statistics
    layout: Optional[Layout] = None
    total: Optional[torch.Tensor] = None  # float64, flat; None while empty or while it holds a single upload
    single: Optional[dict] = None  # the one upload added so far, not yet flattened

    _shared = False  # ``total`` is a read-only view of Ray's object store (see __setstate__), copied before a write

    def __len__(self) -> int:
        return len(self.clients)

    def __getstate__(self) -> dict:
        """For Ray's object store: the buffer as a numpy array, which Ray ships out of band and the reader maps
        without a copy (a group's float64 sum is 8 bytes a parameter; the driver reads each one once, to add it)."""
        state = {k: v for k, v in self.__dict__.items() if k != "_shared"}
        if self.total is not None and self.total.device.type == "cpu":  # else the tensor's reducer refuses it
            state["total"] = self.total.numpy()
        return state

    def __setstate__(self, state: dict) -> None:
        total = state.get("total")
        if isinstance(total, np.ndarray):
            self._shared = not total.flags.writeable
            with warnings.catch_warnings():  # read-only memory: _writable() copies it before anything is added
                warnings.simplefilter("ignore", UserWarning)
                state = {**state, "total": torch.from_numpy(total)}
        self.__dict__.update(state)

    def _writable(self) -> None:
        """Copy a buffer that still lies in the object store before adding to it."""
        if self._shared and self.total is not None:
            self.total, self._shared = self.total.clone(), False

    def _buffer(self) -> None:
        """Turn a single kept upload into the buffer: ``flat * weight``, as ``add`` does for every other upload."""
        if self.single is not None:
            self.layout, flat = flatten(self.single)
            self.total, self.single = _per_entry(self.layout, flat, self.weight, torch.Tensor.mul_), None

    def _check(self, layout: Layout, who: str) -> None:
        if layout != self.layout:
            raise ValueError(f"{who}: its upload's keys, shapes or dtypes differ from those of clients {self.clients}; "
                             f"a summed upload (Algorithm.uploads) has the same layout for every client")

    def _accumulate(self, layout: Layout, scaled: torch.Tensor, who: str) -> None:
        self._check(layout, who)
        self._writable()
        if self.total is None:
            self.total = scaled
        else:
            self.total.add_(scaled)

    def add(self, client_id: int, upload: dict, weight: float | dict[str, float],
            origin: Optional[torch.Tensor] = None) -> None:
        """Add one client's upload with its weight (the caller adds clients in id order); ``origin``: a float64
        buffer of the upload's layout (:func:`flatten`'s values) that is subtracted first, so that the term is
        (upload − origin)·weight, each operation on float64 values (FedBuff's change from the model a client
        downloaded)."""
        if origin is not None:
            layout, flat = flatten(upload)
            if not self.clients:
                self.layout = layout
            self._check(layout, f"client {client_id}")
            if origin.shape != flat.shape:
                raise ValueError(f"client {client_id}: the origin's {origin.numel()} values do not match the "
                                 f"upload's {flat.numel()}")
            self._buffer()
            self._accumulate(layout, flat.sub_(origin).mul_(float(weight)), f"client {client_id}")
        elif not self.clients:
            self.layout, self.single = layout_of(upload), upload  # the layout checks the upload now
        else:
            self._buffer()
            layout, leaves = layout_and_leaves(upload)
            self._check(layout, f"client {client_id}")
            assert self.total is not None and self.layout is not None
            self._writable()
            # tensor by tensor into the buffer: u·w in float64, then added, with no float64 copy of the whole upload
            named = isinstance(weight, dict)
            for (path, _, _), view, leaf in zip(self.layout, flat_views(self.layout, self.total), leaves):
                w = float(weight[path[0]] if named else weight)
                flat = leaf.detach().reshape(-1)
                if _exact_product(flat.dtype, w):  # u·w is exact in float64: fused or not, one rounding, the same bits
                    # through a float64 copy: torch's same-dtype add is vectorised, the mixed-dtype one is not
                    # (a 1.6 M-parameter upload: 1.8 against 2.6 ms here)
                    view.add_(flat.to(torch.float64), alpha=w)
                else:  # the two roundings of a float64 copy's ``flat * w`` and ``add_``, never a fused multiply-add
                    view.add_(flat.to(torch.float64, copy=True).mul_(w))
        self.clients.append(int(client_id))
        self.weight = _add_weights(self.weight, weight)

    def merge(self, other: UploadSum) -> None:
        """Add another group's sum (the caller merges groups in group order)."""
        if not other.clients:
            return
        other._buffer()
        assert other.layout is not None and other.total is not None
        if not self.clients:
            self.layout = other.layout
        else:
            self._buffer()
        self._accumulate(other.layout, other.total.clone() if self.total is None else other.total,
                         f"clients {other.clients}")
        self.clients.extend(other.clients)
        self.weight = _add_weights(self.weight, other.weight)

    def add_results(self, results: Iterable[Any], weighting: str = "samples") -> UploadSum:
        """Add the finite results' uploads (``TrainResult``: ``client_id``, ``upload``, ``num_samples``, ``finite``)
        weighted by ``weighting``, in the order given (id order), dropping every result's upload (``{}``), so that
        only the sum travels on: one group's sum where it trained, or a split group's on the driver
        (``raysim.engine.plan.RoundSum``). Returns this sum."""
        for r in results:
            if r.finite:
                self.add(r.client_id, r.upload, client_weight(r.num_samples, weighting))
            r.upload = {}
        return self

    def mean(self, *, in_float64: bool = False) -> dict:
        """Σ weight·upload / Σ weight, as the upload's nested dict with its dtypes (``in_float64``: the float64
        values, uncast); {} when nothing was added."""
        self._buffer()
        if self.total is None:
            return {}
        assert self.layout is not None
        if isinstance(self.weight, dict):
            return self._tree(_per_entry(self.layout, self.total.clone(), self.weight, torch.Tensor.div_), in_float64)
        return self._tree(self.total / self.weight, in_float64)

    def sum(self, *, in_float64: bool = False) -> dict:
        """Σ weight·upload itself, as the upload's nested dict with its dtypes (``in_float64``: the float64
        values); {} when nothing was added. FedAsync's mix is such a sum, of weights (1 − α) and α."""
        self._buffer()
        if self.total is None:
            return {}
        assert self.layout is not None
        return self._tree(self.total.clone(), in_float64)

    def _tree(self, flat: torch.Tensor, in_float64: bool) -> dict:
        assert self.layout is not None
        if in_float64:
            return unflatten(tuple((path, shape, torch.float64) for path, shape, _ in self.layout), flat)
        return unflatten(self.layout, flat)


def _per_entry(layout: Layout, flat: torch.Tensor, weight: Any, op: Callable) -> torch.Tensor:
    """``op(flat, weight)`` in place (multiply or divide): by one number, or each top-level entry's view by its
    own."""
    if not isinstance(weight, dict):
        return op(flat, weight)
    for (path, _, _), view in zip(layout, flat_views(layout, flat)):
        op(view, weight[path[0]])
    return flat


def _add_weights(a: Any, b: Any) -> Any:
    """Σ weight, one number or one per top-level entry."""
    if isinstance(b, dict):
        base = a if isinstance(a, dict) else {}
        return {k: base.get(k, 0.0) + float(v) for k, v in b.items()}
    return a + float(b)


def fixed_groups(clients: Sequence[int], size: int) -> list[list[int]]:
    """The round's clients in id order, cut into consecutive groups of ``size`` (the last may be shorter)."""
    ordered = sorted(int(c) for c in clients)
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


WEIGHTINGS = ("samples", "uniform")  # a client's weight in a sum: its training samples, or 1


@dataclass(frozen=True)
class Uploads:
    """What an algorithm's clients upload and how its server step reads them, declared once on the class
    (``Algorithm.uploads``); the engine infers nothing from which hooks a class overrides, and every capability
    follows from this declaration (with ``Algorithm.shared``, ``server_history`` and ``server_train``):

    - :meth:`model`: each upload is the client's copy of (some of) the entries of the shared payload's ``"model"``
      it downloaded, and the server step reads only their weighted mean, as a model to move to (FedAvg sets it,
      FedOpt steps towards it). Summed where the clients trained; DP-FedAvg clips the upload's change from the
      download; FedAsync and FedBuff, and a robust rule (with ``shared = "all"``), give the server step its model
      instead of the mean.
    - :meth:`mean`: the server step reads only the uploads' weighted mean, which is not such a model (a local
      part changes what is uploaded or how the mean is used: FedBN, FedNova, FedRoD): summed where they trained.
    - :meth:`stats`: named statistics, each the weighted mean of the upload's entry of that name with its own
      weights (SCAFFOLD: the models by samples, the control variates' changes uniformly): summed where the clients
      trained, entry by entry; ``updates.mean()`` is ``{name: its mean}``.
    - :meth:`apart`: ``server_aggregate`` reads every upload (FedCDA, FedPAC, FedGen, FedProto, ...).

    A weighting is ``samples`` (each client's training samples, FedAvg's n_k / n) or ``uniform`` (1 each); the
    config's ``algorithm.weighting`` replaces the declared one of a model or a mean, and of a statistic declared
    ``"algorithm"`` (samples when the config sets none)."""

    kind: str  # model | mean | stats | apart
    weighting: str = "samples"
    statistics: tuple[tuple[str, str], ...] = ()  # stats: (the upload's top-level key, its weighting)

    @staticmethod
    def model(weighting: str = "samples") -> Uploads:
        return Uploads("model", weighting)

    @staticmethod
    def mean(weighting: str = "samples") -> Uploads:
        return Uploads("mean", weighting)

    @staticmethod
    def stats(**weightings: str) -> Uploads:
        return Uploads("stats", "samples", tuple(weightings.items()))

    @staticmethod
    def apart() -> Uploads:
        return Uploads("apart")

    @property
    def summed(self) -> bool:
        """The uploads matter only through their weighted sums (which may be taken where the clients trained)."""
        return self.kind != "apart"

    @property
    def honours_weighting(self) -> bool:
        """``algorithm.weighting`` changes a weight of these sums."""
        return self.kind in ("model", "mean") or any(w == "algorithm" for _, w in self.statistics)

    def weights(self, chosen: Optional[str]) -> str | dict[str, str]:
        """The weighting of the round's sum (:func:`client_weight`'s), given ``algorithm.weighting`` (None: unset):
        one for the whole upload, or one per statistic."""
        if self.kind == "stats":
            return {name: (chosen or "samples") if w == "algorithm" else w for name, w in self.statistics}
        return chosen or self.weighting


def client_weight(num_samples: int, weighting: str | dict[str, str]) -> float | dict[str, float]:
    """A client's weight in the round's sum: its training samples (``samples``) or 1 (``uniform``); with one
    weighting per statistic, one weight each."""
    if isinstance(weighting, dict):
        return {name: float(num_samples) if w == "samples" else 1.0 for name, w in weighting.items()}
    return float(num_samples) if weighting == "samples" else 1.0


def sum_in_groups(updates: Iterable[Any], clients: Sequence[int], size: int, weighting: str = "samples") -> UploadSum:
    """The same sum from per-client updates (``client_id``, ``upload``, ``num_samples``) on the driver: grouped as
    :func:`fixed_groups` groups ``clients``, summed in id order within a group and merged in group order across
    groups, exactly as the workers and the driver's fold of their sums would."""
    index = {c: i // size for i, c in enumerate(sorted(int(c) for c in clients))}
    groups: dict[int, UploadSum] = {}
    for u in sorted(updates, key=lambda u: u.client_id):
        groups.setdefault(index[u.client_id], UploadSum()).add(u.client_id, u.upload,
                                                               client_weight(u.num_samples, weighting))
    total = UploadSum()
    for g in sorted(groups):
        total.merge(groups[g])
    return total


def weighted_average(uploads: list[dict], weights: Sequence[float | dict[str, float]]) -> dict:
    """Σ_i w_i·u_i / Σ_i w_i of (nested dicts of) tensors, summed in the order given (client-id order) by the one
    :class:`UploadSum`, so an algorithm's own means take the engine's arithmetic: each tensor cast back to its
    dtype (integers rounded)."""
    total = UploadSum()
    for i, (upload, weight) in enumerate(zip(uploads, weights)):
        total.add(i, upload, weight)
    return total.mean()
