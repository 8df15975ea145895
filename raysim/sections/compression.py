"""The ``compression`` config section: what a client's upload (``compression.up``) and the round's download
(``compression.down``) take on the wire (``raysim.compression.stage``).

Off by default (``compression.up: off``, ``compression.down: off``): then no key here changes any number a run
computes. Torch-free, like every config section, so a config loads without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from raysim.validate import is_finite as _number, is_whole

UP = ("off", "topk", "randk", "qsgd", "sign")
DOWN = ("off", "half", "qsgd")
MAX_BITS = 32


@dataclass
class CompressionConfig:
    # each client's upload, encoded where it trained, before any partial sum: off | topk (the k largest magnitudes,
    # Aji and Heafield 2017) | randk (k coordinates drawn from (seed, client, round)) | qsgd (stochastic
    # quantisation at 2**(bits-1) - 1 levels a sign, Alistarh et al. 2017) | sign (the signs, scaled by the mean
    # magnitude, Karimireddy et al. 2019). A model entry is sent as its change from the model downloaded, each
    # tensor encoded on its own
    up: str = "off"
    ratio: float = 0.01  # topk, randk: the share of each tensor's entries sent, k = ceil(ratio x entries), in (0, 1]
    bits: int = 4  # qsgd: bits a coordinate, its sign included (2 to 32)
    bucket: int = 512  # qsgd: coordinates that share one norm (QSGD's bucketing)
    # what the compressor dropped is kept as the client's state and added to its next upload (Stich et al. 2018;
    # Karimireddy et al. 2019); in the client state store, checkpointed
    error_feedback: bool = False
    # the round's shared model as the clients download it: off | half (float16) | qsgd (down_bits a coordinate)
    down: str = "off"
    down_bits: int = 8  # down=qsgd: bits a coordinate (2 to 32)

    @property
    def on(self) -> bool:
        return self.up != "off" or self.down != "off"


def qsgd_levels(bits: int) -> int:
    """s, QSGD's levels a sign at ``bits`` bits a coordinate: the values -s..s fill 2**bits - 1 codes."""
    return 2 ** (bits - 1) - 1


def check_compression(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """Check (and normalise) ``cfg.compression`` against the whole config; ``require(ok, key, why)`` refuses in one
    line."""
    c: CompressionConfig = cfg.compression
    for key in ("up", "down"):  # YAML reads a bare off as false
        if str(getattr(c, key)) in ("False", "false"):
            setattr(c, key, "off")
    require(c.up in UP, "compression.up", f"must be one of {', '.join(UP)}, got {c.up!r}")
    require(c.down in DOWN, "compression.down", f"must be one of {', '.join(DOWN)}, got {c.down!r}")
    if c.up in ("topk", "randk"):
        require(_number(c.ratio) and 0 < c.ratio <= 1, "compression.ratio",
                f"k, the share of each tensor's entries sent, must be in (0, 1], got {c.ratio!r}")
    if c.up == "qsgd":
        _check_bits(c.bits, "compression.bits", require)
        require(is_whole(c.bucket, 1), "compression.bucket", f"must be a whole number >= 1, got {c.bucket!r}")
    if c.down == "qsgd":
        _check_bits(c.down_bits, "compression.down_bits", require)
        require(is_whole(c.bucket, 1), "compression.bucket", f"must be a whole number >= 1, got {c.bucket!r}")
    if c.error_feedback:
        require(c.up != "off", "compression.error_feedback",
                "keeps what the upload's compressor dropped; set compression.up (topk, randk, qsgd or sign)")
        require(not cfg.privacy.enabled, "compression.error_feedback",
                "adds back what earlier rounds' compressors dropped, outside the clipped delta whose norm bounds "
                "DP-FedAvg's sensitivity; turn it off with privacy.enabled")


def _check_bits(bits: Any, key: str, require: Callable[[bool, str, str], None]) -> None:
    require(is_whole(bits, 1) and bits <= MAX_BITS, key, f"must be a whole number of bits from 1 to {MAX_BITS}, "
            f"got {bits!r}")
    require(bits >= 2, key, "QSGD needs a bit for the sign and at least one for the level (s = 2**(bits-1) - 1 "
            "levels); for one bit a coordinate use compression.up=sign")
