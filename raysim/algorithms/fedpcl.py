"""FedPCL (Tan et al., NeurIPS 2022): frozen pretrained backbones, a trainable projection, and class prototypes as the
only thing that travels.

Paper: Y. Tan, G. Long, J. Ma, L. Liu, T. Zhou, J. Jiang, "Federated Learning from Pre-Trained Models: A Contrastive
Learning Approach", NeurIPS 2022 (arXiv:2209.10083). Authors' code: github.com/yuetan031/FedPCL (``lib/update.py``
``LocalUpdate.update_weights_lg`` for the loss and the prototypes, ``LocalTest.test_inference_twoway`` for the
prediction; ``lib/losses.py`` ``ConLoss``; ``lib/models/models.py`` ``ProjandDeci``; ``lib/utils.py`` ``agg_func``,
``proto_aggregation``; ``exps/federated_main.py`` ``FedPCL`` for the round; ``lib/options.py`` for the defaults). This
file follows the released code where it is more specific than the paper.

Model. Each client's backbone f_i (its ``model.name``: any architecture, HETE included, since only prototypes travel)
is FROZEN and pretrained: it runs in eval mode without gradients. On top, the authors' ``ProjandDeci`` projection:
z = normalize(ReLU(W_1 f_i(x))), W_1: feature_dim -> 256 (``algorithm.proj_dim``), trained; its decision layer is
never trained by the loss nor used to predict, so ``model.head`` (Linear(256, classes)) stays as initialised. Only W_1
trains (``local_phases``), with the authors' optimiser: Adam, lr 1e-3, weight decay 1e-4 (set in the configs:
``train.optimizer: adam``, ``train.lr: 0.001``, ``train.weight_decay: 0.0001``).

Prototypes. After local training, client i's local prototype of class j is the mean z over its training samples of
class j (eval mode; the authors average over the training loader's full batches). The server keeps every client's
newest local prototypes {C_m} and their plain per-class mean, the global prototypes C̄ (``proto_aggregation``: each
client that holds a class weighs 1). Each round every client downloads all clients' local prototypes and C̄; it
uploads its own (``protos`` [k, 256] for the k classes it holds, ``counts`` [classes] int32).

Local objective (``update_weights_lg``): with the batch's features of two views, z_b^(v) (b = 1..B, v = 1, 2), anchors
a_{(v,b)} = P[y_b] (a prototype, not a sample) and τ = 0.07 (``ConLoss(temperature=0.07)``; base temperature 0.07):

    L = Σ_{m=1}^{M} ℓ(P = C_m ∪ C̄)        (M: every client with prototypes at the server, this client included;
                                              classes client m lacks are filled with C̄, as the authors' loop does)
    ℓ(P) = −(τ/τ_b) · (1/2B) Σ_{(v,b)} (1/|Pos_{vb}|) Σ_{(w,c)∈Pos_{vb}} log [ exp(a_{vb}·z_c^(w)/τ)
                                                            / Σ_{(w',c') ≠ (v,b)} exp(a_{vb}·z_{c'}^(w')/τ) ]

Pos_{vb} = the other 2B − 1 features with label y_b (the authors' SupCon mask with its diagonal removed). The
global prototypes enter through the fill; the released code has no separate global-prototype term (the paper's text,
which could not be re-read here, describes contrast with both global and local prototypes; ``algorithm.global_weight``
> 0 adds w · ℓ(C̄) for that reading; 0, the default, is the code). The CE of the decision layer is computed by the
authors but not in the loss (``loss = loss2``). Round 1 (no prototypes yet): the loss is 0 · z, as the authors'
``0 * loss1``, so only Adam's weight decay moves W_1. The authors wait until every client has uploaded once
(``len(global_protos) == num_users``: round 2 with their full participation); here the loss starts as soon as the
server holds any prototypes (the same under full participation, as in every UNIDEAL setting).

Views. The authors' ``TwoCropTransform`` wraps deterministic transforms (resize, normalise) for Digit-5, Office-10
and DomainNet, so their two views are the same image; here likewise the batch is counted twice, and since the frozen
backbone and the projection are deterministic the second forward pass is skipped (identical features).

Prediction (``test_inference_twoway``): the class of the client's OWN local prototype nearest to z in mean squared
distance, among the classes it holds (``predict`` returns minus that distance).

Pretrained weights. ``model.weights`` (a torchvision-format state dict of the backbone, or one per client) loads real
pretrained backbones (the authors use three ResNet-18s pretrained on Quickdraw, Aircraft and CUB and concatenate
their features; this module uses each client's one backbone, the authors' ``--num_bb 1`` variant). No weights can be
downloaded here, so without ``model.weights`` an OFFLINE STAND-IN is used: raysim pre-trains each backbone centrally
(SGD, momentum 0.9, CE with a linear classifier) on the server's holdout (``data.server_holdout``: that share of
each client's training samples, taken out of every method's clients alike, so FedPCL trains on the same client data
as every other method of the comparison; no client holds the pre-training samples), one backbone per architecture
and input shape (and per client where clients see different columns; each on its clients' held-out samples), and
caches it under
``algorithm.pretrain.cache_dir``, else ``data.cache_dir``, else ``$RAYSIM_CACHE``, else ``~/.cache/raysim`` (in
``fedpcl-backbone/``). This stand-in is NOT a public foundation model: its features come from a little in-domain
data, so FedPCL's numbers with it are not the paper's regime; say so wherever they are reported.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, eval_features, ClientContext, ClientUpdate, split_state
from raysim.algorithms.fedproto import class_prototypes, dense_prototypes
from raysim.config import ExperimentConfig
from raysim.data.base import FederatedData, is_indexed
from raysim.algorithms.central import cached, derived_seed, recipe_key, require_finite, train_classifier
from raysim.algorithms.configs.fedpcl import FedPCLConfig
from raysim.errors import UserError
from raysim.registry import register_algorithm

BACKBONES_KEY = "fedpcl.backbones"  # data.meta: group name -> stand-in backbone state dict
GROUP_KEY = "fedpcl.client_group"  # data.meta: client id -> group name (None: model.weights, or none needed)
# 2: a trailing one-sample batch is trained (merged, as the workers do); v1 skipped it. 3: keyed by
# raysim.algorithms.central.recipe_key (dtypes and shapes hashed too), without the device
CACHE_VERSION = 3
_CHUNK = 1024


# ---------------------------------------------------------------------------------------------- the math
def prototype_contrastive_loss(features: torch.Tensor, labels: torch.Tensor, protos: torch.Tensor,
                               present: torch.Tensor, tau: float = 0.07, base_tau: float = 0.07) -> torch.Tensor:
    """The authors' ``ConLoss`` (contrast_mode 'all'): ``features`` [B, V, d] (V views), ``labels`` [B], ``protos``
    [classes, d] dense with ``present`` [classes] bool. Anchor row (v, b) is the prototype of y_b; the contrast set is
    all V·B features; positives are those with label y_b except the row's own index (the diagonal); the loss is
    −(τ/τ_b) × the mean over anchors of the mean log-probability of their positives. Anchors whose class has no
    prototype are left out (the authors fill every class before calling it)."""
    bsz, views = features.shape[:2]
    contrast = torch.cat(torch.unbind(features, dim=1), dim=0)  # [V·B, d]: view-major, as torch.cat(unbind)
    rep_labels = labels.repeat(views)
    anchors = protos.to(contrast.dtype)[rep_labels]
    logits = anchors @ contrast.T / tau
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    n = views * bsz
    not_self = ~torch.eye(n, dtype=torch.bool, device=contrast.device)
    positive = (rep_labels[:, None] == rep_labels[None, :]) & not_self
    exp = torch.exp(logits) * not_self
    log_prob = logits - torch.log(exp.sum(1, keepdim=True))
    per_anchor = (positive * log_prob).sum(1) / positive.sum(1).clamp(min=1)
    keep = present[rep_labels] & (positive.sum(1) > 0)
    if not bool(keep.any()):
        return (features * 0).sum()
    return -(tau / base_tau) * per_anchor[keep].mean()


def mean_prototypes(uploads: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' ``proto_aggregation``: per class, the PLAIN mean of the prototypes of the clients that hold it
    (in the given order, float64). Returns (protos of the classes any client holds, ascending; how many clients hold
    each class, int32)."""
    num_classes, dim = len(uploads[0][1]), uploads[0][0].shape[1]
    sums = torch.zeros(num_classes, dim, dtype=torch.float64)
    holders = torch.zeros(num_classes, dtype=torch.int64)
    for protos, counts in uploads:
        present = counts > 0
        sums[present] += protos.to(torch.float64)
        holders[present] += 1
    present = holders > 0
    return (sums[present] / holders[present, None].to(torch.float64)).float(), holders.to(torch.int32)


