"""The driver's privacy bookkeeping, one object a run: DP-FedAvg's server step and accountant (``privacy.enabled``)
and DP-SGD's per-client ε (``privacy.dpsgd``), with what they checkpoint. The driver asks it at fixed points of
its round (the sample, the clip, the release, the metrics) and keeps no privacy state of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from raysim.algorithms.aggregation import UploadSum

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


class RoundPrivacy:
    """``central`` (:class:`raysim.privacy.central.CentralDP`) and ``accountant`` are None unless
    ``privacy.enabled``; the noise multiplier is the one given or calibrated from privacy.target_epsilon, here,
    before any worker starts (an unreachable ε is one line at once)."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        self.central: Any = None
        self.accountant: Any = None
        self._reference: dict = {}  # the model entries the round's clients downloaded (their deltas' origin)
        self._budget_warned = False
        self._release_metrics: dict = {}
        self._dp_steps: dict[int, int] = {}  # privacy.dpsgd: each client's DP-SGD steps so far (checkpointed)
        self._dp_epsilon: dict[int, float] = {}  # and its sample-level ε after them
        if not cfg.privacy.enabled:
            return
        from raysim.privacy.accounting import RoundAccountant, calibrate
        from raysim.privacy.central import CentralDP

        z = cfg.privacy.noise_multiplier if cfg.privacy.noise_multiplier is not None else calibrate(cfg)
        self.central = CentralDP(cfg, z)
        self.accountant = RoundAccountant(cfg, z)

    @property
    def clip(self) -> Optional[float]:
        """The clip norm the round's clients apply to their deltas (None: DP-FedAvg is off)."""
        return self.central.clip if self.central is not None else None

    def weighting(self, algorithm_weighting: str) -> str:
        """The weights of the round's sum: DP-FedAvg's uniform ones, else the algorithm's."""
        return "uniform" if self.central is not None else algorithm_weighting

    def sample(self, rnd: int) -> Optional[list[int]]:
        """Round ``rnd``'s clients under Poisson sampling (privacy.sampling=poisson); None: the usual fixed-size
        draw."""
        c = self.cfg
        if self.central is None or c.privacy.sampling != "poisson":
            return None
        from raysim.privacy.central import poisson_clients

        return poisson_clients(c.seed, rnd, c.clients.num, c.clients.fraction)

    def downloaded(self, model: dict) -> None:
        """The model entries the round's clients downloaded: what their deltas are taken from."""
        self._reference = model

    def budget_spent(self, rnd: int) -> bool:
        """privacy.target_epsilon: whether round ``rnd`` would spend more than the budget, so that the run stops
        before it (privacy.on_budget=stop; warn: one warning line, and the round runs)."""
        target = self.cfg.privacy.target_epsilon
        if self.accountant is None or target is None:
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

    def release(self, total: UploadSum, rnd: int) -> dict:
        """DP-FedAvg's server step on the round's one sum of clipped deltas: the noised mean delta added to the
        download (the round's mean model); its metrics go into the round's row."""
        model, self._release_metrics = self.central.release(total, self._reference, rnd)
        self._release_metrics["privacy/noise_multiplier"] = self.central.z
        return model

    def round_metrics(self, rnd: int, finished: list[Any]) -> dict[str, float]:
        """The round's privacy metrics: the release's and ε after ``rnd`` rounds (DP-FedAvg); each trained
        client's sample-level ε after all its DP-SGD steps so far (Opacus's RDP accountant, rate batch / its
        samples, δ privacy.dpsgd_delta or 1 / its samples), the largest and the mean over the clients that have
        trained (DP-SGD)."""
        metrics: dict[str, float] = {}
        if self.accountant is not None:
            metrics.update(self._release_metrics, epsilon=self.accountant.after(rnd))
        if not self.cfg.privacy.dpsgd:
            return metrics
        from raysim.privacy.dpsgd import client_epsilon

        p, batch = self.cfg.privacy, self.cfg.train.batch_size
        for r in finished:
            if r.dp_steps:
                self._dp_steps[r.client_id] = self._dp_steps.get(r.client_id, 0) + r.dp_steps
                n = max(r.num_samples, 1)
                delta = p.dpsgd_delta if p.dpsgd_delta is not None else 1.0 / max(n, 2)
                self._dp_epsilon[r.client_id] = client_epsilon(p.dpsgd_noise, batch / n,
                                                               self._dp_steps[r.client_id], delta)
        values = list(self._dp_epsilon.values())
        if values:
            metrics.update({"dpsgd/epsilon_max": max(values), "dpsgd/epsilon_mean": float(np.mean(values))})
        return metrics

    def state(self) -> dict:
        """What a checkpoint keeps: the adaptive clip norm, and each client's DP-SGD steps and ε."""
        return {**({"privacy": self.central.state()} if self.central is not None else {}),
                **({"dpsgd_steps": dict(self._dp_steps), "dpsgd_epsilon": dict(self._dp_epsilon)}
                   if self.cfg.privacy.dpsgd else {})}

    def load(self, ckpt: dict) -> None:
        """Continue from a checkpoint's :meth:`state`."""
        if self.central is not None:
            self.central.load(ckpt.get("privacy"))
        self._dp_steps = {int(c): int(n) for c, n in ckpt.get("dpsgd_steps", {}).items()}
        self._dp_epsilon = {int(c): float(e) for c, e in ckpt.get("dpsgd_epsilon", {}).items()}
