"""The ``secagg`` config section: secure aggregation of the round's uploads (``raysim.secagg.stage``).

Off by default (``secagg.enabled: false``): then no key here changes any number a run computes. Torch-free, like
every config section. The checks that need only the config are here (the ring, the fixed-point range for the most
clients a round can hold, what secure aggregation cannot serve); the one that needs the data (each client's weight
in the sum) is the stage's, before round 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from raysim.validate import is_finite as _number, is_whole

MAX_BITS = 64  # the ring's elements are held as uint64
LIMB_BITS = 32  # a ring element travels through the one (float64) sum as limbs of at most 32 bits
MAX_CLIENTS = 2 ** (53 - LIMB_BITS)  # so that a round's sum of limbs, each below 2**32, stays exact in float64
MAX_FRAC_BITS = 52  # a fixed-point step below 2**-52 of a value in [-R, R] is past float64's resolution


@dataclass
class SecAggConfig:
    # the server learns only the sum of the round's surviving clients' uploads (Bonawitz et al. 2017): each upload
    # is encoded in fixed point, masked where the client trained and unmasked on the sum
    enabled: bool = False
    bits: int = 32  # b: the ring Z_(2**b) the masked vectors live in (a masked coordinate's bits on the wire), 2..64
    # R: every value sent (a model entry's change from the download, any other entry as it is) is clamped to [-R, R]
    range: float = 4.0
    # f: the fixed point's fractional bits (a step of 2**-f); null: the most for which the round's weighted sum of
    # values in [-R, R] fits the ring
    frac_bits: Optional[int] = None
    # SecAgg+ (Bell et al. 2020): each client masks with this many others, its neighbours on a random ring-shaped
    # (Harary) graph of the round's clients (even, >= 2); null: with every other client (SecAgg)
    neighbours: Optional[int] = None
    # t as a share of a client's neighbours and itself: the shares a client's secrets (its self mask's seed, or
    # for a dropped client its key) need from surviving holders to be reconstructed, in (0, 1]
    threshold: float = 0.5

    @property
    def on(self) -> bool:
        return bool(self.enabled)


def max_round_clients(cfg: Any) -> int:
    """The most clients a round's group can hold: every client with Poisson sampling, the clients the simulated
    clock starts (over-selection included), else the cohort."""
    from raysim.sections.privacy import clients_per_round

    if cfg.privacy.enabled and cfg.privacy.sampling == "poisson":
        return int(cfg.clients.num)
    cohort = clients_per_round(cfg)
    if cfg.system.enabled and cfg.system.deadline_s is not None:
        from raysim.sections.system import selected_count

        return min(int(cfg.clients.num), selected_count(cohort, cfg.system.over_selection))
    return cohort


def levels_fit(bits: int, weight: float, levels: float) -> bool:
    """Whether a weighted sum of values in [-levels, levels] with total weight ``weight`` fits the signed range of
    the ring Z_(2**bits) without wrapping: weight x levels < 2**(bits-1)."""
    return weight * levels < 2 ** (bits - 1)


def auto_frac_bits(bits: int, value_range: float, weight: float) -> int:
    """The most fractional bits f (at most 52) for which ``weight`` x R x 2**f fits the ring (-1: not even f = 0)."""
    f = MAX_FRAC_BITS
    while f >= 0 and not levels_fit(bits, weight, value_range * 2.0 ** f):
        f -= 1
    return f


def check_secagg(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """Check ``cfg.secagg`` against the whole config; ``require(ok, key, why)`` refuses in one line."""
    s: SecAggConfig = cfg.secagg
    if not s.enabled:
        return
    require(is_whole(s.bits, 2) and s.bits <= MAX_BITS, "secagg.bits",
            f"the ring's bits must be a whole number from 2 to {MAX_BITS}, got {s.bits!r}")
    require(_number(s.range) and s.range > 0, "secagg.range", f"must be a finite bound > 0, got {s.range!r}")
    if s.frac_bits is not None:
        require(is_whole(s.frac_bits) and s.frac_bits <= MAX_FRAC_BITS, "secagg.frac_bits",
                f"must be a whole number from 0 to {MAX_FRAC_BITS} (or null: the most the ring holds), got "
                f"{s.frac_bits!r}")
    if s.neighbours is not None:
        require(is_whole(s.neighbours, 2) and s.neighbours % 2 == 0, "secagg.neighbours",
                f"SecAgg+'s neighbours on the ring-shaped graph must be an even number >= 2 (or null: every other "
                f"client), got {s.neighbours!r}")
    require(_number(s.threshold) and 0 < s.threshold <= 1, "secagg.threshold",
            f"must be a share in (0, 1], got {s.threshold!r}")
    _check_served(cfg, require)
    clients = max_round_clients(cfg)
    require(clients <= MAX_CLIENTS, "secagg.enabled",
            f"a round of up to {clients} clients: the masked sum stays exact for at most {MAX_CLIENTS}")
    # every client weighs at least 1, so the weights of a round's sum total at least its clients
    if cfg.compression.up == "qsgd":
        from raysim.sections.compression import qsgd_levels

        levels = qsgd_levels(cfg.compression.bits)
        require(levels_fit(s.bits, clients, levels), "secagg.bits",
                f"QSGD's levels -{levels}..{levels} summed over up to {clients} clients overflow the ring of "
                f"{s.bits} bits; raise secagg.bits to at least {math.ceil(math.log2(clients * levels + 1)) + 1}")
    elif s.frac_bits is not None:
        require(levels_fit(s.bits, clients, s.range * 2.0 ** s.frac_bits), "secagg.frac_bits",
                f"values in [-{s.range:g}, {s.range:g}] at {s.frac_bits} fractional bits, summed over up to "
                f"{clients} clients, overflow the ring of {s.bits} bits; lower secagg.frac_bits or secagg.range, or "
                f"raise secagg.bits (null: the most that fits)")
    else:
        require(auto_frac_bits(s.bits, s.range, clients) >= 0, "secagg.bits",
                f"values in [-{s.range:g}, {s.range:g}] summed over up to {clients} clients overflow the ring of "
                f"{s.bits} bits even as whole numbers; raise secagg.bits or lower secagg.range")


def _check_served(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """What secure aggregation cannot serve: anything that needs the individual uploads."""
    require(not cfg.aggregator.on, "secagg.enabled",
            f"the server sees only the masked sum, and aggregator.name={cfg.aggregator.name} reads each upload; use "
            f"aggregator.name=mean with secure aggregation")
    require(not cfg.attack.on_uploads, "secagg.enabled",
            f"attack.name={cfg.attack.name} changes uploads on the server, which sees only the masked sum; use an "
            f"attack on the data (label_flip, backdoor)")
    require(not cfg.asynchronous.on, "secagg.enabled",
            "the masks cancel over a synchronous round's clients; asynchronous.mode must be off")
    require(not (cfg.privacy.enabled and cfg.compression.up == "qsgd"), "secagg.enabled",
            "QSGD's rounding onto the ring's shared grid can grow a clipped delta past DP-FedAvg's clip norm; with "
            "privacy.enabled and secure aggregation use compression.up=topk, randk or sign")
    why = algorithm_refusal(cfg.algorithm.name)
    require(why is None, "secagg.enabled", f"the server sees only the masked sum, and {cfg.algorithm.name} {why}")


# the reasons of Algorithm.refusal("privacy") that are secure aggregation's too: each upload needed on the server
NEEDS_EACH_UPLOAD = ("Uploads.apart", "per-client history", "trains on the server")


def algorithm_refusal(name: str) -> Optional[str]:
    """Why algorithm ``name`` cannot have its uploads summed under masks (None: it can): it reads every upload of a
    round (``Uploads.apart()``: FedCDA, FedPAC, ...), keeps each client's uploads on the server, or trains on the
    server from them. A built-in answers from the torch-free table (``raysim.capabilities``: its
    DP-FedAvg refusal, of which these are the reasons that need each upload), a plugin's from its class."""
    from raysim.capabilities import FEATURES, TABLE

    row = TABLE.get(name)
    if row is None:
        from raysim.registry import get_algorithm

        cls: Any = get_algorithm(name)
        if cls.declared_uploads().kind == "apart":
            return "reads every upload of a round (Algorithm.uploads = Uploads.apart())"
        if cls.server_history > 0:
            return "keeps per-client history on the server"
        if cls.server_train.__qualname__ != "Algorithm.server_train":
            return "trains on the server from the uploads"
        return None
    why = row[FEATURES.index("privacy")]
    return why if why is not None and any(reason in why for reason in NEEDS_EACH_UPLOAD) else None
