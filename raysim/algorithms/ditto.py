"""Ditto (Li et al., ICML 2021): beside the global model, which is trained and averaged as in FedAvg, each client
trains a personal model of its own, pulled towards the global one by a proximal term; clients predict with it.

Paper: T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021 (arXiv:2012.04221), Algorithm 1. Authors' code: github.com/litian96/ditto
(``flearn/trainers_MTL/ditto.py`` ``Server.train``: for each local iteration, on the same batch, one SGD step of the
personal model v_k on ∇F_k(v_k) + λ(v_k − w^t), then one of the global model's local copy on ∇F_k; the round's
global model w^t stays fixed; ``fedbase.py``: every v_k starts as the initial model; ``run_*_ditto_lam1.sh``: λ = 1).

Client k in round t downloads w^t and, from w = w^t and its own v_k, minimises over each batch

    L = CE(w; x, y) + CE(v_k; x, y) + (λ/2)·‖v_k − w^t‖²

The two parameter sets are disjoint, so the gradient of L in w is ∇F_k(w) and in v_k is ∇F_k(v_k) + λ(v_k − w^t):
one optimiser step on L is the authors' two steps on the same batch (with ``train.momentum``/``weight_decay`` each set
keeps its own, per-parameter, optimiser state). The personal model is a submodule (``model.personal``, added by
``adapt_model`` as a copy of the freshly built model, so it starts at the initial weights as in the authors' code);
``is_shared`` keeps it out of uploads and payloads, and it is kept as client state (stored by the driver outside the
workers, checkpointed). w^t is read from the payload, a private copy training never changes. The server averages the
uploaded w_k by training samples (FedAvg; the authors sample clients in proportion to their data and take the
plain mean, which is the same in expectation).

Evaluation (``algorithm.predict``): ``personal`` (default, the paper's) predicts with v_k, and ``acc_mean`` is the
mean personalised accuracy; ``global`` predicts with w^{t+1} and logs its pooled ``acc_global`` as well.

* ``algorithm.lam`` λ = 1 (the authors' run scripts; their ``main.py`` default 0 gives each client a purely local
  model, which ``lam: 0`` also gives here). Not reproduced: the robustness experiments' corrupted clients.

**Per-client λ** (``algorithm.select_lam: true``; off by default). The paper (its appendix on the experimental
setup: local data split "into train/test/validation sets randomly", "we select λ locally based on its local
validation data", candidates {0.1, 1, 2} outside strong attacks, a fixed λ = 1 for devices with fewer than 4
validation samples) as the authors' code does it (``--dynamic_lam``: ``flearn/models/client.py`` holds out the
last 10 % of each client's training data, ``train_data[int(0.9·n):]``, as validation data, and both models train on
the rest; ``flearn/trainers_MTL/ditto.py`` lines 96-113, at every local step of v_k: for each candidate λ in turn,
the look-ahead step v' = v_k − η(∇F_k(v_k) + λ(v_k − w^t)) on the step's batch, its validation loss F_k^val(v'), and
the λ of the least one is taken, the first on ties, ``if l < tmp_loss``). Here ``client_setup`` cuts the held-out
tail off ``ctx.train_data`` (``algorithm.val_fraction`` 0.1, so uploads are weighted by the 90 % trained on, as the
authors' ``train_samples``), ``client_loss`` picks λ by ``select_lam`` (the validation loss in eval mode, on the
personal model's look-ahead parameters) and uses it in the proximal term, so that with plain SGD the optimiser's
step on v_k is the chosen look-ahead step exactly (with momentum or weight decay, the selection is the authors'
and the step the optimiser's). ``algorithm.lam_candidates`` [0.1, 1, 2]; a client with fewer than 4 held-out samples
keeps ``algorithm.lam`` (the paper's fallback, λ = 1 by default; the authors' code has none). The held-out part is
the tail of the client's training split, as in the authors' code (raysim's partitions draw each client's samples at
random). Its clients train one at a time (a stack's loss has no validation data): ``engine.vectorize=auto``
does so, an explicit N is refused.
* Bytes: up and down = the global model; the personal model stays on the client.

Logged loss parts: ``loss_ce`` (the global model's), ``loss_personal`` (the personal model's CE) and ``loss_prox``
((λ/2)‖v_k − w^t‖²); ``loss`` is their sum.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.algorithms.configs.ditto import DittoConfig
from raysim.algorithms.fedprox import proximal_term
from raysim.errors import UserError
from raysim.registry import register_algorithm

PERSONAL = "personal"
PERSONAL_PREFIX = PERSONAL + "."
VALIDATION = "ditto_validation"  # ctx.scratch: the held-out (x, y) of select_lam
MIN_VALIDATION = 4  # fewer held-out samples: the fixed λ (the paper's experimental setup)


def select_lam(params: dict[str, torch.Tensor], grads: Sequence[torch.Tensor], anchor: dict[str, torch.Tensor],
               candidates: Sequence[float], lr: float,
               val_loss: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> tuple[float, list[float]]:
    """(the chosen λ, each candidate's validation loss): for each λ the look-ahead v' = v − lr·(g + λ(v − w^t)) of
    the personal parameters ``params`` (v) with their gradients ``grads`` (g) and the download ``anchor`` (w^t), and
    ``val_loss(v')``; the least loss wins, the earlier candidate on ties (the authors' ``if l < tmp_loss``). No
    finite loss: the first candidate."""
    losses = []
    with torch.no_grad():
        for lam in candidates:
            ahead = {k: v - lr * (g + lam * (v - anchor[k])) for (k, v), g in zip(params.items(), grads)}
            losses.append(float(val_loss(ahead)))
    best = 0
    for i, loss in enumerate(losses):
        if loss < losses[best] or not losses[best] == losses[best]:  # NaN never wins
            best = i
    return float(candidates[best]), losses


@register_algorithm("ditto")
class Ditto(Algorithm):
    """A personal model per client, trained beside the global one and pulled to it by (λ/2)‖v − w^t‖²."""

    Config = DittoConfig
    shared = "all"  # everything but the personal model (is_shared)
    # engine.vectorize: both losses run on the stack's swapped-in weights (the personal model is a submodule) and
    # the proximal term on the shared download
    vectorizable = True

    @property
    def has_global_model(self) -> bool:
        return self.config.predict == "global"

    def is_shared(self, key: str) -> bool:
        return not key.startswith(PERSONAL_PREFIX)

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model.add_module(PERSONAL, copy.deepcopy(model))  # the initial weights, as the global model's
        return model

    def check(self, cfg, data) -> None:
        super().check(cfg, data)
        if self.config.select_lam and cfg.engine.vectorize not in ("off", "auto"):
            raise UserError("config key 'algorithm.select_lam': ditto picks λ on each client's validation data, "
                            "which a stack's loss does not see; set engine.vectorize=off")

    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """The usual setup; with ``select_lam`` in a training job, the last ``val_fraction`` of the client's training
        data held out (``ctx.scratch``) and the rest left to train on (the authors' ``client.py``)."""
        super().client_setup(model, ctx)
        if self.config.select_lam and ctx.round > 0 and ctx.train_data is not None:
            x, y, idx = ctx.train_data
            cut = int(len(y) * (1 - self.config.val_fraction))
            ctx.train_data = (x[:cut], y[:cut], idx[:cut])
            if len(y) - cut >= MIN_VALIDATION:
                ctx.scratch[VALIDATION] = (x[cut:], y[cut:])

    def client_lam(self, personal: nn.Module, ce_personal: torch.Tensor, ctx: ClientContext) -> float:
        """λ for this step: ``algorithm.lam``, or with ``select_lam`` the candidate whose look-ahead step has the
        least validation loss (``select_lam``)."""
        held_out = ctx.scratch.get(VALIDATION)
        if held_out is None:
            return self.config.lam
        params = dict(personal.named_parameters())
        grads = torch.autograd.grad(ce_personal, list(params.values()), retain_graph=True)
        xv, yv = held_out
        was_training = personal.training
        personal.eval()
        try:
            lam, _ = select_lam(params, grads, ctx.payload["model"], self.config.lam_candidates, self.cfg.train.lr,
                                lambda ahead: F.cross_entropy(torch.func.functional_call(personal, ahead, (xv,)), yv))
        finally:
            personal.train(was_training)
        return lam

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ce = F.cross_entropy(model(x), y)
        personal = getattr(model, PERSONAL)
        ce_personal = F.cross_entropy(personal(x), y)
        w_t = ctx.payload["model"]
        lam = self.client_lam(personal, ce_personal, ctx) if self.config.select_lam else self.config.lam
        prox = proximal_term(((p, w_t[name]) for name, p in personal.named_parameters()), lam)
        return ce + ce_personal + prox, {"ce": ce, "personal": ce_personal, "prox": prox}

    def predict(self, model: nn.Module, x: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        return getattr(model, PERSONAL)(x) if self.config.predict == "personal" else model(x)
