"""Secure aggregation as a stage of the round (``raysim.stages``; the ``secagg`` config section): the server learns
only the sum of the round's surviving clients' uploads.

- **On the client** (:class:`_MaskPart`, last of the client parts, before any partial sum): the upload, after
  DP-FedAvg's clip and compression, in fixed point in the ring Z_(2**b) (a model entry as its change from the model
  downloaded, the others as they are; each value clamped to [-R, R] and times the client's weight), then masked
  with its self mask and its pairwise masks with its neighbours in the round's group
  (:mod:`raysim.secagg.ring`). What travels on, and what the workers sum, is the masked vector (as exact float64
  limbs). ``bytes_up`` and the simulated clock count the masked vector at b bits a coordinate plus the protocol's
  messages, ``bytes_down`` the messages each client receives (:func:`raysim.secagg.ring.traffic`).
- **The group** is the round's clients as the schedule starts them (``Stage.begin_round``: with the simulated
  clock, the clients that drop out too); every job carries it (``job_params``). A client that started and did not
  report (dropped out, left mid-job, late past the deadline or the report timeout, non-finite and skipped) is
  dropped: the server removes its pairwise
  masks through its surviving neighbours, once t of each secret's holders survive (else the round cannot be
  unmasked and the run stops in one line).
- **On the server** (:meth:`SecAggStage.decode`, before any release reads the sum): the one sum of masked vectors
  carried back into the ring, unmasked, read as signed whole numbers and divided by the step, with the weights'
  sum from the ring beside it: the plain weighted sum, which DP-FedAvg's noise (``privacy.enabled``) or the mean
  then finish. Every client weighs 1 in the sum the engine takes (``weighting``): the weight is inside the ring.
- **Under QSGD** (``compression.up: qsgd``) the step is R / s, so the QSGD levels (rounded onto the shared scale R
  by the compression stage) are what the ring sums, and a ring of b ≈ bits + log2(weights) carries them.

The key agreement and the secret sharing are simulated (seeded, not cryptographic); the arithmetic is real: see
:mod:`raysim.secagg.ring`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from raysim.algorithms.aggregation import UploadSum, client_weight
from raysim.errors import RunStopped, UserError
from raysim.secagg import ring
from raysim.sections.secagg import auto_frac_bits, levels_fit, max_round_clients
from raysim.stages import ClientPart, RoundContext, Stage, StageSetup, build_stages
from raysim.trees import all_finite, change_reference

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

WEIGHT = "#weight"  # the key of a client's weight in its masked upload (no state-dict key holds a '#')


@dataclass(frozen=True)
class RoundGroup:
    """What every job of a round carries: the round's group (sorted), the fixed-point step, and the weighting of
    the sum the masks protect."""

    round: int
    group: tuple[int, ...]
    step: float
    weighting: Any  # str, or {statistic: str}


def _ints(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().reshape(-1).to(torch.int64).numpy()


class _MaskPart(ClientPart):
    """One client's upload in fixed point, times its weight, masked (see the module docstring)."""

    def __init__(self, cfg: ExperimentConfig, job: Any, keys: RoundGroup):
        self.cfg, self.client, self.keys = cfg, int(job.client_id), keys
        self.ctx: Any = None
        self.clamped = 0
        self.coordinates: Optional[int] = None
        self.peers = 0

    def setup(self, ctx: Any) -> None:
        self.ctx = ctx

    def upload(self, upload: dict, shared: dict) -> dict:
        if not all_finite(upload):  # a diverged client: its upload goes as it is, to be stopped or skipped
            return upload
        s, keys = self.cfg.secagg, self.keys
        if self.client not in keys.group:
            raise RuntimeError(f"secure aggregation: client {self.client} trained in round {keys.round} but is not "
                               f"in its group")
        weight = client_weight(len(self.ctx.train_data[1]), keys.weighting)
        model = shared.get("model") or {}
        values: list[np.ndarray] = []
        tree: dict = {}
        for key, value in upload.items():
            w = int(weight[key] if isinstance(weight, dict) else weight)
            tree[key] = self._encode(value, change_reference(key, value, model), w, values)
            if isinstance(weight, dict):  # each statistic's weight beside it (its top-level key weighs it)
                tree[key][WEIGHT] = self._leaf(np.array([w], dtype=np.int64), (1,), torch.int64, values)
        if not isinstance(weight, dict):
            tree[WEIGHT] = self._leaf(np.array([int(weight)], dtype=np.int64), (1,), torch.int64, values)
        flat = ring.to_ring(np.concatenate(values) if values else np.zeros(0, np.int64), s.bits)
        peers = ring.neighbours_of(self.client, keys.group, s.neighbours, self.cfg.seed, keys.round)
        limbs = torch.from_numpy(ring.to_limbs(ring.masked(flat, self.client, peers, self.cfg.seed, keys.round,
                                                           s.bits), s.bits))
        self.coordinates, self.peers = len(flat), len(peers)
        return _fill(tree, iter(torch.split(limbs, [int(np.prod(t[0])) for t in _shapes(tree)])))

    def _encode(self, value: Any, ref: Any, weight: int, values: list) -> Any:
        if isinstance(value, dict):
            return {k: self._encode(v, None, weight, values) for k, v in value.items()}
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"secure aggregation sums tensors; an upload holds a {type(value).__name__}")
        shape = tuple(value.shape)
        if value.is_floating_point():
            x = value.detach().cpu().to(torch.float64)
            if ref is not None:
                x = x - ref.detach().cpu().to(torch.float64)
            q, clamped = ring.fixed_point(x.reshape(-1).numpy(), self.keys.step, self.cfg.secagg.range)
            self.clamped += clamped
        else:  # whole numbers (a batch norm's counter) as they are
            q = _ints(value) - (_ints(ref) if ref is not None else 0)
        return self._leaf(q * weight, shape, value.dtype, values)

    @staticmethod
    def _leaf(q: np.ndarray, shape: tuple, dtype: torch.dtype, values: list) -> dict:
        """A leaf of the masked tree: {dtype name: placeholder of its shape}, its whole numbers queued in order."""
        values.append(np.asarray(q, dtype=np.int64).reshape(-1))
        return {str(dtype).removeprefix("torch."): shape}

    def upload_bytes(self, n: int) -> int:
        if self.coordinates is None:
            return n
        return ring.traffic(self.peers, self.coordinates, self.cfg.secagg.bits)[0]

    def report(self, seen: int) -> Any:
        return {"clamped": self.clamped}


