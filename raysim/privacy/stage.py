"""Differential privacy as stages of the round (``raysim.stages``): DP-FedAvg (``privacy.enabled``) and sample-level
DP-SGD (``privacy.dpsgd``).

- :class:`CentralDPStage` (McMahan et al., ICLR 2018; Andrew et al., NeurIPS 2021): each client's model delta is
  clipped where it trained, by its client part, before any partial sum (:func:`raysim.privacy.central.clip_upload`);
  every client weighs 1 in the one sum; the server adds the noise once to the sum and divides by the fixed
  denominator (:meth:`CentralDP.release`); the accountant says ε after each round and the run stops before a round
  that would overspend ``privacy.target_epsilon``. With ``privacy.sampling=poisson`` the stage chooses the cohort.
  The noise multiplier, δ and the clip norm are checkpointed: a resume continues with them (the accountant's history
  is z and the rounds run), whatever ``rounds`` says now. ``privacy.audit_canaries`` adds the empirical check of ε
  (:mod:`raysim.privacy.audit`).
- :class:`DPSGDStage` (Abadi et al., CCS 2016): each step of every client is DP-SGD's (per-sample gradients
  clipped, summed and noised, :mod:`raysim.privacy.dpsgd`) on Poisson or shuffled batches, through the one local
  loop; each client's sample-level ε after its steps so far is logged as its largest and mean value.

Both log what is released (a function of the noised aggregate or of public data) under its own name, and the
diagnostics computed from un-noised client data under ``nonprivate/`` (:func:`raysim.privacy.metrics.label`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch

from raysim.errors import UserError
from raysim.seeds import DPSGD_STREAM, job_seed
from raysim.stages import ClientPart, RoundContext, Stage, StageSetup

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

# the buffers a normalisation layer updates from the data it sees (torch's BatchNorm, InstanceNorm with
# track_running_stats): no clip bounds them, and a count is no floating-point entry that noise could cover
NORMALISATION_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def normalisation_entries(entries: dict) -> list[str]:
    """The entries of ``entries`` (a state dict) that are normalisation statistics or not floating point."""
    return [k for k, v in entries.items()
            if k.rsplit(".", 1)[-1] in NORMALISATION_BUFFERS or not (isinstance(v, torch.Tensor)
                                                                      and v.is_floating_point())]


def check_public_splits(cfg: ExperimentConfig, data: Any) -> None:
    """Refuse a server step that reads the clients' data outside the mechanism (the algorithm config's own
    ``privacy_refusal``, now with the prepared data: whether it has an official test split)."""
    refusal = cfg.algorithm.privacy_refusal(cfg, data)
    if refusal is not None:
        raise UserError(f"config key '{refusal[0]}': {refusal[1]}")


# ---------------------------------------------------------------------------------------------- DP-FedAvg
class _ClipPart(ClientPart):
    """Where the client trained: its upload minus the model it downloaded, clipped to the round's norm S."""

    def __init__(self, clip: float):
        self.clip = clip

    def upload(self, upload: dict, shared: dict) -> dict:
        from raysim.privacy.central import clip_upload

        return clip_upload(upload, shared.get("model") or {}, self.clip)


