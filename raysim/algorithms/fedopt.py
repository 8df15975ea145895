"""FedOpt (Reddi et al., ICLR 2021): the server steps the global model along the clients' average update with an
optimiser of its own. One shared hook, four built-ins: FedAvgM, FedAdam, FedYogi and FedAdagrad.

Paper: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar, H. B. McMahan, "Adaptive
Federated Optimization", ICLR 2021 (arXiv:2003.00295), Algorithms 1 and 2. Authors' code:
github.com/google-research/federated (``optimization/``: the server optimiser is a Keras optimiser applied to the
averaged model delta; ``utils/optimizers/yogi.py``; ``optimization/docs/hyperparameters.md``: the flags of each
method and the best values the authors found per task). FedAvgM: T.-M. H. Hsu, H. Qi, M. Brown, "Measuring the
Effects of Non-Identical Data Distribution for Federated Visual Classification", arXiv:1909.06335 (2019).

The shared hook (:class:`FedOpt`). Every round the server averages the clients' models, weighted by training
samples as raysim's FedAvg (and the authors' TFF code) does, and hands each tensor's average x̄ to ``server_step``
with the current global value x and that tensor's optimiser state. The pseudo-gradient is g = x − x̄ (Δ = x̄ − x =
−g in Algorithm 2). Only parameters are stepped (a Keras optimiser, the authors', steps trainable variables):
batch-norm running statistics and integer buffers take the plain average. A subclass (a plugin too, see
``examples/plugins/fednesterov.py``) overrides ``init_moments(x)`` (the state of one tensor) and
``server_step(x, average, moments)`` (its new value; the state changed in place). The optimiser state lives in the
server state (``server_state["optimizer"]``: key -> moments), so it is checkpointed and resumed with the run.

The four built-ins, per coordinate, with η = ``server_lr``:

* FedAvgM (``fedavgm``): v ← β·v + g;  x ← x − η·v  (Hsu et al.; the authors' ``server_sgd_momentum``), computed as
  x ← x̄ + (1 − η)·g − η·β·v_prev, the same number written so that β = 0, η = 1 returns x̄ bit for bit: FedAvg.
* FedAdagrad, FedYogi, FedAdam (Algorithm 2), from m_{-1} = 0 and v_{-1} = τ²:
      m ← β1·m + (1 − β1)·Δ
      v ← v + Δ²                                  (FedAdagrad)
      v ← v − (1 − β2)·Δ²·sign(v − Δ²)            (FedYogi)
      v ← β2·v + (1 − β2)·Δ²                      (FedAdam)
      x ← x + η·m / (√v + τ)
  As in the paper, no bias correction (the authors' FedAdam ran Keras' Adam, which has it) and v_{-1} = τ², the
  least Algorithm 2 allows (their flags start Adagrad's and Yogi's accumulators at 0).

Defaults: τ = 1e-3, the epsilon the authors recommend by default (hyperparameters.md); β1 = 0.9 and β2 = 0.99 for
FedAdam and FedYogi (the paper's stated values, which Flower's replication of the paper uses too,
``baselines/flwr_baselines/publications/adaptive_federated_optimization/conf/*/strategy/fedyogi.yaml``; the authors'
hyperparameters.md says their TFF runs kept Keras' β2 = 0.999: ``algorithm.beta2=0.999``), β1 = 0 for FedAdagrad
(the authors ran Keras' Adagrad, which has no first moment; so does Flower's FedAdagrad); the server learning rate
is the value the authors' tuning chose most often over their six tasks (hyperparameters.md, "Server learning
rates"): 10^-2 for FedAdam and FedYogi, 10^-1 for FedAdagrad, 1 for FedAvgM, with server momentum 0.9 (their FedAvgM
flag). The client side is FedAvg's: ``train.*`` (the paper's clients run plain SGD; the authors tuned the client
learning rate too).

The average the server steps along is weighted by training samples (FedAvg's n_k/n, summed where the clients
trained); the paper's Algorithm 2 averages the clients' updates uniformly, which ``algorithm.weighting=uniform``
gives (with clients of equal size the two agree). Samples stays the default so that the FedOpt family and FedAvg
differ only in the server's step in raysim's tables.
"""

from __future__ import annotations


import torch

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, TensorDict, is_parameter
from raysim.algorithms.configs.fedopt import (AdaptiveConfig, FedAdagradConfig, FedAdamConfig, FedAvgMConfig,
                                             FedOptConfig, FedYogiConfig)
from raysim.registry import register_algorithm

Moments = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------- the math
def momentum_step(x: torch.Tensor, average: torch.Tensor, velocity: torch.Tensor | None, lr: float,
                  momentum: float) -> torch.Tensor:
    """Server SGD with (heavy-ball) momentum on the pseudo-gradient g = x − x̄: v ← β·v + g, x ← x − η·v; returns the
    new x and updates ``velocity`` in place. Written as x̄ + (1 − η)·g − η·β·v_prev, so that η = 1, β = 0 gives x̄
    exactly (FedAvg), not x − (x − x̄) with its rounding."""
    g = x - average
    new = average + (1.0 - lr) * g
    if velocity is not None:
        new = new - (lr * momentum) * velocity
        velocity.mul_(momentum).add_(g)
    return new


