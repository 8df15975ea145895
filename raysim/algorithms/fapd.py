"""FAPD (Liu et al., 2026): FedAvg plus progressive distillation of a teacher's feature space, paced by the server.

Driver: PCA of the teacher's features on a calibration split gives the rotation R (rows by descending variance);
each round sends P_t = R[:k_t] with the model, and after the round's evaluation the consensus controller grows
k_t once ``acc_global`` has stopped moving (``algorithm.curriculum``: consensus | fixed | linear).
Clients: ``CE + lambda_kd * KL(ẑ_T ‖ ẑ_S) + lambda_cl * InfoNCE(ẑ_S, class embeddings)`` in that k_t-dim subspace,
where z_S is the backbone output (``model.feature_dim`` = the teacher's D; zoo backbones end in a linear adapter
to that width) and z_T the teacher's features of the same samples, looked up by sample index.

Teacher features come from ``algorithm.teacher.features`` (a .npy [N, D] in the dataset's sample order), or, offline,
from a teacher that the server trains on its calibration split (``data.server_holdout``, held out of the clients'
training data for every method of a comparison alike, or carved for FAPD alone by
``algorithm.teacher.calibration_fraction``; no client holds it) and caches on disk (``raysim.curriculum.teacher``).
They reach each worker once, in ``data.meta``; a job carries sample indices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, ClientContext, TensorDict
from raysim.algorithms.configs.fapd import FAPDConfig
from raysim.curriculum.consensus import ConsensusController
from raysim.curriculum.pca import explained_variance, fit_pca
from raysim.curriculum.pkd import pkd_loss, semantic_contrastive_loss
from raysim.curriculum.teacher import class_means, offline_teacher_features
from raysim.data import hold_out
from raysim.data.base import FederatedData, is_indexed
from raysim.errors import UserError
from raysim.registry import register_algorithm

TEACHER_KEY = "fapd.teacher_features"  # data.meta: float32 [N, D], row i = teacher features of domain sample i
CLASSES_KEY = "fapd.class_embeddings"  # data.meta: float32 [C, D]
CALIBRATION_KEY = "fapd.calibration"  # data.meta: int64 indices of the server-held calibration split


@register_algorithm("fapd")
class FAPD(Algorithm):
    """FedAvg plus PCA-projected feature distillation, k grown by a consensus controller."""

    Config = FAPDConfig
    shared = "all"
    # engine.vectorize: the losses read the shared projection, the teacher features by each client's own sample
    # indices (ctx.sample_idx, per client under vmap) and per-process constants
    vectorizable = True
    tensorboard_charts = {"curriculum k": ["Curriculum/k"]}  # the curriculum dimension beside accuracy
    uploads = Uploads.model()  # FedAvg's model average (its payload adds the projection and the curriculum)

    # ------------------------------------------------------------------ driver: data, teacher, PCA
    def prepare_data(self, data: FederatedData) -> FederatedData:
        c, t = self.config, self.config.teacher
        if not is_indexed(data):
            raise UserError(f"config key 'data.name': fapd needs a dataset of shared sample indices; "
                            f"{self.cfg.data.name} makes its clients on demand")
        if len(data.domains) != 1:
            raise UserError(f"config key 'data.domains': fapd distils per-sample teacher features of one domain, "
                            f"but {self.cfg.data.name} has {len(data.domains)}")
        calibration = self._calibration(data)
        train_idx = np.unique(np.concatenate([s.train for s in data.clients] + [calibration]))
        if t.features is not None:
            feats = load_matrix(t.features, "algorithm.teacher.features", data.domains[0].name,
                                min_rows=int(train_idx.max()) + 1, max_rows=len(data.domains[0].y))
        else:
            feats, self._teacher_accuracy = offline_teacher_features(self.cfg, data, calibration)
        dim = feats.shape[1]
        if self.cfg.model.feature_dim != dim:
            raise UserError(f"config key 'model.feature_dim': fapd distils into the backbone output, which must be "
                            f"as wide as the teacher's features (D={dim}), got {self.cfg.model.feature_dim}")
        fit_idx = calibration if len(calibration) else train_idx  # no calibration split: the whole training set
        if t.class_embeddings is not None:
            classes = load_matrix(t.class_embeddings, "algorithm.teacher.class_embeddings", "the class list",
                                  min_rows=data.num_classes, max_rows=data.num_classes, cols=dim)
        else:
            classes = class_means(feats[fit_idx], data.domains[0].y[fit_idx], data.num_classes)
        for key, value in (("algorithm.k0", c.k0), ("algorithm.k_fixed", c.k_fixed)):
            if value is not None and value > dim:
                raise UserError(f"config key '{key}': {value} exceeds the teacher's feature dimension D={dim}")
        self._rotation, self._eigenvalues = fit_pca(feats[fit_idx])
        data.meta.update({TEACHER_KEY: feats, CLASSES_KEY: classes, CALIBRATION_KEY: calibration})
        return data

    def _calibration(self, data: FederatedData) -> np.ndarray:
        """The server's split: data.server_holdout (held out for every method alike) when set, else carved here."""
        fraction = self.config.teacher.calibration_fraction
        held = data.holdout if data.holdout is not None else np.zeros(0, dtype=np.int64)
        if len(held):
            if fraction is not None:
                raise UserError(f"config key 'algorithm.teacher.calibration_fraction': data.server_holdout="
                                f"{self.cfg.data.server_holdout} already holds out the server's split; set "
                                f"calibration_fraction to null to use it")
            if len(held) < 2:
                raise UserError(f"config key 'data.server_holdout': {self.cfg.data.server_holdout} leaves "
                                f"{len(held)} calibration samples; PCA needs at least 2")
            return held
        return carve_calibration(data, fraction, self.cfg.seed)

    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        state["rotation"] = self._rotation.float()
        state["eigenvalues"] = self._eigenvalues.float()
        state["curriculum"] = self._controller(None, dim=self._rotation.shape[0]).state_dict()
        return state

    def _controller(self, saved: Optional[dict], dim: int) -> ConsensusController:
        c = self.config
        k0 = (c.k_fixed or dim) if c.curriculum == "fixed" else c.k0
        ctrl = ConsensusController(k0, c.delta_k, c.epsilon, c.window, dim)
        if saved is not None:
            ctrl.load_state_dict(saved)
        return ctrl

    def server_payload(self, server_state: dict, round: int) -> dict:
        k = int(server_state["curriculum"]["k"])
        # a clone, not a view: pickling a view would ship the whole D x D rotation
        return {"model": server_state["model"], "projection": server_state["rotation"][:k].clone()}

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        """Record the round's accuracy and choose next round's k (consensus: unchanged after a round without
        evaluation); returns ``k``, the dimension this round used, and the curriculum's monitoring scalars."""
        ctrl = self._controller(server_state["curriculum"], dim=server_state["rotation"].shape[0])
        k_used = ctrl.k
        out: dict[str, Any] = {"k": k_used,
                               "curriculum/explained_variance": explained_variance(server_state["eigenvalues"], k_used)}
        teacher_acc = getattr(self, "_teacher_accuracy", float("nan"))
        if np.isfinite(teacher_acc):  # the offline teacher's accuracy outside its split: is it stronger than the model?
            out["curriculum/teacher_acc"] = teacher_acc
        acc = metrics.get("acc_global")
        if acc is not None:
            ctrl.update(acc)
            out["curriculum/stable"] = int(bool(ctrl.stable))
        if self.config.curriculum == "fixed":
            ctrl.k = k_used
        elif self.config.curriculum == "linear":
            ctrl.k = min(k_used + self.config.delta_k, ctrl.max_dim)
        server_state["curriculum"] = ctrl.state_dict()
        out["curriculum/k_next"] = ctrl.k
        return out

    # ------------------------------------------------------------------ clients
    @staticmethod
    def _teacher(ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's features and class embeddings as tensors on the job's device, copied once per process
        (batches index them in place)."""
        meta = ctx.meta
        return ctx.once(f"fapd.teacher.{id(meta.get(TEACHER_KEY))}",
                        lambda: (torch.tensor(np.asarray(meta[TEACHER_KEY]), device=ctx.device),
                                 torch.tensor(np.asarray(meta[CLASSES_KEY]), device=ctx.device)))

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feats = model.features(x)
        ce = F.cross_entropy(model.head(feats), y)
        projection = ctx.payload["projection"]
        teacher, classes = self._teacher(ctx)
        loss, parts = ce, {"ce": ce}
        if self.config.lambda_kd > 0:
            parts["kd"] = pkd_loss(feats, teacher[ctx.sample_idx.to(feats.device)], projection, self.config.kd_tau)
            loss = loss + self.config.lambda_kd * parts["kd"]
        if self.config.lambda_cl > 0:
            parts["cl"] = semantic_contrastive_loss(feats, classes, y, projection, self.config.tau)
            loss = loss + self.config.lambda_cl * parts["cl"]
        return loss, parts


# ---------------------------------------------------------------------- teacher data
def carve_calibration(data: FederatedData, fraction: Optional[float], seed: int) -> np.ndarray:
    """Move ``fraction`` of every client's training samples (keeping at least one) to the server; returns them.

    Taking the same share from every client makes the split follow the federation's overall label mix however
    skewed the clients are. Deterministic from the seed, so a resumed run carves the same split.
    """
    fraction = 0.1 if fraction is None else fraction  # null: the default share
    if fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    calibration = hold_out(data, fraction, seed)  # the same draw as data.server_holdout at that fraction
    if len(calibration) < 2:
        raise UserError(f"config key 'algorithm.teacher.calibration_fraction': {fraction} leaves "
                        f"{len(calibration)} calibration samples; PCA needs at least 2")
    return calibration


def load_matrix(path: str, key: str, what: str, *, min_rows: int, max_rows: int,
                cols: Optional[int] = None) -> np.ndarray:
    """A finite float32 [rows, cols] array from a .npy file, or a one-line UserError naming ``key``."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config key '{key}': file not found: {p}")
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - whatever numpy cannot read, the user sees one line naming the key
        raise UserError(f"config key '{key}': {p} is not a .npy array ({type(exc).__name__})") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 2 or not min_rows <= arr.shape[0] <= max_rows \
            or (cols is not None and arr.shape[1] != cols) or arr.shape[1] < 1:
        shape = list(arr.shape) if isinstance(arr, np.ndarray) else type(arr).__name__
        rows = str(max_rows) if min_rows == max_rows else f"{min_rows}..{max_rows}"
        raise UserError(f"config key '{key}': {p} has shape {shape}, expected [{rows}, {cols or 'D'}] "
                        f"(one row per sample of {what}, in its order)")
    out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(out).all():
        raise UserError(f"config key '{key}': {p} holds NaN or Inf values")
    return out
