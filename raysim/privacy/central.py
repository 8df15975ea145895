"""DP-FedAvg (McMahan et al., ICLR 2018) with adaptive clipping (Andrew et al., NeurIPS 2021).

- On the worker, where the client trained (:func:`clip_upload`, called by ``ClientJobs.finish`` before any partial
  sum): the upload minus the model the client downloaded is the client's delta Δ; it is scaled to L2 norm at most S
  (over its floating-point entries) and replaces the upload, beside ±1/2 for whether it was left unclipped (the
  centred count b_i − 1/2 of TF Privacy's ``QuantileAdaptiveClipSumQuery``).
  Every client weighs 1, so the one sum (``raysim.algorithms.aggregation``) adds the clipped deltas and the counts,
  in the same fixed groups on every executor and for any number of workers.
- On the server, once a round (:meth:`CentralDP.release`): Gaussian noise N(0, σ_Δ² S²) on each entry of the summed
  delta, drawn from (seed, round), and the sum divided by the fixed denominator: the expected number of clients
  (qN with Poisson sampling, the stack size with fixed-size sampling), not the number that reported. The new model
  is the download plus that mean delta, which the algorithm's ``server_aggregate_mean`` receives as the round's mean
  (FedAvg takes it, FedOpt steps towards it).
- Adaptive clipping: the noised share of unclipped clients b = (Σ (b_i − 1/2) + N(0, σ_b²)) / denominator + 1/2
  (TF Privacy's estimate, the denominator public) moves S to S exp(-η (b - γ)). The two noised queries together
  are a Gaussian mechanism of noise multiplier z, with σ_Δ = (z^-2 - (2 σ_b)^-2)^-1/2 (Andrew et al., Theorem 1):
  the centred count moves by at most 1/2 when a client is added or removed, against S for the delta sum; when one
  is replaced (fixed-size sampling), by at most 1 against 2S, the same ratio, which the accountant's z/2 covers.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np
import torch

from raysim.algorithms.aggregation import UploadSum, flat_views, flatten, unflatten
from raysim.errors import UserError
from raysim.sections.privacy import clients_per_round
from raysim.seeds import job_seed

DELTA_KEY, COUNT_KEY = "delta", "unclipped"  # what a clipped upload holds
PRIVACY_STREAM = 37  # the noise's seed: job_seed(seed, 0, round, PRIVACY_STREAM)


def noise_seed(seed: int, rnd: int) -> int:
    """The round's noise seed: ``job_seed(seed, 0, rnd, PRIVACY_STREAM)`` (raysim.seeds, torch-free)."""
    return job_seed(seed, 0, rnd, PRIVACY_STREAM)


def delta_norm(delta: dict) -> float:
    """The L2 norm of a delta's floating-point entries, in float64 (integer buffers are not clipped)."""
    total = 0.0
    for value in delta.values():
        if value.is_floating_point():
            total += float(torch.sum(value.detach().double() ** 2))
    return math.sqrt(total)


def clip_upload(upload: dict, reference: dict, clip: float) -> dict:
    """A client's upload as DP-FedAvg sends it: {"delta": (upload - reference) scaled to L2 norm <= ``clip``,
    "unclipped": +1/2 if its norm was <= ``clip`` else -1/2 (the centred count)}. ``reference``: the model entries
    the client downloaded."""
    missing = [k for k in upload if k not in reference or not isinstance(upload[k], torch.Tensor)]
    if missing:
        raise RuntimeError(f"privacy.enabled: the upload's entries {missing[:3]} are not entries of the downloaded "
                           f"model, so no model delta can be clipped (Algorithm.upload_is_model is declared wrongly)")
    return clip_delta({k: upload[k] - reference[k].to(upload[k].device, upload[k].dtype) for k in upload}, clip)


def clip_delta(delta: dict, clip: float) -> dict:
    """A model delta as DP-FedAvg sums it (:func:`clip_upload`): scaled to L2 norm <= ``clip``, with its centred
    count. The audit's canaries go through it too (:mod:`raysim.privacy.audit`)."""
    norm = delta_norm(delta)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    if scale < 1.0:
        delta = {k: (v * scale if v.is_floating_point() else v) for k, v in delta.items()}
    return {DELTA_KEY: delta, COUNT_KEY: torch.tensor(0.5 if norm <= clip else -0.5, dtype=torch.float32)}


def denominator(cfg: Any) -> float:
    """The fixed denominator of the round's mean: the expected number of clients a round samples."""
    if cfg.privacy.sampling == "poisson":
        return float(cfg.clients.fraction * cfg.clients.num)
    return float(clients_per_round(cfg))


