"""FedBABU (Oh, Kim & Yun, ICLR 2022): train and average only the body; the head stays at its random
initialisation during federated training and is fine-tuned by each client for personalisation.

Paper: J. Oh, S. Kim, S.-Y. Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification",
ICLR 2022 (arXiv:2106.06042), Algorithm 1 and Sec. 4. Authors' code: github.com/jhoon-oh/FedBABU (``main_fed.py``
with ``--local_upt_part body --aggr_part body`` as in ``scripts/run_fedbabu.sh``; ``models/Update.py``
``LocalUpdate.train``: body at the round's learning rate, head at learning rate 0; ``analysis.ipynb``: the
personalisation, fine-tuning every parameter for ``personalization_epoch = 5`` epochs with SGD at lr 1e-3 and the run's
momentum; ``utils/options.py``: ``--ft_ep 5``).

Federated training. With θ the body (``model.backbone``) and h the head (``model.head``), h = h^0 for ever (the same
seeded random initialisation on every client). Client k in round t, from θ^t, minimises

    min_θ  (1/n_k) Σ_i CE(h^0(θ(x_i)), y_i)

for ``train.local_epochs`` epochs, the head not in the optimiser (``local_phases`` returns the body only, so the head
is bit for bit h^0 after every client job); it uploads θ_k, and the server averages θ^{t+1} = Σ_k n_k θ_k / Σ_k n_k
(raysim's FedAvg weighting; the authors' ``main_fed.py`` takes the plain mean over participants).

Personalised evaluation (``eval_setup``, ``eval_needs_train_data = True``): each client loads (θ^{t+1}, h^0) and
fine-tunes EVERY parameter for τ_f = ``finetune_epochs`` epochs on its training split,

    min_{θ, h}  (1/n_k) Σ_i CE(h(θ(x_i)), y_i)
    with SGD(lr = finetune_lr, momentum = train.momentum, no weight decay), batches of train.batch_size,

then predicts its test split with the fine-tuned model. The worker seeds evaluation per (seed, client, round), so
the shuffling, and the accuracy, is the same whatever the number of workers. Fine-tuning happens inside evaluation
only: nothing of it is kept, so federated training is unchanged by it (as in the authors' notebook, which
fine-tunes copies of the final global model).

``acc_mean`` is the mean personalised (fine-tuned) accuracy over clients, what UNIDEAL's table reports. The
un-fine-tuned global model (θ^{t+1}, h^0) has no separate evaluation in raysim's round (one evaluation gives
``acc_mean`` and the pooled ``acc_global`` from the same predictions), so ``acc_global`` is logged only with
``finetune_epochs: 0``: then every client predicts with the global model itself and ``acc_global`` is its pooled
accuracy (the paper's "without fine-tuning" figure), ``acc_mean`` its mean per-client accuracy.

Defaults: ``finetune_epochs`` = 5 (``--ft_ep 5``, ``personalization_epoch = 5``: the paper's τ_f = 5);
``finetune_lr`` = 0.001 (the notebook's fine-tuning lr; the authors' training runs use 0.1). Not reproduced: the
authors' learning-rate decay (×0.1 at 1/2 and 3/4 of the rounds) and FedBABU+ (server-side body training).
"""

from __future__ import annotations


import torch
from torch import nn

from raysim.algorithms.base import Algorithm, ClientContext
from raysim.algorithms.configs.fedbabu import FedBABUConfig
from raysim.algorithms.training import fit_classifier
from raysim.registry import register_algorithm


def fine_tune(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, momentum: float,
              batch_size: int) -> None:
    """Train every parameter of ``model`` on (x, y) for ``epochs`` epochs of plain CE with SGD, in place, through
    the engine's one local loop (``raysim.algorithms.training``); batches are shuffled with torch's default
    generator (the caller seeds it). Gradients are enabled here, so this runs inside the worker's no-grad
    evaluation."""
    params = list(model.parameters())
    with torch.enable_grad():
        for p in params:
            p.requires_grad_(True)
        fit_classifier(model, x, y, epochs=epochs, lr=lr, batch_size=batch_size, generator=None, momentum=momentum)
    for p in params:
        p.grad = None


@register_algorithm("fedbabu")
class FedBABU(Algorithm):
    """Frozen random head, body averaged; personalised by fine-tuning at evaluation."""

    Config = FedBABUConfig
    shared = "backbone"
    eval_needs_train_data = True  # personalised evaluation fine-tunes on the client's training split
    vectorizable = True  # engine.vectorize: FedAvg's loss on the body's phase (evaluation's fine-tuning is not stacked)

    @property
    def has_global_model(self) -> bool:
        """Only without fine-tuning do the evaluated models equal the global model (see the module docstring)."""
        return self.config.finetune_epochs == 0

    def local_phases(self, model: nn.Module, ctx: ClientContext) -> list[tuple[list[nn.Parameter], int]]:
        return [(list(model.backbone.parameters()), self.cfg.train.local_epochs)]  # the head is never trained

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        return {}  # the head is h^0 on every client: nothing personal to keep

    def eval_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        if ctx.payload.get("model"):  # (θ^{t+1}, h^0): the global model, whatever the client kept
            model.load_state_dict(ctx.payload["model"], strict=False)
        if self.config.finetune_epochs > 0 and ctx.train_data is not None:
            x, y, _ = ctx.train_data
            fine_tune(model, x, y, self.config.finetune_epochs, self.config.finetune_lr,
                      self.cfg.train.momentum, self.cfg.train.batch_size)
