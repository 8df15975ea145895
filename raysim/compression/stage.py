"""Communication compression as a stage of the round (``raysim.stages``; the ``compression`` config section).

- **Uploads** (``compression.up``): each client's part encodes its upload where it trained, after DP-FedAvg's clip
  and before secure aggregation's mask and any partial sum (:class:`_CompressPart`): a model entry as its change
  from the model the client downloaded, any other floating entry as it is, each tensor with the compressor of
  :mod:`raysim.compression.codecs`; the upload goes on as the server decodes it (the download plus the decoded
  change), so the one sum, the server step and every executor see what the server would. ``bytes_up`` and the
  simulated clock count the encoding's exact bytes (``ClientPart.upload_bytes``).
- **Error feedback** (``compression.error_feedback``; Stich, Cordonnier and Jaggi, NeurIPS 2018, "Sparsified SGD
  with Memory"; Karimireddy et al., ICML 2019, "Error Feedback Fixes SignSGD"): the client sends C(x + e) and keeps
  e ← x + e − C(x + e), what its compressor dropped, as its own state in the client state store
  (``ClientPart.keep``/``restore``): checkpointed, held outside the workers, there after a lost node, never seen by
  the algorithm's hooks.
- **Downloads** (``compression.down``): the round's shared model as the clients get it, float16 or QSGD-quantised
  once a round (draws from (seed, round)), counted the same way (``Stage.download``/``download_bytes``). The
  server keeps its own model at full precision; evaluation reads that.

Where it sits: after DP-FedAvg (``privacy.enabled``), which clips the delta first, so what is compressed is the
clipped delta and the noise is calibrated to what is sent: every encoding here is scaled to at most the norm of
what it encodes (top-k, random-k and the scaled sign never grow it; a QSGD draw can, and is scaled back, which
changes no byte), so the sum's sensitivity stays the clip norm; error feedback, which adds back earlier rounds'
dropped mass, is refused with DP-FedAvg. Before secure aggregation, which masks last: under it QSGD rounds onto
the shared scale ``secagg.range`` (no per-client norm, which no ring could add) so that its levels are what the
ring sums, and the other encodings are sent dense in the ring (a masked vector has no zeros to leave out).

FedPAQ (Reisizadeh et al., AISTATS 2020) is a configuration of these: FedAvg with ``train.local_epochs`` local
passes, a sampled cohort, and ``compression.up: qsgd`` (``experiments/compression/fedpaq.yaml``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import torch

from raysim.compression import codecs
from raysim.errors import UserError
from raysim.seeds import COMPRESS_DOWN_STREAM, COMPRESS_STREAM, job_seed
from raysim.stages import ClientPart, Stage, StageSetup
from raysim.trees import all_finite, change_reference, nbytes

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

SEED_BYTES = 8  # random-k: the positions travel as the seed they are drawn from


def _norm(tree: Any) -> float:
    return math.sqrt(sum(float(t.detach().to(torch.float64).pow(2).sum()) for t in _float_leaves(tree)))


def _float_leaves(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree] if tree.is_floating_point() else []
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _float_leaves(v)]
    return []


def _scaled(tree: Any, factor: float) -> Any:
    if isinstance(tree, torch.Tensor):
        return (tree.to(torch.float64) * factor).to(tree.dtype) if tree.is_floating_point() else tree
    if isinstance(tree, dict):
        return {k: _scaled(v, factor) for k, v in tree.items()}
    return tree


class Compressor:
    """One tensor's encoding under ``compression.up`` (or ``down``), its draws from ``gen``."""

    def __init__(self, kind: str, cfg: ExperimentConfig, gen: torch.Generator, bits: Optional[int] = None):
        c = cfg.compression
        self.kind, self.ratio, self.bucket, self.gen = kind, c.ratio, c.bucket, gen
        self.bits = bits if bits is not None else c.bits
        # under secure aggregation QSGD's levels are summed in the ring: one scale for every client
        self.scale = float(cfg.secagg.range) if cfg.secagg.enabled and kind == "qsgd" else None

    def __call__(self, x: torch.Tensor) -> codecs.Encoded:
        if self.kind == "topk":
            return codecs.top_k(x, self.ratio)
        if self.kind == "randk":
            return codecs.random_k(x, self.ratio, self.gen)
        if self.kind == "qsgd":
            return codecs.qsgd(x, self.bits, self.bucket, self.gen, scale=self.scale)
        if self.kind == "sign":
            return codecs.scaled_sign(x)
        if self.kind == "half":
            return codecs.half(x)
        raise ValueError(f"compression: unknown encoding {self.kind!r}")

    @property
    def extra_bytes(self) -> int:
        """Bytes an upload carries once, beside its tensors' encodings (random-k's seed)."""
        return SEED_BYTES if self.kind == "randk" else 0