def filled(protos: torch.Tensor, counts: torch.Tensor, global_dense: torch.Tensor,
           global_present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Client m's prototypes as dense [classes, d] rows, classes it lacks filled with the global prototype."""
    dense, present = dense_prototypes(protos, counts)
    missing = ~present & global_present
    dense[missing] = global_dense[missing].to(dense.dtype)
    return dense, present | global_present


# ---------------------------------------------------------------------------------------------- the model
class FrozenProjection(nn.Module):
    """z = normalize(ReLU(proj(f(x)))) with f frozen: always in eval mode, run without gradients."""

    def __init__(self, frozen: nn.Module, in_dim: int, out_dim: int):
        super().__init__()
        self.frozen = frozen.requires_grad_(False)
        self.proj = nn.Linear(in_dim, out_dim)

    def train(self, mode: bool = True) -> "FrozenProjection":
        super().train(mode)
        self.frozen.eval()  # batch norm keeps its pretrained statistics
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.frozen(x)
        return F.normalize(F.relu(self.proj(h)), dim=1)


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("fedpcl")
class FedPCL(Algorithm):
    """Frozen backbone and a trained projection; only prototypes travel (prototype-contrastive loss)."""

    Config = FedPCLConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "none"  # no weights travel: prototypes and counts do

    # ------------------------------------------------------------------ model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        model.backbone = FrozenProjection(model.backbone, model.head.in_features, self.config.proj_dim)
        model.head = nn.Linear(self.config.proj_dim, model.head.out_features)  # the decision layer: never trained
        return model

    @staticmethod
    def _trainable(key: str) -> bool:
        return not key.startswith("backbone.frozen.")

    # ------------------------------------------------------------------ driver side
    def prepare_data(self, data: FederatedData) -> FederatedData:
        """Pre-train the stand-in backbones for the clients without ``model.weights`` (cached on disk)."""
        if not is_indexed(data):
            raise UserError(f"config key 'data.name': fedpcl needs a dataset of shared sample indices; "
                            f"{self.cfg.data.name} makes its clients on demand")
        groups = stand_in_groups(self.cfg, data)
        data.meta[GROUP_KEY] = groups
        data.meta[BACKBONES_KEY] = {}
        needed = sorted({g for g in groups.values() if g is not None})
        if needed:
            if data.holdout_by_client is None:
                raise UserError("config key 'data.server_holdout': fedpcl's offline stand-in backbone pre-trains on "
                                "the server's holdout, which is 0 here; set data.server_holdout (e.g. 0.1) in every "
                                "config of the comparison, so every method trains on the same client data, or give "
                                "pretrained backbones with model.weights")
            members = {g: [c for c, gc in groups.items() if gc == g] for g in needed}
            pretrain = {c: data.holdout_by_client[c] for g in needed for c in members[g]}
            if not all(len(pretrain[c]) for c in pretrain):
                raise UserError(f"config key 'data.server_holdout': {self.cfg.data.server_holdout} leaves a client "
                                f"with no held-out sample to pre-train fedpcl's stand-in backbone on; raise it")
            for g in needed:
                data.meta[BACKBONES_KEY][g] = stand_in_backbone(self.cfg, data, members[g], pretrain)
        return data

    def init_server_state(self, initial_state: dict) -> dict:
        return {"local": {}, "protos": None, "counts": None}

    def server_payload(self, server_state: dict, round: int) -> dict:
        if not server_state["local"]:
            return {}  # round 1: no prototypes yet
        ids = sorted(server_state["local"])
        return {"global_protos": server_state["protos"], "global_counts": server_state["counts"],
                "local_protos": [server_state["local"][c][0] for c in ids],
                "local_counts": [server_state["local"][c][1] for c in ids]}

    def eval_payload(self, server_state: dict) -> dict:
        return {}  # prediction uses the client's own prototypes, kept in its state

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        for u in updates:
            if u.upload:
                server_state["local"][u.client_id] = (u.upload["protos"], u.upload["counts"])
        if server_state["local"]:
            ids = sorted(server_state["local"])
            server_state["protos"], server_state["counts"] = mean_prototypes([server_state["local"][c] for c in ids])
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        counts = server_state.get("counts")
        return {"proto_classes": int((counts > 0).sum()) if counts is not None else 0}

    # ------------------------------------------------------------------ client side
    def _load_backbone(self, model: nn.Module, ctx: ClientContext) -> None:
        """The client's stand-in backbone (``model.weights`` ones are in the model since it was built)."""
        group = ctx.meta.get(GROUP_KEY, {}).get(ctx.client_id)
        if group is not None:
            model.backbone.frozen.load_state_dict(ctx.meta[BACKBONES_KEY][group])

    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        self._load_backbone(model, ctx)
        if ctx.state.get("model"):
            model.load_state_dict(ctx.state["model"], strict=False)

    def local_phases(self, model: nn.Module, ctx: ClientContext) -> list[tuple]:
        return [(list(model.backbone.proj.parameters()), self.cfg.train.local_epochs)]

    def _prototype_sets(self, ctx: ClientContext) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """[(dense [classes, d], present)] per client at the server, filled with the global prototypes; then the
        global ones (built once per job: the payload is this job's private copy)."""
        if "_sets" not in ctx.payload:
            g_dense, g_present = dense_prototypes(ctx.payload["global_protos"], ctx.payload["global_counts"])
            sets = [filled(p, n, g_dense, g_present)
                    for p, n in zip(ctx.payload["local_protos"], ctx.payload["local_counts"])]
            ctx.payload["_sets"] = (sets, (g_dense, g_present))
        return ctx.payload["_sets"]

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        z = model.features(x)
        if "local_protos" not in ctx.payload:
            loss = (z * 0).sum()  # the authors' 0 * loss1 before there are prototypes
            return loss, {"con": loss.detach()}
        views = torch.stack([z, z], dim=1)  # two identical views (deterministic transform), see the docstring
        c = self.config
        sets, (g_dense, g_present) = self._prototype_sets(ctx)
        loss = z.new_zeros(())
        for dense, present in sets:
            loss = loss + prototype_contrastive_loss(views, y, dense, present, c.tau, c.base_tau)
        if c.global_weight > 0:
            loss = loss + c.global_weight * prototype_contrastive_loss(views, y, g_dense, g_present, c.tau, c.base_tau)
        return loss, {"con": loss}

    @torch.no_grad()
    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        """This client's local prototypes: mean projected feature per class over its whole training split."""
        x, y, _ = ctx.train_data
        feats = eval_features(model, x, _CHUNK)
        protos, counts = class_prototypes(feats, y, ctx.num_classes)
        ctx.scratch["protos"] = (protos, counts)
        return {"protos": protos, "counts": counts}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        """The projection (and the untrained decision layer) and the client's own prototypes, to predict with."""
        protos, counts = ctx.scratch["protos"]
        return {"model": split_state(model, self._trainable), "protos": protos, "counts": counts}

    def predict(self, model: nn.Module, x: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        z = model.features(x)
        state = ctx.state
        if "protos" not in state:  # a client that never trained holds no prototypes
            return z.new_zeros(len(z), model.head.out_features)
        return own_prototype_logits(z, state["protos"], state["counts"])


def own_prototype_logits(z: torch.Tensor, protos: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Minus the mean squared distance to each of the client's own prototypes (the authors' ``loss_mse``); −inf for
    classes it does not hold. Argmax = the nearest own prototype."""
    dense, present = dense_prototypes(protos.to(z.device, z.dtype), counts.to(z.device))
    dist = ((z[:, None, :] - dense[None]) ** 2).mean(-1)
    return (-dist).masked_fill(~present[None], float("-inf"))


# ---------------------------------------------------------------------------------------------- the stand-in
def stand_in_groups(cfg: ExperimentConfig, data: FederatedData) -> dict[int, Optional[str]]:
    """Client -> the name of the stand-in backbone it uses (None where ``model.weights`` gives one): one per
    architecture and input shape, and per client for per-client architectures or clients with their own columns."""
    from raysim.registry import get_model

    groups: dict[int, Optional[str]] = {}
    for cid in range(data.num_clients):
        if cfg.model.weights_for(cid):
            groups[cid] = None
            continue
        arch = cfg.model.for_client(cid)
        name = f"{arch}:{'x'.join(map(str, data.input_shape(cid)))}"
        if getattr(get_model(arch), "per_client", False) or data.clients[cid].features is not None:
            name += f":client{cid}"
        groups[cid] = name
    return groups


def _cache_root(cfg: ExperimentConfig) -> Path:
    """``algorithm.pretrain.cache_dir``, else the data cache (``data.cache_dir``, ``$RAYSIM_CACHE``, ...)."""
    if cfg.algorithm.pretrain.cache_dir:
        return Path(cfg.algorithm.pretrain.cache_dir)
    from raysim.data.cache import cache_dir

    return cache_dir(cfg) / "fedpcl-backbone"


def stand_in_backbone(cfg: ExperimentConfig, data: FederatedData, members: list[int],
                      pretrain: dict[int, np.ndarray]) -> dict[str, torch.Tensor]:
    """Pre-train one backbone centrally on its clients' held-out samples; returns its state dict (cached)."""
    from raysim.algorithms.training import torch_threads
    from raysim.registry import get_model

    p = cfg.algorithm.pretrain
    first = members[0]
    arch, shape = cfg.model.for_client(first), data.input_shape(first)
    xs, ys = [], []
    for cid in members:
        split = data.clients[cid]
        view = FederatedData(domains=data.domains, num_classes=data.num_classes,
                             clients=[dataclasses.replace(split, train=pretrain[cid],
                                                          test=np.zeros(0, dtype=np.int64))])
        x, y, _ = view.tensors(0, "train")
        xs.append(x)
        ys.append(y)
    x, y = torch.cat(xs), torch.cat(ys)
    recipe = {"v": CACHE_VERSION, "arch": arch, "shape": list(shape), "client": first,
              "model": {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in ("name", "weights")},
              "epochs": p.epochs, "lr": p.lr, "batch_size": p.batch_size, "seed": cfg.seed,
              "classes": data.num_classes}
    path = _cache_root(cfg) / f"{arch}-{recipe_key(recipe, (x, y))}.pt"
    seed = derived_seed(cfg.seed, first, 0xFED9C1)

    def build() -> nn.Module:
        return get_model(arch)(input_shape=shape, cfg=cfg.model, client_id=first, seed=cfg.seed)

    def fits(entry: dict[str, torch.Tensor]) -> bool:
        torch.manual_seed(seed)  # as for training (building draws initial weights from the global RNG)
        try:
            build().load_state_dict(entry)  # raises on any key or shape mismatch: train again
        except RuntimeError:
            return False
        return True

    def train(device: torch.device) -> dict[str, torch.Tensor]:  # a reserved job: on a worker, on its device
        start = time.perf_counter()
        with torch_threads(cfg.engine.cpus_per_worker):
            model = train_classifier(build, x, y, feature_dim=cfg.model.feature_dim, num_classes=data.num_classes,
                                     epochs=p.epochs, lr=p.lr, batch_size=p.batch_size, seed=seed, device=device)
            out = {k: v.detach().cpu().clone() for k, v in model.backbone.state_dict().items()}
        require_finite(out.values(), key="algorithm.pretrain.lr",
                       what="the offline stand-in backbone diverged (NaN weights)")
        print(f"raysim: fedpcl: offline stand-in backbone ({arch} {list(shape)}, {len(y)} held-out samples of "
              f"clients {members}, {p.epochs} epochs) pre-trained on {device.type} "
              f"in {time.perf_counter() - start:.1f}s; it stands in "
              f"for a public pretrained model (set model.weights for a real one)", file=sys.stderr, flush=True)
        return out

    return cached(path, train, accept=fits, who="fedpcl", what="the stand-in backbone",
                  dir_key="algorithm.pretrain.cache_dir")
