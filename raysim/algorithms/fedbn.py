"""FedBN (Li et al., ICLR 2021): FedAvg in which every batch-norm layer stays local, for clients whose features
are shifted (one domain per client).

Paper: X. Li, M. Jiang, X. Zhang, M. Kamp, Q. Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021 (arXiv:2102.07623), Algorithm 1. Authors' code: github.com/med-air/FedBN
(``federated/fed_digits.py`` ``communication``: with ``--mode fedbn`` every state-dict entry whose key holds ``bn``
is skipped, the rest averaged and copied back to every client; ``nets/models.py`` ``DigitModel``: BatchNorm after
every convolution and hidden linear layer).

Each client k holds a whole model. Every round it trains it (FedAvg's local SGD) and uploads every entry except its
batch-norm layers' (weight γ, bias β, running mean and variance, batch counter); the server averages those entries,
weighted by training samples, and sends them back; the client loads them over its own batch-norm layers, which
never leave it (client state, kept by the driver outside the workers, checkpointed; before a client's first round,
the initial model's). It predicts with the averaged layers and its own batch norm: ``acc_mean`` is the mean of
these personalised accuracies (the paper's per-domain test accuracy), and there is no ``acc_global``, since no single
model exists.

* Which entries are batch norm: those of every module that tracks running statistics (``running_mean``), found from
  the state-dict keys (``base.batchnorm_keys``), so the driver and the workers agree on them without a model; the
  authors match ``'bn' in key``, which holds for their models' names. A model without any is refused in one line
  (``check``): FedBN would then be FedAvg. ``model.name: cnn_bn`` is the small CNN with batch norm after both
  convolutions and the feature layer, as the authors' ``DigitModel`` places it.
* Weighting: the authors average with equal client weights (``client_weights = [1/client_num ...]``) on domains of
  equal size (``--percent``); here by training samples, raysim's FedAvg weighting (the same on equal sizes), so
  FedBN and FedAvg differ only in what stays local; the authors' weights are ``algorithm.weighting=uniform``
  (summed where the clients trained all the same).
* Bytes: up and down = the model without its batch-norm layers.
"""

from __future__ import annotations

from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, ClientContext, TensorDict, batchnorm_keys
from raysim.config import ExperimentConfig
from raysim.data.base import FederatedData
from raysim.errors import UserError
from raysim.models import build_model
from raysim.registry import register_algorithm


def local_entries(model: nn.Module) -> set[str]:
    """The model's batch-norm entries: what FedBN keeps on the client."""
    return batchnorm_keys(model.state_dict().keys())


@register_algorithm("fedbn")
class FedBN(Algorithm):
    """FedAvg with local batch norm: clients keep their batch-norm layers; all other layers are averaged."""

    # the shared entries' weighted mean: batch norm stays on each client, so the upload is not the model it downloaded
    uploads = Uploads.mean()

    shared = "all"  # every layer but batch norm (check refuses mixed architectures, as for FedAvg)
    # engine.vectorize: FedAvg's client hooks; each client's batch norm is its own slice of the stack (equal to one
    # client at a time within float32 rounding: the stacked batch norm sums in another order)
    vectorizable = True

    @property
    def has_global_model(self) -> bool:
        return False

    def check(self, cfg: ExperimentConfig, data: FederatedData) -> None:
        super().check(cfg, data)
        arch = cfg.model.for_client(0)
        model = build_model(cfg, arch, data.input_shape(0), data.num_classes, 0, self)
        if not local_entries(model):
            raise UserError(f"config key 'model.name': fedbn keeps batch-norm layers local, but {arch} has none "
                            f"(use cnn_bn, resnet10, resnet18, mobilenet_v2 or vgg11_bn)")

    def init_server_state(self, initial_state: TensorDict) -> dict:
        local = batchnorm_keys(initial_state.keys())
        return {"model": {k: v.clone() for k, v in initial_state.items() if k not in local}}

    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        local = local_entries(model)
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k not in local}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        local = local_entries(model)
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in local}