class _CompressPart(ClientPart):
    """One client's upload, encoded where it trained (see the module docstring); with error feedback its residual
    comes in (``restore``) and goes back to the client state store (``keep``)."""

    def __init__(self, cfg: ExperimentConfig, job: Any):
        gen = torch.Generator().manual_seed(job_seed(cfg.seed, job.client_id, job.round, COMPRESS_STREAM,
                                                     *job.stream))
        self.encode = Compressor(cfg.compression.up, cfg, gen)
        self.feedback = bool(cfg.compression.error_feedback)
        self.cap = bool(cfg.privacy.enabled)  # keep the clipped delta's norm bound (DP-FedAvg's sensitivity)
        self.residual: Optional[dict] = None
        self.kept: Optional[dict] = None
        self.bytes: Optional[int] = None
        self.clamped = 0  # values past QSGD's shared scale (under secure aggregation), which it clamps

    def restore(self, state: Any) -> None:
        self.residual = state if isinstance(state, dict) else None

    def keep(self) -> Any:
        return self.kept

    def upload_bytes(self, n: int) -> int:
        return self.bytes if self.bytes is not None else n

    def upload(self, upload: dict, shared: dict) -> dict:
        if not all_finite(upload):  # a diverged client: its upload goes as it is, to be stopped or skipped
            return upload
        model = shared.get("model") or {}
        out: dict = {}
        kept: dict = {}
        total = self.encode.extra_bytes
        for key, value in upload.items():
            ref = change_reference(key, value, model)
            ref = ref.detach().to("cpu", value.dtype) if ref is not None else None
            sent = value - ref if ref is not None else value
            past = self.residual.get(key) if self.residual is not None else None
            decoded, nbytes_, left = self._encode(sent, past)
            if self.cap and _float_leaves(decoded):
                limit, norm = _norm(sent), _norm(decoded)
                if norm > limit:
                    decoded = _scaled(decoded, limit / norm)
            total += nbytes_
            if left is not None:
                kept[key] = left
            out[key] = ref + decoded if ref is not None else decoded
        self.bytes = int(total)
        self.kept = kept if self.feedback else None
        return out

    def _encode(self, tree: Any, past: Any) -> tuple[Any, int, Any]:
        """(the tree as decoded, its bytes, what error feedback keeps of it)."""
        if isinstance(tree, dict):
            out, left, total = {}, {}, 0
            for k, v in tree.items():
                out[k], nb, rest = self._encode(v, past.get(k) if isinstance(past, dict) else None)
                total += nb
                if rest is not None:
                    left[k] = rest
            return out, total, left
        if not isinstance(tree, torch.Tensor):
            return tree, nbytes(tree), None
        if not tree.is_floating_point():
            return tree, tree.numel() * tree.element_size(), None
        x = tree
        if self.feedback and isinstance(past, torch.Tensor) and past.shape == x.shape:
            x = x + past.to(x.dtype)
        if self.encode.scale is not None:
            self.clamped += int(torch.count_nonzero(x.detach().abs() > self.encode.scale))
        value, size = self.encode(x)
        return value, size, (x - value if self.feedback else None)

    def report(self, seen: int) -> Any:
        return {"clamped": self.clamped} if self.encode.scale is not None else None


class CompressionStage(Stage):
    """See the module docstring: the upload's part on every process, the download's encoding on the driver."""

    name = "compression"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self._down: Optional[tuple[int, int]] = None  # (round, the bytes of that round's encoded download)

    def check(self, setup: StageSetup) -> None:
        from raysim.algorithms.base import Algorithm

        if self.cfg.compression.down != "off" and type(setup.algorithm).client_payload is not Algorithm.client_payload:
            raise UserError(f"config key 'compression.down': {self.cfg.algorithm.name} sends each client a payload of "
                            f"its own (client_payload) beside the shared model, which compression.down does not "
                            f"encode; set compression.down=off")

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _CompressPart(self.cfg, job) if self.cfg.compression.up != "off" else None

    def download(self, shared: dict, rnd: int) -> dict:
        c = self.cfg.compression
        model = shared.get("model")
        if c.down == "off" or not model:
            return shared
        gen = torch.Generator().manual_seed(job_seed(self.cfg.seed, 0, rnd, COMPRESS_DOWN_STREAM))
        encode = Compressor(c.down, self.cfg, gen, bits=c.down_bits)
        encode.scale = None  # the download is no ring's: QSGD with its own norms
        sent, size = {}, 0
        for key, value in model.items():
            sent[key], nb = encode(value) if isinstance(value, torch.Tensor) else (value, nbytes(value))
            size += nb
        self._down = (rnd, nbytes(shared) - nbytes(model) + size)
        return {**shared, "model": sent}

    def download_bytes(self, n: int, rnd: int) -> int:
        return self._down[1] if self._down is not None and self._down[0] == rnd else n

    def round_metrics(self, ctx: Any, results: list) -> dict[str, Any]:
        """Under secure aggregation, QSGD's values past the shared scale ``secagg.range`` (clamped to it): a
        scale too small for the round's changes shows here."""
        counts = [r.stage[self.name]["clamped"] for r in results if self.name in r.stage]
        return {"compression/clamped": sum(counts)} if counts else {}


def compression_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return CompressionStage(cfg) if cfg.compression.on else None
