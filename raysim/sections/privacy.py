"""The ``privacy`` config section: user-level central DP (DP-FedAvg) and sample-level DP-SGD on the clients.

Off by default (``privacy.enabled: false``): then no key here changes any number a run computes. This module
imports neither torch nor the optional libraries (``dp-accounting``, ``opacus``: the extra ``raysim[privacy]``),
so a config loads without them; asking for privacy without them is one line naming the extra.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from raysim.validate import is_finite as _number

ACCOUNTANTS = ("rdp", "pld")
SAMPLINGS = ("fixed", "poisson")
DPSGD_SAMPLINGS = ("poisson", "shuffle")
# δ when none is given: DELTA_SHARE / N (N: clients for DP-FedAvg, a client's training samples for DP-SGD), well below
# the 1 / N at which a mechanism may publish one whole record (see docs/reference.md, *Differential privacy*)
DELTA_SHARE = 0.01
ON_BUDGET = ("stop", "warn")
MAX_NOISE = 1000.0  # privacy.target_epsilon: the largest noise multiplier the calibration searches
MAX_CANARIES = 100_000  # privacy.audit_canaries: each is a random direction drawn again every round


@dataclass
class PrivacyConfig:
    # user-level central DP (DP-FedAvg, McMahan et al. 2018): each client's model delta clipped to L2 norm
    # privacy.clip where it trained, Gaussian noise once on the round's sum at the server, a fixed denominator
    enabled: bool = False
    clip: float = 1.0  # S: the L2 bound of a client's model delta (the initial S with privacy.adaptive_clip)
    # z: the noise's standard deviation over the clip norm (z S on the sum); null: calibrated from target_epsilon
    noise_multiplier: Optional[float] = None
    # the privacy budget: with noise_multiplier null, z is calibrated so that the last round ends at it; the run
    # stops (or warns, privacy.on_budget) before a round that would spend more
    target_epsilon: Optional[float] = None
    delta: Optional[float] = None  # δ of the (ε, δ) guarantee; null: 0.01 / clients.num
    # fixed: clients.fraction x clients.num clients without replacement, what raysim samples (RDP, replace-one
    # neighbours); poisson: each client independently with probability clients.fraction (RDP or PLD, add/remove)
    sampling: str = "fixed"
    accountant: str = "rdp"  # rdp | pld (dp-accounting); pld accounts Poisson sampling only
    on_budget: str = "stop"  # stop | warn: what a round that would spend more than target_epsilon does
    # adaptive clipping (Andrew et al. 2021): S moves geometrically toward the target quantile of the clients'
    # delta norms, from a noised count of unclipped clients (TFF's defaults)
    adaptive_clip: bool = False
    target_quantile: float = 0.5  # γ: the share of clients whose delta should be left unclipped
    clip_lr: float = 0.2  # η: S <- S exp(-η (b - γ)), b the noised unclipped share
    count_noise: Optional[float] = None  # σ_b: the count's noise standard deviation; null: expected clients / 20
    # the empirical check of ε (Andrew et al., ICLR 2024): this many canary clients, each uploading its own random
    # direction through the clip and the one sum, against as many never inserted; audit/epsilon each round. 0: off
    audit_canaries: int = 0
    # sample-level DP-SGD (Abadi et al. 2016) on every client: per-sample gradients clipped to dpsgd_clip, Gaussian
    # noise of dpsgd_noise x dpsgd_clip on each batch's sum; each client's ε from its accountant
    dpsgd: bool = False
    dpsgd_clip: float = 1.0  # C: the L2 bound of one sample's gradient
    dpsgd_noise: float = 1.0  # σ: the noise multiplier of each step
    dpsgd_delta: Optional[float] = None  # δ of each client's sample-level ε; null: 0.01 / (a client's samples)
    # poisson: each step's batch takes each sample with probability q = 1 / ceil(n / batch) (Opacus's DPDataLoader),
    # accounted by Opacus's RDP accountant; shuffle: fixed batches of a permutation per epoch, accounted without
    # amplification (each epoch a Gaussian mechanism of noise multiplier dpsgd_noise / 2, replace-one)
    dpsgd_sampling: str = "poisson"

    @property
    def central(self) -> bool:
        """Whether user-level central DP (DP-FedAvg) is on."""
        return bool(self.enabled)

    @property
    def on(self) -> bool:
        return bool(self.enabled or self.dpsgd)


def clients_per_round(cfg: Any) -> int:
    """The cohort a round samples (``raysim.engine.plan.cohort_size``, which a test holds this equal to):
    ``clients.fraction x clients.num`` rounded half up, at least one; here so that raysim.privacy imports no engine."""
    return max(1, int(math.floor(cfg.clients.fraction * cfg.clients.num + 0.5)))


def check_privacy(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """Check ``cfg.privacy`` against the whole config; ``require(ok, key, why)`` refuses in one line."""
    p: PrivacyConfig = cfg.privacy
    if not p.on:
        return
    from raysim.extras import require_extra

    if p.enabled:
        require_extra("privacy", "privacy.enabled")
        require(_number(p.clip) and p.clip > 0, "privacy.clip", f"must be a finite L2 norm > 0, got {p.clip!r}")
        if p.noise_multiplier is not None:
            require(_number(p.noise_multiplier) and p.noise_multiplier > 0, "privacy.noise_multiplier",
                    f"must be a finite number > 0 (or null: calibrated from privacy.target_epsilon), got "
                    f"{p.noise_multiplier!r}")
        if p.target_epsilon is not None:
            require(_number(p.target_epsilon) and p.target_epsilon > 0, "privacy.target_epsilon",
                    f"must be a finite ε > 0 (or null), got {p.target_epsilon!r}")
        require(p.noise_multiplier is not None or p.target_epsilon is not None, "privacy.noise_multiplier",
                "privacy.enabled needs a noise multiplier or a target ε to calibrate it from "
                "(privacy.target_epsilon)")
        if p.delta is not None:
            require(_number(p.delta) and 0 < p.delta < 1, "privacy.delta", f"must be in (0, 1), got {p.delta!r}")
        require(p.sampling in SAMPLINGS, "privacy.sampling", f"must be one of {', '.join(SAMPLINGS)}, got "
                f"{p.sampling!r}")
        require(p.accountant in ACCOUNTANTS, "privacy.accountant",
                f"must be one of {', '.join(ACCOUNTANTS)}, got {p.accountant!r}")
        require(p.accountant != "pld" or p.sampling == "poisson", "privacy.accountant",
                "pld accounts Poisson sampling only (dp-accounting's PLD has no fixed-size sampling without "
                "replacement): set privacy.sampling=poisson, or privacy.accountant=rdp")
        require(p.on_budget in ON_BUDGET, "privacy.on_budget", f"must be stop or warn, got {p.on_budget!r}")
        require(_number(p.target_quantile) and 0 < p.target_quantile < 1, "privacy.target_quantile",
                f"must be in (0, 1), got {p.target_quantile!r}")
        require(_number(p.clip_lr) and p.clip_lr > 0, "privacy.clip_lr", f"must be > 0, got {p.clip_lr!r}")
        if p.count_noise is not None:
            require(_number(p.count_noise) and p.count_noise > 0, "privacy.count_noise",
                    f"must be a standard deviation > 0 (or null: expected clients / 20), got {p.count_noise!r}")
        require(cfg.asynchronous.mode == "off", "privacy.enabled",
                "DP-FedAvg is accounted per synchronous round; asynchronous.mode must be off")
        require(not cfg.aggregator.on, "aggregator.name",
                f"DP-FedAvg's noise is calibrated to the sensitivity of the clipped deltas' sum, and "
                f"{cfg.aggregator.name} is not a sum; use aggregator.name=mean with privacy.enabled")
        require(not cfg.attack.on_uploads, "attack.name",
                f"{cfg.attack.name} poisons the uploads on the server, which DP-FedAvg sums as the clients sent them; "
                f"with privacy.enabled, use an attack on the data (label_flip, backdoor)")
        require(not cfg.system.enabled, "privacy.enabled",
                "the accountant models raysim's own client sampling, which system.enabled replaces by availability "
                "and deadlines; turn system.enabled off")
        from raysim.capabilities import refusal

        why = refusal(cfg.algorithm.name, "privacy", cfg)
        require(why is None, "privacy.enabled", f"DP-FedAvg clips and noises a model delta, but "
                f"{cfg.algorithm.name} {why}")
        require(getattr(cfg.algorithm, "weighting", None) in (None, "uniform"), "algorithm.weighting",
                "DP-FedAvg weighs every client 1 over a fixed denominator (McMahan et al. 2018); drop "
                "algorithm.weighting or set it to uniform")
        require(isinstance(p.audit_canaries, int) and not isinstance(p.audit_canaries, bool)
                and 0 <= p.audit_canaries <= MAX_CANARIES, "privacy.audit_canaries",
                f"must be a whole number of canary clients in [0, {MAX_CANARIES}] (0: no audit), got "
                f"{p.audit_canaries!r}")
        require(p.audit_canaries == 0 or p.audit_canaries >= 2, "privacy.audit_canaries",
                "the audit fits a Gaussian to the canaries' cosines, which needs at least 2")
    reads = cfg.algorithm.privacy_refusal(cfg)  # a server step that reads client data outside the mechanism
    if reads is not None:
        require(False, reads[0], reads[1])
    if p.dpsgd:
        require_extra("privacy", "privacy.dpsgd")
        require(_number(p.dpsgd_clip) and p.dpsgd_clip > 0, "privacy.dpsgd_clip",
                f"must be a finite L2 norm > 0, got {p.dpsgd_clip!r}")
        require(_number(p.dpsgd_noise) and p.dpsgd_noise > 0, "privacy.dpsgd_noise",
                f"must be a finite number > 0, got {p.dpsgd_noise!r}")
        if p.dpsgd_delta is not None:
            require(_number(p.dpsgd_delta) and 0 < p.dpsgd_delta < 1, "privacy.dpsgd_delta",
                    f"must be in (0, 1), got {p.dpsgd_delta!r}")
        require(p.dpsgd_sampling in DPSGD_SAMPLINGS, "privacy.dpsgd_sampling",
                f"must be one of {', '.join(DPSGD_SAMPLINGS)}, got {p.dpsgd_sampling!r}")
        from raysim.capabilities import refusal as declared_refusal

        require(declared_refusal(cfg.algorithm.name, "stack") is None, "privacy.dpsgd",
                f"DP-SGD takes per-sample gradients of {cfg.algorithm.name}'s client_loss under torch.func.vmap, which "
                f"it does not declare it can run (Algorithm.vectorizable, docs/hooks.md)")
        require(str(cfg.engine.vectorize) in ("off", "1", "auto"), "engine.vectorize",
                "DP-SGD clips each sample's gradient, which a stack's one backward pass cannot give; "
                "set engine.vectorize=off")


def central_delta(cfg: Any) -> float:
    """δ of DP-FedAvg's guarantee: ``privacy.delta``, else ``DELTA_SHARE / clients.num``."""
    return float(cfg.privacy.delta) if cfg.privacy.delta is not None else DELTA_SHARE / cfg.clients.num


def privacy_notices(cfg: Any) -> list[str]:
    """Settings that run but promise less than they seem: an explicit δ of at least 1 / N, at which a mechanism may
    publish one user's whole data and still be (0, δ)-DP (Dwork and Roth 2014, section 2.3)."""
    p = cfg.privacy
    if not p.enabled or p.delta is None or not _number(p.delta) or p.delta < 1.0 / cfg.clients.num:
        return []
    return [f"privacy.delta={p.delta:g} is at least 1 / clients.num = {1.0 / cfg.clients.num:.3g}: a mechanism that "
            f"publishes one user's whole data meets such a δ, so the (ε, δ) guarantee says little; choose δ well below "
            f"1 / N (null: {DELTA_SHARE:g} / N = {DELTA_SHARE / cfg.clients.num:.3g})"]
