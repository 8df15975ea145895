"""FedProto (Tan et al., AAAI 2022): clients exchange class prototypes, never model parameters.

Paper: Y. Tan, G. Long, L. Liu, T. Zhou, Q. Lu, J. Jiang, C. Zhang, "FedProto: Federated Prototype Learning across
Heterogeneous Clients", AAAI 2022 (arXiv:2105.00243). Authors' code: github.com/yuetan031/FedProto
(``lib/update.py`` ``LocalUpdate.update_weights_het``, ``lib/utils.py`` ``agg_func`` / ``proto_aggregation``,
``lib/options.py``, ``exps/federated_main.py`` ``FedProto_taskheter``).

Each client keeps its whole model (any architecture, any input shape: only ``feature_dim``-wide vectors travel).
With f_i the backbone of client i (``model.features``, the layer before the classifier head, as the authors'
``x1``) and D_{i,j} its training samples of class j:

  local prototype   C_i^j = (1/|D_{i,j}|) Σ_{x∈D_{i,j}} f_i(x)          (after local training, over ctx.train_data)
  global prototype  C̄^j  = Σ_{i∈N_j} |D_{i,j}| C_i^j / Σ_{i∈N_j} |D_{i,j}|  (N_j: this round's clients with class j)
  local objective   L_i = CE(head(f_i(x)), y) + λ · (1/(B·d)) Σ_{b: y_b has a C̄} ‖f_i(x_b) − C̄^{y_b}‖²

* Aggregation (``algorithm.aggregation``). ``count_weighted``, the default, is the COUNT-WEIGHTED average above
  that issue 12 asks for (the global prototype is then the mean feature of all the round's samples of that class;
  the paper's aggregation equation carries |D_{i,j}| weights as we recall it, its text could not be re-read here).
  ``mean`` is the authors' code: ``proto_aggregation`` takes a PLAIN mean over the clients that hold the class
  (each client's prototype weighs 1, whatever its count). With equal class counts on every client the two coincide.
* Regulariser. The authors use ``nn.MSELoss()`` between the batch features and a copy of them in which each row
  with a global prototype is replaced by it: the squared distance summed over samples that have a prototype,
  divided by batch size × feature_dim (rows without one contribute 0 but still count in B). ``ld`` (λ) = 1 is the
  authors' default (``lib/options.py --ld``). Round 1 has no prototypes yet: plain CE.
* Local prototypes. The authors average the features seen during the last local epoch's training batches
  (``agg_protos_label``, model changing under them); here, as the issue asks, the trained model is run once in
  eval mode over the client's whole training split (the paper's definition of C_i^j).
* Inference. The default ``predict: classifier`` is each client's own model(x) (the authors' "w/o protos"
  accuracy). ``predict: prototype`` is the paper's prototype inference (authors' ``test_inference_new_het_lt``
  "with protos"): the class whose global prototype is nearest (mean squared distance) to f_i(x), among the classes
  that have a global prototype and that the client holds in its training data.
* Bytes. A client uploads ``protos`` [k, feature_dim] float32 (k = classes present in its training data, rows in
  ascending class order) and ``counts`` [classes] int32 (zero = absent): at most classes × (feature_dim + 1) × 4
  bytes. The download is the same format for the global prototypes (nothing in round 1).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, eval_features, ClientContext, ClientUpdate
from raysim.algorithms.configs.fedproto import FedProtoConfig
from raysim.registry import register_algorithm

_CHUNK = 1024  # samples per forward pass when computing prototypes


# ---------------------------------------------------------------------------------------------- the math
def class_prototypes(features: torch.Tensor, labels: torch.Tensor,
                     num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of ``features`` [n, d]: (protos [k, d] float32 for the k classes present, ascending;
    counts [num_classes] int32). Accumulated in float64 on the CPU, so the result does not depend on the device's
    reduction order."""
    feats = features.detach().to("cpu", torch.float64)
    labels = labels.detach().to("cpu", torch.long)
    sums = torch.zeros(num_classes, feats.shape[1], dtype=torch.float64).index_add_(0, labels, feats)
    counts = torch.bincount(labels, minlength=num_classes)
    present = counts > 0
    return (sums[present] / counts[present, None]).float(), counts.to(torch.int32)