class CentralDPStage(Stage):
    """DP-FedAvg's stage (see the module docstring); ``central``, ``accountant`` and ``audit`` are made on the
    driver only (:meth:`prepare`: the noise multiplier given or calibrated from ``privacy.target_epsilon``)."""

    name = "privacy"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self.central: Any = None
        self.accountant: Any = None
        self.audit: Any = None
        self._budget_warned = False
        self._release_metrics: dict = {}

    def prepare(self) -> None:
        from raysim.privacy.accounting import calibrated

        p = self.cfg.privacy
        z, rdp = (float(p.noise_multiplier), None) if p.noise_multiplier is not None else calibrated(self.cfg)
        self._mechanism(z, rdp)
        if p.audit_canaries:
            from raysim.privacy.audit import CanaryAudit
            from raysim.privacy.central import denominator

            rate = denominator(self.cfg) / self.cfg.clients.num  # a client's chance of being sampled in a round
            self.audit = CanaryAudit(self.cfg, rate, self.accountant.delta)

    def _mechanism(self, z: float, rdp: Any = None) -> None:
        """The server side and the accountant for noise multiplier ``z`` (kept across a resume)."""
        from raysim.privacy.accounting import RoundAccountant
        from raysim.privacy.central import CentralDP

        clip = self.central.clip if self.central is not None else None
        self.central = CentralDP(self.cfg, z)
        if clip is not None:
            self.central.clip = clip
        self.accountant = RoundAccountant(self.cfg, z, rdp)

    def check(self, setup: StageSetup) -> None:
        """Refuse a model whose released entries include normalisation statistics (Opacus refuses batch norm for
        DP-SGD likewise), and server steps on client data outside the mechanism."""
        shared = {k: v for k, v in setup.initial.items() if setup.algorithm.is_shared(k)}
        stats = normalisation_entries(shared)
        if stats:
            raise UserError(f"config key 'model.name': DP-FedAvg would release {', '.join(stats[:3])}"
                            f"{' ...' if len(stats) > 3 else ''}: statistics of normalisation layers that each "
                            f"client computes from its own data, which the clip does not bound (and a count that no "
                            f"Gaussian noise covers); with privacy.enabled choose a model without batch norm (mlp, "
                            f"cnn), as Opacus requires for DP-SGD")
        check_public_splits(self.cfg, setup.data)

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
        """DP-FedAvg's server step on the round's one sum of clipped deltas (and the audit's canaries, added to it
        before the noise): the noised mean delta added to the model the clients downloaded (the round's mean
        model)."""
        reference = ctx.shared.get("model") or {}
        audit = self.audit
        add = (lambda total: audit.insert(total, reference, self.central.clip, ctx.round)) if audit else None
        model, self._release_metrics = self.central.release(summed(), reference, ctx.round, add)
        if audit is not None:
            audit.add_release({k: model[k].double() - reference[k].double() for k in model}, reference)
        return model

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        out = {**self._release_metrics, "privacy/noise_multiplier": self.central.z,
               "epsilon": self.accountant.after(ctx.round), "privacy/delta": self.accountant.delta}
        c = self.cfg
        if self.audit is not None and (ctx.round % c.eval.every == 0 or ctx.round == c.rounds):
            out.update(self.audit.metrics())  # when the evaluation is due: 2k directions of the model's size
        return out

    def label_metrics(self, metrics: dict[str, Any]) -> None:
        from raysim.privacy.metrics import label

        label(self.cfg, metrics)

    # ------------------------------------------------------------------ the checkpoint
    def state(self) -> dict:
        p = self.cfg.privacy
        saved = {"clip": self.central.clip, "noise_multiplier": self.central.z, "delta": self.accountant.delta,
                 "sampling": p.sampling, "accountant": p.accountant}
        if self.audit is not None:
            saved["audit_released"] = self.audit.state()
        return {"privacy": saved}

    def load(self, ckpt: dict) -> None:
        """Continue with the checkpoint's clip norm, noise multiplier (never recalibrated for a changed
        ``rounds``: the rounds run spent their budget at it), δ and released delta. A checkpoint accounted under
        another sampling or accountant is refused in one line naming the key (the runner refuses a changed key
        before; this catches what a changed default would change)."""
        saved = ckpt.get("privacy")
        if not saved:
            return
        p, cfg = self.cfg.privacy, self.cfg
        for key in ("sampling", "accountant"):
            if saved.get(key, getattr(p, key)) != getattr(p, key):
                raise UserError(f"config key 'privacy.{key}': the checkpoint accounted its rounds with privacy.{key}="
                                f"{saved[key]}, this config gives {getattr(p, key)}; resume with privacy.{key}="
                                f"{saved[key]}, or start a new run")
        z = float(saved.get("noise_multiplier", self.central.z))
        if z != self.central.z:
            self._mechanism(z)
        self.central.clip = float(saved["clip"])
        # a checkpoint from before δ's default was 0.01 / N (no δ recorded, privacy.delta null) was accounted at 1 / N
        delta = float(saved.get("delta", p.delta if p.delta is not None else 1.0 / cfg.clients.num))
        if delta != self.accountant.delta:
            from raysim.runlog import warn_stderr

            warn_stderr(f"privacy.delta: the checkpoint accounted its rounds at δ={delta:.3g} (the default when it "
                        f"was made); the run goes on at that δ, so that its ε stays one guarantee (a new run takes "
                        f"δ={self.accountant.delta:.3g})")
            self.accountant.delta = delta
        if self.audit is not None:
            self.audit.delta = self.accountant.delta
            self.audit.load(saved.get("audit_released"))