def count_noise(cfg: Any) -> float:
    """σ_b: the unclipped count's noise (privacy.count_noise, else TFF's 0.05 x expected clients)."""
    chosen = cfg.privacy.count_noise
    return float(chosen) if chosen is not None else 0.05 * denominator(cfg)


def delta_noise(cfg: Any, z: float) -> float:
    """σ_Δ: the delta sum's noise multiplier for the combined noise multiplier ``z`` (z itself without adaptive
    clipping); refuses a z that the count's noise alone would exceed."""
    if not cfg.privacy.adaptive_clip:
        return z
    sb = count_noise(cfg)
    if z >= 2 * sb:
        raise UserError(f"config key 'privacy.count_noise': adaptive clipping spends part of the noise multiplier "
                        f"z={z:.4g} on the unclipped count, whose noise σ_b={sb:.4g} needs z < 2 σ_b = {2 * sb:.4g}; "
                        f"raise privacy.count_noise, or sample more clients")
    return (z ** -2 - (2 * sb) ** -2) ** -0.5


def poisson_clients(seed: int, round: int, num: int, q: float) -> list[int]:
    """privacy.sampling=poisson: each client independently with probability ``q``, a pure function of (seed, round)."""
    rng = np.random.default_rng([seed, round, 104723])
    return np.flatnonzero(rng.random(num) < q).tolist()


class CentralDP:
    """The server side of DP-FedAvg: the clip norm (adapted and checkpointed), the round's noise and mean."""

    def __init__(self, cfg: Any, z: float):
        self.cfg, self.z = cfg, float(z)
        self.sigma = delta_noise(cfg, self.z)  # σ_Δ
        self.clip = float(cfg.privacy.clip)
        self.denominator = denominator(cfg)

    def release(self, total: UploadSum, reference: dict, rnd: int,
                add: Optional[Callable[[UploadSum], None]] = None) -> tuple[dict, dict[str, float]]:
        """(the round's private mean model, its metrics) from the sum of clipped uploads, the noise drawn from
        (seed, round); adapts the clip norm. ``add`` puts more clipped uploads into the sum before the noise (the
        audit's canaries); the exact unclipped share (a non-private diagnostic) counts the clients alone."""
        gen = torch.Generator().manual_seed(noise_seed(self.cfg.seed, rnd))
        clients = len(total.clients)
        exact = _count(total) / clients + 0.5 if clients else None
        if add is not None:
            add(total)
        if total.clients:
            total._buffer()
            assert total.layout is not None and total.total is not None
            layout, flat = total.layout, total.total.clone()
        else:  # nobody reported (Poisson sampling may draw none): the noise is released all the same
            layout, flat = flatten(empty_upload(reference))
        used = self.clip
        count = 0.0
        for (path, _, dtype), view in zip(layout, flat_views(layout, flat)):
            if path == (COUNT_KEY,):
                count = float(view[0]) + (float(torch.randn((), generator=gen, dtype=torch.float64))
                                          * count_noise(self.cfg) if self.cfg.privacy.adaptive_clip else 0.0)
            elif dtype.is_floating_point:
                view.add_(torch.randn(view.shape, generator=gen, dtype=torch.float64), alpha=self.sigma * used)
            else:  # normalisation layers' integer counters are refused before round 1 (stage.check)
                raise RuntimeError(f"privacy.enabled: the delta's entry {'.'.join(path)} is not floating point, so "
                                   f"no noise can cover it")
        mean = unflatten(layout, flat / self.denominator)[DELTA_KEY]
        model = {k: reference[k] + mean[k].to(reference[k].dtype) for k in mean}
        metrics: dict[str, Any] = {"privacy/clip": used}
        if self.cfg.privacy.adaptive_clip:
            p = self.cfg.privacy
            share = count / self.denominator + 0.5  # the noised count's estimate of the unclipped share: released
            metrics["privacy/unclipped"] = share
            self.clip = used * math.exp(-p.clip_lr * (share - p.target_quantile))
        if exact is not None:
            metrics["nonprivate/unclipped"] = exact
        return model, metrics


def empty_upload(reference: dict) -> dict:
    """A clipped upload of zeros in the layout every client's has (the sum of nobody)."""
    return {DELTA_KEY: {k: torch.zeros_like(v) for k, v in reference.items()}, COUNT_KEY: torch.tensor(0.0)}


def _count(total: UploadSum) -> float:
    """The sum's centred unclipped count Σ (b_i - 1/2), before any noise."""
    if total.single is not None:
        return float(total.single[COUNT_KEY])
    assert total.layout is not None and total.total is not None
    for (path, _, _), view in zip(total.layout, flat_views(total.layout, total.total)):
        if path == (COUNT_KEY,):
            return float(view[0])
    return 0.0
