"""Secure aggregation's arithmetic, for real, on numpy arrays (Bonawitz et al., CCS 2017, "Practical Secure
Aggregation for Privacy-Preserving Machine Learning"; SecAgg+: Bell et al., CCS 2020, "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead"; checked against Flower's SecAgg+
(``framework/py/flwr/client/mod/secure_aggregation/secaggplus_mod.py`` and the server's
``secaggplus_workflow.py``) and FLSim's fixed point (``flsim/secure_aggregation/secure_aggregator.py``).

- **Fixed point** (:func:`fixed_point`): a value clamped to [-R, R] becomes the whole number round(v / step); a
  client's weight w (its training samples, or 1) multiplies it there, so the ring sums Σ w_i q_i and the weights
  Σ w_i beside them, and the server divides once (Bonawitz et al. sum weighted inputs the same way).
- **The ring** Z_(2**b) (:func:`to_ring`, :func:`from_ring`): two's complement modulo 2**b; a sum whose true value
  lies in [-2**(b-1), 2**(b-1)) is read back exactly, which the config and the stage check before round 1.
- **Masks** (:func:`masked`): y_u = w_u q_u + PRG(b_u) + Σ_(v in N(u), u < v) PRG(s_uv) − Σ_(v in N(u), v < u) PRG(s_uv)
  mod 2**b, PRG a PCG64 stream of uniform ring elements. Over the survivors S the pairwise masks between two
  survivors cancel exactly; :func:`unmask` removes each survivor's self mask and, for each dropped client d, its
  pairwise masks with its surviving neighbours, as the server does with the seeds it reconstructs from the
  survivors' shares (double masking).
- **Simulated, not cryptographic**: the key agreement and the secret sharing. Each pairwise seed s_uv and self
  seed b_u is derived from (run seed, round, clients, :data:`raysim.seeds.SECAGG_STREAM`) instead of
  Diffie-Hellman, and "reconstructing" a secret is recomputing that seed once at least t of its holders survive
  (:func:`unrecoverable`); no Shamir shares are computed. Everything the server adds and subtracts is real.
- **The graph**: SecAgg's is complete; SecAgg+'s (``secagg.neighbours`` = k) joins each client to the k/2 before
  and after it on a ring of the round's clients in a seeded random order (a Harary graph, as Bell et al.; Flower
  builds the same from a shuffled list).
- **Traffic** (:func:`traffic`): Bonawitz et al. §7.1 give a client's data transfer as 2n a_K + (5n − 4) a_S + m R
  bits for n clients, m coordinates of R bits and a_K = a_S = 256-bit keys and shares (their 1.73x expansion for
  2**10 clients, 2**20 coordinates and 16-bit inputs is this formula's). Here n is the client's neighbourhood with
  itself (k + 1 under SecAgg+, as Bell et al.'s O(log n + m)), split as sent (2 keys, 2 shares to each neighbour,
  n shares at unmasking, the masked vector) and received (the neighbours' 2 keys and 2 shares each).
- **Exact through the one sum**: a ring element travels as limbs of at most 32 bits in float64 (:func:`to_limbs`),
  so that the one sum (``raysim.algorithms.aggregation.UploadSum``) adds up to 2**21 of them exactly, on any
  executor and in any sum groups; :func:`from_limbs` carries them back into the ring.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from raysim.sections.secagg import LIMB_BITS
from raysim.seeds import SECAGG_STREAM, derive_seed

KEY_BITS = SHARE_BITS = 256  # a_K, a_S: a public key and a secret share (Bonawitz et al.'s 256-bit figures)
_PAIR, _SELF, _GRAPH = 1, 2, 3  # sub-tags of SECAGG_STREAM


def ring_mask(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1)


def fixed_point(values: np.ndarray, step: float, value_range: float) -> tuple[np.ndarray, int]:
    """(round(clamp(v, -R, R) / step) as int64, how many values the clamp changed: beyond R by more than half a
    step, so that they round to another whole number than they would unclamped)."""
    values = np.asarray(values, dtype=np.float64)
    clamped = int(np.count_nonzero(np.abs(values) > value_range + step / 2))
    return np.rint(np.clip(values, -value_range, value_range) / step).astype(np.int64), clamped


def to_ring(q: np.ndarray, bits: int) -> np.ndarray:
    """Whole numbers (int64) as ring elements: two's complement modulo 2**bits."""
    return np.ascontiguousarray(q, dtype=np.int64).view(np.uint64) & ring_mask(bits)


def from_ring(v: np.ndarray, bits: int) -> np.ndarray:
    """Ring elements read as whole numbers in [-2**(bits-1), 2**(bits-1)) (int64)."""
    v = np.asarray(v, dtype=np.uint64) & ring_mask(bits)
    if bits == 64:
        return v.view(np.int64)
    negative = (v >> np.uint64(bits - 1)) == 1
    magnitude = (ring_mask(bits) - v + np.uint64(1)) & ring_mask(bits)  # 2**bits - v, for the negative ones
    return np.where(negative, -magnitude.astype(np.int64), v.astype(np.int64))


def limbs(bits: int) -> int:
    """How many float64 limbs carry one ring element through the one sum."""
    return math.ceil(bits / LIMB_BITS)


def to_limbs(v: np.ndarray, bits: int) -> np.ndarray:
    """Ring elements as [len, limbs] float64 whole numbers below 2**32, lowest limb first."""
    parts = [((v >> np.uint64(LIMB_BITS * i)) & np.uint64(2 ** LIMB_BITS - 1)).astype(np.float64)
             for i in range(limbs(bits))]
    return np.stack(parts, axis=-1)