def _shapes(tree: Any) -> list[tuple]:
    """The placeholders' shapes in the tree's order (what ``_fill`` replaces)."""
    if isinstance(tree, dict):
        return [s for v in tree.values() for s in _shapes(v)]
    return [(tree,)]


def _fill(tree: Any, parts: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _fill(v, parts) for k, v in tree.items()}
    limbs = next(parts)
    return limbs.reshape(*tree, limbs.shape[-1]).clone()  # its own storage: a view would pickle the whole vector


class SecAggStage(Stage):
    """See the module docstring: the group and the step on the driver, the mask on every process, the unmasking
    here."""

    name = "secagg"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self._group: Optional[tuple[int, tuple[int, ...]]] = None  # (round, its group)
        self.step = 1.0
        self.sum_weighting: Any = "samples"  # the algorithm's, after the stages before this one

    # ------------------------------------------------------------------ before round 1
    def check(self, setup: StageSetup) -> None:
        from raysim.algorithms.base import Algorithm

        cfg, s = self.cfg, self.cfg.secagg
        if type(setup.algorithm).client_payload is not Algorithm.client_payload:
            raise UserError(f"config key 'secagg.enabled': {cfg.algorithm.name} sends each client a payload of its "
                            f"own (client_payload), whose bytes secure aggregation's traffic cannot be told from")
        weighting = setup.algorithm.sum_weighting
        for stage in build_stages(cfg):
            if stage.name == self.name:
                break
            weighting = stage.weighting(weighting)
        self.sum_weighting = weighting
        total = self._most_weight(setup.data, weighting)
        if cfg.compression.up == "qsgd":
            from raysim.sections.compression import qsgd_levels

            levels = qsgd_levels(cfg.compression.bits)
            if not levels_fit(s.bits, total, levels):
                raise UserError(f"config key 'secagg.bits': QSGD's levels times the weights of a round's sum (up to "
                                f"{total:g}) overflow the ring of {s.bits} bits; raise secagg.bits")
            self.step = s.range / levels
            return
        frac = s.frac_bits if s.frac_bits is not None else auto_frac_bits(s.bits, s.range, total)
        if frac < 0 or not levels_fit(s.bits, total, s.range * 2.0 ** frac):
            key = "secagg.frac_bits" if s.frac_bits is not None else "secagg.bits"
            raise UserError(f"config key '{key}': values in [-{s.range:g}, {s.range:g}] at {max(frac, 0)} fractional "
                            f"bits, times the weights of a round's sum (up to {total:g}, {weighting} weighting), "
                            f"overflow the ring of {s.bits} bits; raise secagg.bits, or lower secagg.range or "
                            f"secagg.frac_bits")
        self.step = 2.0 ** -frac

    def _most_weight(self, data: Any, weighting: Any) -> float:
        """The largest total weight a round's sum can have: its most clients, the heaviest ones."""
        clients = max_round_clients(self.cfg)
        kinds = set(weighting.values()) if isinstance(weighting, dict) else {weighting}
        if "samples" not in kinds:
            return float(clients)
        sizes = sorted((data.num_train(c) for c in range(self.cfg.clients.num)), reverse=True)
        return float(sum(sizes[:clients]))

    # ------------------------------------------------------------------ each round
    def weighting(self, weighting: Any) -> Any:
        """Every client weighs 1 in the engine's sum of masked vectors: its own weight is inside its ring vector."""
        return {k: "uniform" for k in weighting} if isinstance(weighting, dict) else "uniform"

    def begin_round(self, rnd: int, clients: list[int]) -> None:
        self._group = (rnd, tuple(sorted(int(c) for c in clients)))

    def job_params(self, rnd: int) -> Any:
        if self._group is None or self._group[0] != rnd:
            raise RuntimeError(f"secure aggregation needs round {rnd}'s group before its jobs (the schedule calls "
                               f"Stage.begin_round)")
        return RoundGroup(rnd, self._group[1], self.step, self.sum_weighting)

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _MaskPart(self.cfg, job, params) if params is not None else None

    def download_bytes(self, n: int, rnd: int) -> int:
        """The shared payload and the protocol's messages each client receives (its neighbours' keys and shares)."""
        if self._group is None or self._group[0] != rnd:
            return n
        return n + ring.traffic(self._peers(len(self._group[1])), 0, self.cfg.secagg.bits)[1]

    def _peers(self, size: int) -> int:
        k = self.cfg.secagg.neighbours
        return size - 1 if k is None else min(k, size - 1)

    def decode(self, total: UploadSum, ctx: RoundContext) -> UploadSum:
        """The plain weighted sum of the survivors' uploads from the sum of their masked vectors."""
        if not total.clients:
            return total
        s, rnd = self.cfg.secagg, ctx.round
        assert self._group is not None and self._group[0] == rnd, "secure aggregation: no group for this round"
        group = self._group[1]
        survivors = sorted(total.clients)
        dropped = sorted(set(group) - set(survivors))
        peers = ring.graph(group, s.neighbours, self.cfg.seed, rnd)
        missing = ring.unrecoverable(group, survivors, peers, s.threshold)
        if missing is not None:
            who, have, need = missing
            raise RunStopped(f"secure aggregation: round {rnd}: {have} of client {who}'s secret's holders survived, "
                             f"{need} needed, so the round's sum cannot be unmasked (lower secagg.threshold, or raise "
                             f"secagg.neighbours)")
        total._buffer()
        assert total.layout is not None and total.total is not None
        limbs = total.total.cpu().numpy().reshape(-1, ring.limbs(s.bits))
        plain = ring.from_ring(ring.unmask(ring.from_limbs(limbs, s.bits), survivors, dropped, peers,
                                           self.cfg.seed, rnd, s.bits), s.bits)
        return self._decoded(total, plain, ctx.shared.get("model") or {})

    def _decoded(self, total: UploadSum, plain: np.ndarray, model: dict) -> UploadSum:
        """The UploadSum of the plain uploads: Σ w_i u_i in float64 and Σ w_i, from the ring's whole numbers."""
        assert total.layout is not None
        entries, weights, at = [], {}, 0
        for path, shape, _ in total.layout:
            size = int(np.prod(shape[:-1]))
            values, at = plain[at:at + size], at + size
            dtype = getattr(torch, path[-1])
            where = tuple(path[:-1])
            if WEIGHT in where:
                weights[where[0]] = float(values[0])
            else:
                entries.append((where, tuple(shape[:-1]), dtype, values))
        layout, parts = [], []
        for where, shape, dtype, values in entries:
            w = weights.get(WEIGHT, weights.get(where[0], 0.0))
            summed = torch.from_numpy(values.astype(np.float64))
            if dtype.is_floating_point:
                summed = summed * self.step
            ref = change_reference(where[0], torch.empty(shape), model) if len(where) == 1 else None
            if ref is not None:
                summed = summed + w * ref.detach().cpu().to(torch.float64).reshape(-1)
            layout.append((where, shape, dtype))
            parts.append(summed)
        weight: Any = weights[WEIGHT] if WEIGHT in weights else {k: v for k, v in weights.items()}
        out = UploadSum(clients=list(total.clients), weight=weight, layout=tuple(layout),
                        total=torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64))
        return out

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        reported = {r.client_id for r in results}
        group = self._group[1] if self._group is not None and self._group[0] == ctx.round else ()
        return {"secagg/dropped": sum(1 for c in group if c not in reported),
                "secagg/clamped": sum(int(r.stage.get(self.name, {}).get("clamped", 0)) for r in results)}


def secagg_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return SecAggStage(cfg) if cfg.secagg.enabled else None
