"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term that keeps each local model near the global one.

Paper: T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020 (arXiv:1812.06127), Algorithm 2. Authors' code: github.com/litian96/FedProx
(``flearn/optimizer/pgd.py`` ``PerturbedGradientDescent``: the update ``w -= lr * (grad + mu * (w - w_t))``,
``flearn/trainers/fedprox.py``: w_t is the round's global model, set with ``set_params`` before local training).

Client k in round t minimises, from w = w_t,

    h_k(w; w_t) = CE_k(w) + (mu/2) · ||w − w_t||²

where w_t is the frozen global model this client downloaded this round (``ctx.payload["model"]``) and the norm runs
over every trainable parameter (not buffers such as BatchNorm statistics), as in the authors' PyTorch port in
github.com/QinbinLi/MOON ``main.py`` ``train_net_fedprox``. Its gradient in w is ∇CE_k(w) + mu·(w − w_t): exactly
the authors' PGD step. The server averages the whole model weighted by training samples (FedAvg's hooks).

* w_t is read from the payload, a private copy of the download that training never changes, never from the live
  parameters: a well-known bug of one public port compares the parameters with themselves, so the term is always 0.
* ``algorithm.mu`` default 0.01: the default of the authors' optimiser (``PerturbedGradientDescent(mu=0.01)``), and
  the middle of the grid the authors' README recommends tuning over ({0.001, 0.01, 0.1, 0.5, 1}; "there are no
  default mu values that would work for all settings"; their ``main.py`` flag defaults to 0, i.e. FedAvg).
  ``experiments/fapd/cifar*-fedprox.yaml`` use 0.001, the value in the MOON authors' own FedProx configs for this
  CIFAR setting (github.com/adap/flower ``baselines/moon/moon/conf/cifar10_fedprox.yaml``, ``cifar100_fedprox.yaml``).
* ``mu: 0`` is FedAvg exactly: the term is skipped, not added as 0 · term, and no extra metric is logged.

Logged loss parts (mu > 0): ``loss_ce`` and ``loss_prox`` (the (mu/2)·||w − w_t||² term itself).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.algorithms.configs.fedprox import FedProxConfig
from raysim.registry import register_algorithm


def proximal_term(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], mu: float | torch.Tensor) -> torch.Tensor:
    """(mu/2) · Σ ||w − w_t||² over (live parameter, frozen global value) pairs; w_t never receives a gradient."""
    total = None
    for w, w_t in pairs:
        sq = (w - w_t.detach()).pow(2).sum()
        total = sq if total is None else total + sq
    if total is None:
        raise ValueError("proximal_term: no parameters")
    return 0.5 * mu * total


@register_algorithm("fedprox")
class FedProx(Algorithm):
    """FedAvg plus a proximal term (mu/2)||w - w_t||^2 that keeps local training near the download."""

    Config = FedProxConfig
    shared = "all"
    # engine.vectorize: the proximal term reads the shared payload and the (swapped-in) parameters, nothing per client
    vectorizable = True

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mu = self.config.mu
        if mu == 0:
            return super().client_loss(model, x, y, ctx)  # FedAvg's loss, bit for bit
        ce = F.cross_entropy(model(x), y)
        w_t = ctx.payload["model"]
        prox = proximal_term(((p, w_t[name]) for name, p in model.named_parameters()), mu)
        return ce + prox, {"ce": ce, "prox": prox}