def from_limbs(summed: np.ndarray, bits: int) -> np.ndarray:
    """Ring elements from [len, limbs] float64 sums of limbs (each a whole number below 2**53)."""
    total = np.zeros(summed.shape[0], dtype=np.uint64)
    for i in range(summed.shape[1]):
        total += summed[:, i].astype(np.uint64) << np.uint64(LIMB_BITS * i)  # wraps modulo 2**64, as the ring does
    return total & ring_mask(bits)


def prg(seed: int, length: int, bits: int) -> np.ndarray:
    """``length`` uniform ring elements from a seed (PCG64's raw output masked to ``bits``: 2**bits divides 2**64)."""
    return np.random.PCG64(seed).random_raw(length) & ring_mask(bits)


def pair_seed(seed: int, rnd: int, u: int, v: int) -> int:
    """s_uv = s_vu: the pairwise mask's seed two clients would agree on (simulated key agreement)."""
    return derive_seed(seed, rnd, min(u, v), max(u, v), SECAGG_STREAM, _PAIR, bits=64)


def self_seed(seed: int, rnd: int, u: int) -> int:
    """b_u: client u's self mask's seed for round ``rnd``."""
    return derive_seed(seed, rnd, u, SECAGG_STREAM, _SELF, bits=64)


def neighbours_of(u: int, group: Sequence[int], k: Optional[int], seed: int, rnd: int) -> list[int]:
    """Client u's neighbours among the round's ``group`` (sorted): every other client (k None, or k >= |group| - 1),
    else the k/2 on each side of u on the ring of the group in a seeded random order."""
    n = len(group)
    if k is None or k >= n - 1:
        return [v for v in group if v != u]
    order = _order(group, seed, rnd)
    at = int(np.flatnonzero(order == u)[0])
    return sorted(int(order[(at + o) % n]) for o in range(-(k // 2), k // 2 + 1) if o != 0)


def graph(group: Sequence[int], k: Optional[int], seed: int, rnd: int) -> dict[int, list[int]]:
    """Every client's neighbours (see :func:`neighbours_of`), computed once."""
    n = len(group)
    if k is None or k >= n - 1:
        return {u: [v for v in group if v != u] for u in group}
    order = _order(group, seed, rnd)
    return {int(order[at]): sorted(int(order[(at + o) % n]) for o in range(-(k // 2), k // 2 + 1) if o != 0)
            for at in range(n)}


def _order(group: Sequence[int], seed: int, rnd: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rnd, SECAGG_STREAM, _GRAPH])
    return np.asarray(group, dtype=np.int64)[rng.permutation(len(group))]


def masked(v: np.ndarray, u: int, peers: Sequence[int], seed: int, rnd: int, bits: int) -> np.ndarray:
    """Client u's masked vector: its ring elements ``v`` plus its self mask and its pairwise masks with ``peers``
    (added towards a higher id, subtracted towards a lower), modulo 2**bits."""
    out = (v + prg(self_seed(seed, rnd, u), len(v), bits)) & ring_mask(bits)
    for p in peers:
        mask = prg(pair_seed(seed, rnd, u, p), len(v), bits)
        out = out + mask if u < p else out - mask  # uint64 wraps modulo 2**64, a multiple of 2**bits
    return out & ring_mask(bits)


def unmask(total: np.ndarray, survivors: Sequence[int], dropped: Sequence[int], peers: dict[int, list[int]],
           seed: int, rnd: int, bits: int) -> np.ndarray:
    """The survivors' plain ring sum from the sum of their masked vectors: each survivor's self mask removed, and
    each dropped client's pairwise masks with its surviving neighbours (the pairs of survivors cancel)."""
    alive = set(survivors)
    out = np.array(total, dtype=np.uint64)
    for u in survivors:
        out -= prg(self_seed(seed, rnd, u), len(out), bits)
    for d in dropped:
        for u in peers.get(d, []):
            if u in alive:
                mask = prg(pair_seed(seed, rnd, u, d), len(out), bits)
                out = out - mask if u < d else out + mask  # undo what u added towards d
    return out & ring_mask(bits)


def unrecoverable(group: Sequence[int], survivors: Sequence[int], peers: dict[int, list[int]],
                  threshold: float) -> Optional[tuple[int, int, int]]:
    """The first client whose secret the server cannot reconstruct, as (client, surviving holders, shares needed),
    or None: a client's secrets are shared among its neighbours and itself, and t = ceil(threshold x holders) of
    them must survive (a survivor's self mask seed, a dropped client's key)."""
    alive = set(survivors)
    for u in group:
        holders = [u, *peers.get(u, [])]
        need = max(1, math.ceil(threshold * len(holders) - 1e-9))
        have = sum(1 for h in holders if h in alive)
        if have < need:
            return u, have, need
    return None


def traffic(peers: int, coordinates: int, bits: int) -> tuple[int, int]:
    """(bytes a client sends, bytes it receives) in one round of the protocol with ``peers`` neighbours and a masked
    vector of ``coordinates`` ring elements (Bonawitz et al. §7.1's total, split by direction; see the module
    docstring)."""
    n = peers + 1
    up = 2 * KEY_BITS + (3 * n - 2) * SHARE_BITS + coordinates * bits
    down = 2 * (n - 1) * KEY_BITS + 2 * (n - 1) * SHARE_BITS
    return math.ceil(up / 8), math.ceil(down / 8)