def central_dp_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return CentralDPStage(cfg) if cfg.privacy.enabled else None


# ---------------------------------------------------------------------------------------------- DP-SGD
class _DPSGDPart(ClientPart):
    """Every step of one client's job: per-sample gradients clipped, summed and noised (:mod:`raysim.privacy.dpsgd`),
    returned as a surrogate loss whose gradient is exactly that (``Σ (p · g).sum()``); the losses logged are the
    samples'. The batches are Poisson's (or the loop's shuffled ones); the noise comes from the job's own stream."""

    def __init__(self, cfg: ExperimentConfig, job: Any):
        p = cfg.privacy
        self.clip, self.noise, self.poisson = p.dpsgd_clip, p.dpsgd_noise, p.dpsgd_sampling == "poisson"
        self.gen = torch.Generator().manual_seed(job_seed(cfg.seed, job.client_id, job.round, DPSGD_STREAM,
                                                          *job.stream))
        self.steps = self.epochs = 0
        self.denominator: Optional[float] = None  # Poisson: the expected batch size

    def batches(self, n: int, batch_size: int, generator: Any, device: Any) -> Any:
        from raysim.privacy.dpsgd import poisson_batches, poisson_rate

        self.epochs += 1
        if not self.poisson:
            return None  # the one loop's shuffled batches
        self.denominator = float(poisson_rate(n, batch_size)[2])
        return poisson_batches(n, batch_size, generator, device)

    def loss(self, trainee: Any, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> Optional[torch.Tensor]:
        from raysim.privacy.dpsgd import clip_and_noise, per_sample_grads

        if len(y):
            grads, losses, parts = per_sample_grads(trainee.model, trainee.params, trainee.alg.client_loss, x, y,
                                                    idx, trainee.ctx)
            trainee.record(losses.detach().double().sum(),
                           {k: v.detach().double().sum() for k, v in parts.items()}, len(y))
        else:  # an empty Poisson batch: a step of noise alone, as Opacus takes it
            grads = [torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device) for p in trainee.params]
        noisy = clip_and_noise(grads, self.clip, self.noise, self.gen, self.denominator)
        trainee.ctx.sample_idx = idx
        self.steps += 1
        return sum((w * g).sum() for w, g in zip(trainee.params, noisy))

    def report(self, seen: int) -> Any:
        return [self.steps, self.epochs]  # its sample-level accountant's counts