def dense_prototypes(protos: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparse form (rows for classes with count > 0) as [classes, d] rows and a [classes] bool mask."""
    present = counts > 0
    dense = protos.new_zeros(len(counts), protos.shape[1])
    dense[present] = protos
    return dense, present


def aggregate_prototypes(uploads: list[tuple[torch.Tensor, torch.Tensor]],
                         weighting: str = "count_weighted") -> tuple[torch.Tensor, torch.Tensor]:
    """Average per class of the clients' (protos, counts), accumulated in float64 in the given (client-id) order:
    ``count_weighted`` C̄^j = Σ_i n_ij C_i^j / Σ_i n_ij, or ``mean`` C̄^j = (1/|N_j|) Σ_{i∈N_j} C_i^j over the
    clients N_j that hold class j (the authors' ``proto_aggregation``). Returns the same sparse form (protos of the
    classes any client holds, ascending; summed counts)."""
    num_classes, dim = len(uploads[0][1]), uploads[0][0].shape[1]
    sums = torch.zeros(num_classes, dim, dtype=torch.float64)
    total = torch.zeros(num_classes, dtype=torch.int64)
    weight_sum = torch.zeros(num_classes, dtype=torch.float64)
    for protos, counts in uploads:
        present = counts > 0
        n = counts[present].to(torch.int64)
        w = n.to(torch.float64) if weighting == "count_weighted" else torch.ones(len(n), dtype=torch.float64)
        sums[present] += protos.to(torch.float64) * w[:, None]
        weight_sum[present] += w
        total[present] += n
    present = total > 0
    return (sums[present] / weight_sum[present, None]).float(), total.to(torch.int32)


def proto_regulariser(features: torch.Tensor, labels: torch.Tensor, protos: torch.Tensor,
                      present: torch.Tensor) -> torch.Tensor:
    """The authors' ``nn.MSELoss()(proto_new, protos)``: Σ_{b: y_b has a prototype} ‖f_b − C̄^{y_b}‖² / (B·d),
    with ``protos`` [classes, d] dense and ``present`` [classes] bool. Gradients flow into ``features`` only."""
    target = protos.detach()[labels]
    mask = present[labels].to(features.dtype)
    return ((features - target) ** 2 * mask[:, None]).sum() / features.numel()


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("fedproto")
class FedProto(Algorithm):
    """Only class prototypes travel; local training is pulled towards the global prototypes."""

    Config = FedProtoConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "none"  # no weights travel: prototypes and counts do

    # ------------------------------------------------------------------ driver side
    def init_server_state(self, initial_state: dict) -> dict:
        return {"protos": None, "counts": None}

    def server_payload(self, server_state: dict, round: int) -> dict:
        if server_state.get("protos") is None:
            return {}  # round 1: no global prototypes yet
        return {"protos": server_state["protos"], "counts": server_state["counts"]}

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        uploads = [(u.upload["protos"], u.upload["counts"]) for u in updates if u.upload]
        if uploads:  # the authors replace the global prototypes with this round's aggregate
            server_state["protos"], server_state["counts"] = aggregate_prototypes(uploads, self.config.aggregation)
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        counts = server_state.get("counts")
        return {"proto_classes": int((counts > 0).sum()) if counts is not None else 0}

    # ------------------------------------------------------------------ client side
    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """The whole model is the client's own; the payload holds prototypes only (read in the loss)."""
        if ctx.state:
            model.load_state_dict(ctx.state)

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        features = model.features(x)
        ce = F.cross_entropy(model.head(features), y)
        if "protos" not in ctx.payload:
            reg = torch.zeros((), device=ce.device)
        else:
            dense, present = self._dense_payload(ctx)
            reg = proto_regulariser(features, y, dense, present)
        return ce + self.config.ld * reg, {"ce": ce, "proto": reg}

    def _dense_payload(self, ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The payload's prototypes as [classes, d] rows and mask, built once per job (the payload is private)."""
        if "_dense" not in ctx.payload:
            ctx.payload["_dense"] = dense_prototypes(ctx.payload["protos"], ctx.payload["counts"])
        return ctx.payload["_dense"]

    @torch.no_grad()
    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        """This client's class prototypes, from its trained model (eval mode) over its whole training split."""
        x, y, _ = ctx.train_data
        feats = eval_features(model, x, _CHUNK)
        protos, counts = class_prototypes(feats, y, ctx.num_classes)
        return {"protos": protos, "counts": counts}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        """Everything stays on the client: backbone and head."""
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def predict(self, model: nn.Module, x: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        if self.config.predict == "classifier" or ctx is None or "protos" not in ctx.payload:
            return model(x)
        return prototype_logits(model.features(x), *self._dense_payload(ctx),
                                own_classes=None if ctx.train_data is None else ctx.train_data[1])


def prototype_logits(features: torch.Tensor, protos: torch.Tensor, present: torch.Tensor,
                     own_classes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Minus the mean squared distance to each global prototype (the authors' ``loss_mse(protos[i], C̄^j)``);
    -inf for classes without a prototype or, given ``own_classes`` (the client's training labels), not held by
    the client. Argmax = the nearest allowed prototype."""
    allowed = present.clone()
    if own_classes is not None:
        held = torch.zeros_like(present)
        held[own_classes.long().unique()] = True
        if (allowed & held).any():
            allowed &= held
    dist = ((features[:, None, :] - protos[None].to(features.dtype)) ** 2).mean(-1)
    return (-dist).masked_fill(~allowed[None], float("-inf"))
