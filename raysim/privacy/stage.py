"""Differential privacy as stages of the round (``raysim.stages``): DP-FedAvg (``privacy.enabled``) and sample-level
DP-SGD (``privacy.dpsgd``).

- :class:`CentralDPStage` (McMahan et al., ICLR 2018; Andrew et al., NeurIPS 2021): each client's model delta is
  clipped where it trained, by its client part, before any partial sum (:func:`raysim.privacy.central.clip_upload`);
  every client weighs 1 in the one sum; the server adds the noise once to the sum and divides by the fixed
  denominator (:meth:`CentralDP.release`); the accountant says ε after each round and the run stops before a round
  that would overspend ``privacy.target_epsilon``. With ``privacy.sampling=poisson`` the stage chooses the cohort.
- :class:`DPSGDStage` (Abadi et al., CCS 2016): each step of every client is DP-SGD's (per-sample gradients
  clipped, summed and noised, :mod:`raysim.privacy.dpsgd`), through the one local loop; each client's sample-level ε
  after its steps so far is logged as its largest and mean value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch

from raysim.seeds import DPSGD_STREAM, job_seed
from raysim.stages import ClientPart, RoundContext, Stage

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


# ---------------------------------------------------------------------------------------------- DP-FedAvg
class _ClipPart(ClientPart):
    """Where the client trained: its upload minus the model it downloaded, clipped to the round's norm S."""

    def __init__(self, clip: float):
        self.clip = clip

    def upload(self, upload: dict, shared: dict) -> dict:
        from raysim.privacy.central import clip_upload

        return clip_upload(upload, shared.get("model") or {}, self.clip)


class CentralDPStage(Stage):
    """DP-FedAvg's stage (see the module docstring); ``central`` and ``accountant`` are made on the driver only
    (:meth:`prepare`: the noise multiplier given or calibrated from ``privacy.target_epsilon``)."""

    name = "privacy"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self.central: Any = None
        self.accountant: Any = None
        self._budget_warned = False
        self._release_metrics: dict = {}

    def prepare(self) -> None:
        from raysim.privacy.accounting import RoundAccountant, calibrate
        from raysim.privacy.central import CentralDP

        p = self.cfg.privacy
        z = p.noise_multiplier if p.noise_multiplier is not None else calibrate(self.cfg)
        self.central = CentralDP(self.cfg, z)
        self.accountant = RoundAccountant(self.cfg, z)

    # ------------------------------------------------------------------ the round
    def weighting(self, weighting: str) -> str:
        return "uniform"  # every client weighs 1 over the fixed denominator

    def select(self, rnd: int) -> Optional[list[int]]:
        c = self.cfg
        if c.privacy.sampling != "poisson":
            return None
        from raysim.privacy.central import poisson_clients

        return poisson_clients(c.seed, rnd, c.clients.num, c.clients.fraction)

    def job_params(self, rnd: int) -> Any:
        return self.central.clip  # the clip norm S the round's clients apply to their deltas

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _ClipPart(params) if params is not None else None

    def stop_before(self, rnd: int) -> bool:
        """privacy.target_epsilon: whether round ``rnd`` would spend more than the budget, so that the run stops
        before it (privacy.on_budget=stop; warn: one warning line, and the round runs)."""
        target = self.cfg.privacy.target_epsilon
        if target is None:
            return False
        eps = self.accountant.after(rnd)
        if eps <= target * (1 + 1e-9):
            return False
        from raysim.runlog import warn_stderr

        what = (f"privacy budget: round {rnd} would bring ε to {eps:.4g} at δ={self.accountant.delta:.3g}, over "
                f"privacy.target_epsilon={target:g}")
        if self.cfg.privacy.on_budget == "stop":
            warn_stderr(f"{what}; the run stops after round {rnd - 1} (privacy.on_budget=stop)")
            return True
        if not self._budget_warned:
            warn_stderr(f"{what}; the run goes on (privacy.on_budget=warn)")
            self._budget_warned = True
        return False

    def release(self, summed: Callable[[], Any], ctx: RoundContext) -> Optional[dict]:
        """DP-FedAvg's server step on the round's one sum of clipped deltas: the noised mean delta added to the
        model the clients downloaded (the round's mean model)."""
        model, self._release_metrics = self.central.release(summed(), ctx.shared.get("model") or {}, ctx.round)
        self._release_metrics["privacy/noise_multiplier"] = self.central.z
        return model

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        return {**self._release_metrics, "epsilon": self.accountant.after(ctx.round)}

    # ------------------------------------------------------------------ the checkpoint
    def state(self) -> dict:
        return {"privacy": self.central.state()}

    def load(self, ckpt: dict) -> None:
        self.central.load(ckpt.get("privacy"))