def adaptive_step(x: torch.Tensor, average: torch.Tensor, moments: Moments, lr: float, beta1: float, tau: float,
                  second_moment) -> torch.Tensor:
    """Reddi et al.'s Algorithm 2 for one tensor: Δ = x̄ − x, m ← β1·m + (1 − β1)·Δ, v ← second_moment(v, Δ),
    x ← x + η·m / (√v + τ); ``moments`` ("m", "v") updated in place."""
    delta = average - x
    m, v = moments["m"], moments["v"]
    m.mul_(beta1).add_(delta, alpha=1.0 - beta1)
    v.copy_(second_moment(v, delta))
    return x + lr * m / (v.sqrt() + tau)


# ---------------------------------------------------------------------------------------------- the shared hook
class FedOpt(Algorithm):
    """FedAvg whose server steps the model along the clients' average update with its own optimiser (the shared hook
    of FedAvgM, FedAdam, FedYogi and FedAdagrad: override ``init_moments`` and ``server_step``)."""

    Config = FedOptConfig
    shared = "all"
    vectorizable = True  # engine.vectorize: FedAvg's client hooks (SCAFFOLD, which has its own, declares it again)
    uploads = Uploads.model()  # its own server step (server_aggregate_mean) steps towards the mean model

    def init_moments(self, x: torch.Tensor) -> Moments:
        """The optimiser state of one tensor before the first round (zeros of its shape, or nothing)."""
        return {}

    def server_step(self, x: torch.Tensor, average: torch.Tensor, moments: Moments) -> torch.Tensor:
        """The new global value of one tensor from its current value ``x`` and the clients' weighted average;
        ``moments`` (this tensor's state) is updated in place. The default is FedAvg: the average itself."""
        return average

    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        state["optimizer"] = {k: self.init_moments(v) for k, v in state["model"].items() if is_parameter(k, v)}
        return state

    def server_aggregate_mean(self, average: TensorDict, server_state: dict, round: int) -> dict:
        """The clients' models averaged by training samples (FedAvg's, a weighted sum: summed where the clients
        trained, ``engine.partial_sums``), then the optimiser's step for every parameter."""
        model, moments = server_state["model"], server_state["optimizer"]
        server_state["model"] = {key: self.server_step(model[key], avg, moments[key]) if key in moments else avg
                                 for key, avg in average.items()}
        return server_state


# ---------------------------------------------------------------------------------------------- the built-ins
@register_algorithm("fedavgm")
class FedAvgM(FedOpt):
    """FedAvg with server momentum (Hsu et al., 2019): v ← β·v + (x − x̄), x ← x − η·v."""

    Config = FedAvgMConfig

    def init_moments(self, x: torch.Tensor) -> Moments:
        return {"v": torch.zeros_like(x)} if self.config.server_momentum > 0 else {}

    def server_step(self, x: torch.Tensor, average: torch.Tensor, moments: Moments) -> torch.Tensor:
        return momentum_step(x, average, moments.get("v"), self.config.server_lr, self.config.server_momentum)


class AdaptiveFedOpt(FedOpt):
    """Reddi et al.'s Algorithm 2; subclasses give the second-moment update."""

    Config = AdaptiveConfig

    def init_moments(self, x: torch.Tensor) -> Moments:
        return {"m": torch.zeros_like(x), "v": torch.full_like(x, self.config.tau ** 2)}

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def server_step(self, x: torch.Tensor, average: torch.Tensor, moments: Moments) -> torch.Tensor:
        c = self.config
        return adaptive_step(x, average, moments, c.server_lr, c.beta1, c.tau, self.second_moment)


@register_algorithm("fedadam")
class FedAdam(AdaptiveFedOpt):
    """FedOpt with Adam on the server (Reddi et al., ICLR 2021): v ← β2·v + (1 − β2)·Δ²."""

    Config = FedAdamConfig

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        b2 = self.config.beta2
        return b2 * v + (1.0 - b2) * delta.square()


@register_algorithm("fedyogi")
class FedYogi(AdaptiveFedOpt):
    """FedOpt with Yogi on the server (Reddi et al., ICLR 2021): v ← v − (1 − β2)·Δ²·sign(v − Δ²)."""

    Config = FedYogiConfig

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        d2 = delta.square()
        return v - (1.0 - self.config.beta2) * d2 * torch.sign(v - d2)


@register_algorithm("fedadagrad")
class FedAdagrad(AdaptiveFedOpt):
    """FedOpt with Adagrad on the server (Reddi et al., ICLR 2021): v ← v + Δ²."""

    Config = FedAdagradConfig

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return v + delta.square()