class DPSGDStage(Stage):
    """DP-SGD's stage: the steps on every client, and each client's sample-level ε after all its DP-SGD steps so
    far (:func:`raysim.privacy.dpsgd.client_epsilon` for Poisson batches, :func:`shuffled_epsilon` for shuffled
    ones; δ ``privacy.dpsgd_delta`` or 0.01 / its samples), checkpointed."""

    name = "dpsgd"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self._steps: dict[int, int] = {}  # each client's DP-SGD steps so far (checkpointed)
        self._epochs: dict[int, int] = {}  # and epochs
        self._epsilon: dict[int, float] = {}  # and its sample-level ε after them

    def check(self, setup: StageSetup) -> None:
        stats = [k for k in setup.initial if k.rsplit(".", 1)[-1] in NORMALISATION_BUFFERS]
        if stats:
            raise UserError(f"config key 'model.name': DP-SGD clips each sample's gradient, which a batch norm layer "
                            f"({stats[0].rsplit('.', 1)[0]}) mixes across the batch; with privacy.dpsgd choose a "
                            f"model without batch norm (mlp, cnn), as Opacus requires")
        check_public_splits(self.cfg, setup.data)
        p = self.cfg.privacy
        if p.dpsgd_delta is not None:
            smallest = min((len(setup.data.split(c).train) for c in range(setup.data.num_clients)), default=0)
            if smallest and p.dpsgd_delta >= 1.0 / smallest:
                from raysim.runlog import warn_stderr

                warn_stderr(f"privacy.dpsgd_delta={p.dpsgd_delta:g} is at least 1 / n for a client of n={smallest} "
                            f"training samples: a mechanism that publishes one whole sample meets such a δ; choose "
                            f"δ well below 1 / n (null: 0.01 / n)")

    def stack_refusal(self) -> Optional[str]:
        return "privacy.dpsgd takes per-sample gradients one client at a time"

    def trains_alone(self, params: Any) -> bool:
        return True

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _DPSGDPart(self.cfg, job)

    def round_metrics(self, ctx: RoundContext, results: list) -> dict[str, Any]:
        """The largest and the mean ε over the clients that have trained."""
        from raysim.sections.privacy import DELTA_SHARE
        from raysim.privacy.dpsgd import client_epsilon, poisson_rate, shuffled_epsilon

        p, batch = self.cfg.privacy, self.cfg.train.batch_size
        for r in results:
            steps, epochs = r.stage.get(self.name) or (0, 0)
            if not steps:
                continue
            cid, n = r.client_id, max(r.num_samples, 1)
            self._steps[cid] = self._steps.get(cid, 0) + steps
            self._epochs[cid] = self._epochs.get(cid, 0) + epochs
            delta = p.dpsgd_delta if p.dpsgd_delta is not None else DELTA_SHARE / n
            self._epsilon[cid] = (client_epsilon(p.dpsgd_noise, poisson_rate(n, batch)[1], self._steps[cid], delta)
                                  if p.dpsgd_sampling == "poisson"
                                  else shuffled_epsilon(p.dpsgd_noise, self._epochs[cid], delta))
        values = list(self._epsilon.values())
        return {"dpsgd/epsilon_max": max(values), "dpsgd/epsilon_mean": float(np.mean(values))} if values else {}

    def label_metrics(self, metrics: dict[str, Any]) -> None:
        from raysim.privacy.metrics import label

        label(self.cfg, metrics)

    def state(self) -> dict:
        p = self.cfg.privacy
        return {"dpsgd_steps": dict(self._steps), "dpsgd_epochs": dict(self._epochs),
                "dpsgd_epsilon": dict(self._epsilon),
                "dpsgd_mechanism": {"sampling": p.dpsgd_sampling, "delta": p.dpsgd_delta}}

    def load(self, ckpt: dict) -> None:
        """Continue each client's counts; steps taken with other batches or accounted at another δ are refused."""
        steps = {int(c): int(n) for c, n in ckpt.get("dpsgd_steps", {}).items()}
        p, was = self.cfg.privacy, ckpt.get("dpsgd_mechanism")
        if steps and was is None:
            raise UserError("config key 'privacy.dpsgd': the checkpoint's DP-SGD steps were taken before "
                            "privacy.dpsgd_sampling existed, on shuffled batches accounted as Poisson sampling (an ε "
                            "too small) and without their epochs, so no honest ε can continue from them; start a new "
                            "run")
        for key, now in (("sampling", p.dpsgd_sampling), ("delta", p.dpsgd_delta)):
            if was is not None and was[key] != now:
                raise UserError(f"config key 'privacy.dpsgd_{key}': the checkpoint's DP-SGD steps were accounted "
                                f"with privacy.dpsgd_{key}={was[key]}, this config gives {now}; resume with "
                                f"privacy.dpsgd_{key}={was[key]}, or start a new run")
        self._steps = steps
        self._epochs = {int(c): int(n) for c, n in ckpt.get("dpsgd_epochs", {}).items()}
        self._epsilon = {int(c): float(e) for c, e in ckpt.get("dpsgd_epsilon", {}).items()}


def dpsgd_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return DPSGDStage(cfg) if cfg.privacy.dpsgd else None