def central_dp_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return CentralDPStage(cfg) if cfg.privacy.enabled else None


# ---------------------------------------------------------------------------------------------- DP-SGD
class _DPSGDPart(ClientPart):
    """Every step of one client's job: per-sample gradients clipped, summed and noised (:mod:`raysim.privacy.dpsgd`),
    returned as a surrogate loss whose gradient is exactly that (``Σ (p · g).sum()``); the losses logged are the
    samples'. The noise comes from the job's own stream."""

    def __init__(self, cfg: ExperimentConfig, job: Any):
        p = cfg.privacy
        self.clip, self.noise = p.dpsgd_clip, p.dpsgd_noise
        self.gen = torch.Generator().manual_seed(job_seed(cfg.seed, job.client_id, job.round, DPSGD_STREAM,
                                                          *job.stream))
        self.steps = 0

    def loss(self, trainee: Any, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> Optional[torch.Tensor]:
        from raysim.privacy.dpsgd import clip_and_noise, per_sample_grads

        grads, losses, parts = per_sample_grads(trainee.model, trainee.params, trainee.alg.client_loss, x, y, idx,
                                                trainee.ctx)
        noisy = clip_and_noise(grads, self.clip, self.noise, self.gen)
        trainee.ctx.sample_idx = idx
        trainee.record(losses.detach().double().sum(), {k: v.detach().double().sum() for k, v in parts.items()},
                       len(y))
        self.steps += 1
        return sum((w * g).sum() for w, g in zip(trainee.params, noisy))

    def report(self, seen: int) -> Any:
        return self.steps  # the DP-SGD steps it took: its sample-level accountant's count


class DPSGDStage(Stage):
    """DP-SGD's stage: the steps on every client, and each client's sample-level ε after all its DP-SGD steps so
    far (Opacus's RDP accountant, rate batch / its samples, δ ``privacy.dpsgd_delta`` or 1 / its samples),
    checkpointed."""

    name = "dpsgd"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self._steps: dict[int, int] = {}  # each client's DP-SGD steps so far (checkpointed)
        self._epsilon: dict[int, float] = {}  # and its sample-level ε after them

    def cohort_refusal(self) -> Optional[str]:
        return "privacy.dpsgd takes per-sample gradients one client at a time"

    def trains_alone(self, params: Any) -> bool:
        return True

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _DPSGDPart(self.cfg, job)

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        """The largest and the mean ε over the clients that have trained."""
        from raysim.privacy.dpsgd import client_epsilon

        p, batch = self.cfg.privacy, self.cfg.train.batch_size
        for r in results:
            steps = r.stage.get(self.name, 0)
            if steps:
                self._steps[r.client_id] = self._steps.get(r.client_id, 0) + steps
                n = max(r.num_samples, 1)
                delta = p.dpsgd_delta if p.dpsgd_delta is not None else 1.0 / max(n, 2)
                self._epsilon[r.client_id] = client_epsilon(p.dpsgd_noise, batch / n, self._steps[r.client_id], delta)
        values = list(self._epsilon.values())
        return {"dpsgd/epsilon_max": max(values), "dpsgd/epsilon_mean": float(np.mean(values))} if values else {}

    def state(self) -> dict:
        return {"dpsgd_steps": dict(self._steps), "dpsgd_epsilon": dict(self._epsilon)}

    def load(self, ckpt: dict) -> None:
        self._steps = {int(c): int(n) for c, n in ckpt.get("dpsgd_steps", {}).items()}
        self._epsilon = {int(c): float(e) for c, e in ckpt.get("dpsgd_epsilon", {}).items()}


def dpsgd_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return DPSGDStage(cfg) if cfg.privacy.dpsgd else None
