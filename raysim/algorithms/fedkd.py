"""FedKD (Wu et al., Nature Communications 2022): a private mentor and a shared mentee learn from each other; only the
mentee's update travels, SVD-compressed.

Paper: C. Wu, F. Wu, L. Lyu, Y. Huang, X. Xie, "Communication-efficient federated learning via knowledge
distillation", Nature Communications 13, 2032 (2022) (arXiv:2108.13323). Authors' code: github.com/wuch15/FedKD
(``model_bert.py`` ``ModelBert.forward`` for the loss, ``run.py`` ``train`` for the SVD compression, the energy
schedule and the aggregation, ``parameters.py`` for ``--tmin 0.95 --tmax 0.98``). This file follows the code where it
is more specific than the paper.

Models. The engine's model (``model.name``: the setting's model, ``backbone.*`` + ``head.*``) is the shared MENTEE;
``adapt_model`` attaches the private MENTOR (``model.mentor``, a ``ClassifierModel`` of ``algorithm.mentor``: by
default the mentee's architecture at twice the width, ``model.width`` x2 for the CNN and every ``model.hidden`` width
x2 for MLPs; widths do not apply to ResNets and the zoo has none larger than ResNet-18, so a ResNet-18 mentee gets a
second ResNet-18 unless ``algorithm.mentor.name`` says otherwise) and the hidden-state maps (``model.mentor_maps``).
Mentor and maps are
submodules that are not shared (``is_shared``: ``backbone.*``/``head.*`` only), so the worker's one optimiser trains
mentor, maps and mentee together, as the authors' one Adam over ``ModelBert.parameters()``, and they stay in the
client's state. The mentor predicts (``algorithm.predict: mentor``, the authors' test encodes with
``teacher_bert_models``); ``predict: mentee`` evaluates the mentee instead (then ``acc_global`` is logged).

Local objective (``ModelBert.forward``), with logits t = mentor(x), s = mentee(x), p = softmax:

    L = L_t + L_s + [ KL(p_s ‖ p_t) + KL(p_t ‖ p_s) + 2 · L_h ] / (L_t + L_s),   L_t = CE(t, y),  L_s = CE(s, y)
    L_h = Σ_{l=0}^{n_s−1} MSE( H_t[n_t−1−l·r], W_l H_s[n_s−1−l] ),   r = n_t // n_s

* KL terms: ``nn.KLDivLoss()`` with its default 'mean' reduction (mean over batch × classes, not per sample), nothing
  detached (both models learn from each other), and the adaptive factor 1/(L_t + L_s) not detached either, as in the
  code (the paper: distillation is weighted by how well the two models fit the labels).
* Hidden states H: each model's stage features (``ClassifierModel.forward_stages``: every Linear layer of an MLP, the
  CNN's two convolutions and feature layer, ResNet's stem and four layers; pre-ReLU, averaged over space), paired
  from the last stage backwards with stride r, as the authors pair the mentee's 4 BERT layers with layers 12, 9, 6, 3
  of the 12-layer mentor (``-layer*layerratio-1``). W_l is the paper's learnable linear map Linear(C_s, C_t) where
  the widths differ and the identity where they agree (the authors' widths agree, so their ``mdenses`` are unused).
  The authors' attention-map MSE has no counterpart in these models and is left out. The code adds L_h to both
  models' losses, hence the 2.

Communication (``run.py`` ``train``). A client uploads ΔW_i = W_i − W (its trained mentee minus the mentee it
started from). Every tensor with >= 2 dimensions (Linear weights; conv weights reshaped to [out, in·kh·kw]) travels
as the factors of its truncated SVD, ΔW ≈ (U_k S_k) V_k, k = the smallest number of singular values whose energy
Σ_{i<=k} σ_i² reaches T(t) Σ σ_i², with the energy threshold rising linearly over the rounds (t = 1..R):

    T(t) = T_start + (t / R) · (T_end − T_start),   T_start = 0.95, T_end = 0.98

(the authors' ``energy = tmin + ((1+comm_round)/epochs)*(tmax-tmin)``). Biases and other vectors travel dense. The
server averages the reconstructed updates (a plain mean over the round's clients, as ``np.mean``;
``algorithm.weighted: true`` weighs by training samples), compresses the average the same way and sends the factors
down; every client adds the reconstructed average to the mentee it started from (so the mentee stays identical on all
clients, and the server holds the same one). ``bytes_up``/``bytes_down`` count U·S [m, k] and V [k, n] float32
factors plus the dense vectors; nothing goes down in round 1 (every client builds the same initial mentee). A client
that missed the previous round's update (partial participation) downloads the dense mentee instead, counted for it.

Differences from the code, all minor: the authors upload U, σ and V separately (here U·S and V: k fewer floats); their
upload loop keeps the top k with energy strictly above T (here: reaching T; the two differ only on exact ties) and
never keeps all singular values (when only all of them reach T it keeps none, a bug; here all are kept); a zero
update travels as empty factors. Local optimisation (optimiser, lr, epochs, batch) is the setting's, as for every
method in a table: the authors' Adam at 3e-6 fine-tunes pretrained BERTs and means nothing for models trained here
from scratch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdate, split_state
from raysim.algorithms.configs.fedkd import FedKDConfig
from raysim.config import ExperimentConfig
from raysim.data.base import FederatedData
from raysim.errors import UserError
from raysim.models import BACKBONE_PREFIX, HEAD_PREFIX, ClassifierModel, init_seed
from raysim.registry import register_algorithm


# ---------------------------------------------------------------------------------------------- the math
def energy_threshold(round: int, total_rounds: int, t_start: float, t_end: float) -> float:
    """T(t) = T_start + (t/R)(T_end − T_start) for round t = 1..R (authors' ``energy``)."""
    return t_start + (round / total_rounds) * (t_end - t_start)


def energy_rank(singular_values: torch.Tensor, energy: float) -> int:
    """The smallest k with Σ_{i<=k} σ_i² >= energy · Σ σ_i² (0 for an all-zero matrix)."""
    e = singular_values.to(torch.float64) ** 2
    total = float(e.sum())
    if total == 0.0:
        return 0
    cumulative = torch.cumsum(e, 0)
    k = int(torch.searchsorted(cumulative, torch.tensor([energy * total], dtype=torch.float64))[0]) + 1
    return min(k, len(e))


def compress(delta: torch.Tensor, energy: float) -> dict[str, torch.Tensor]:
    """One tensor as it travels: {"us": U_k S_k [m, k], "v": V_k [k, n]} (float32) for tensors with >= 2 dims, the
    truncated SVD of the tensor reshaped to [shape[0], -1] at ``energy``; {"dense": tensor} otherwise."""
    if delta.dim() < 2 or not delta.is_floating_point():
        return {"dense": delta.detach().cpu().clone()}
    matrix = delta.detach().cpu().reshape(delta.shape[0], -1).to(torch.float64)
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    k = energy_rank(s, energy)
    return {"us": (u[:, :k] * s[:k]).float(), "v": vh[:k].float().contiguous()}


def reconstruct(packed: dict[str, torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """The tensor a ``compress`` result stands for (float32 for factors)."""
    if "dense" in packed:
        return packed["dense"]
    return (packed["us"].cpu() @ packed["v"].cpu()).reshape(shape)


def apply_update(base: dict[str, torch.Tensor], update: dict[str, dict]) -> dict[str, torch.Tensor]:
    """base + reconstructed update, key by key, on the CPU in the base's dtype: the server and every client compute
    exactly this, so their mentees stay bit-identical."""
    out = {}
    for k, w in base.items():
        w = w.detach().cpu()
        out[k] = (w + reconstruct(update[k], w.shape).to(w.dtype)).to(w.dtype)
    return out


def mutual_distillation_loss(mentor_logits: torch.Tensor, mentee_logits: torch.Tensor, y: torch.Tensor,
                             hidden: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The authors' ``loss1+loss3+loss_mse/(loss1+loss2)+loss2+loss4+loss_mse/(loss1+loss2)`` (see the module
    docstring): CEs, both KLs with ``nn.KLDivLoss()``'s mean over batch × classes, all scaled by 1/(L_t + L_s)."""
    ce_t = F.cross_entropy(mentor_logits, y)
    ce_s = F.cross_entropy(mentee_logits, y)
    log_t, log_s = F.log_softmax(mentor_logits, 1), F.log_softmax(mentee_logits, 1)
    p_t, p_s = log_t.exp(), log_s.exp()
    kl_t = (torch.xlogy(p_s, p_s) - p_s * log_t).mean()  # KLDivLoss(log p_t, p_s): the mentor learns from the mentee
    kl_s = (torch.xlogy(p_t, p_t) - p_t * log_s).mean()  # KLDivLoss(log p_s, p_t): the mentee learns from the mentor
    task = ce_t + ce_s
    loss = task + (kl_t + kl_s + 2.0 * hidden) / task
    return loss, {"ce_mentor": ce_t, "ce_mentee": ce_s, "kd": kl_t + kl_s, "hidden": hidden}


def stage_pairs(n_mentee: int, n_mentor: int) -> list[tuple[int, int]]:
    """(mentee stage, mentor stage) pairs from the last backwards, the mentor's with stride n_mentor // n_mentee
    (authors: mentee layer −l−1 with mentor layer −l·3−1)."""
    ratio = max(1, n_mentor // n_mentee)
    return [(n_mentee - 1 - l, n_mentor - 1 - l * ratio) for l in range(n_mentee)]


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("fedkd")
class FedKD(Algorithm):
    """Private mentor and shared mentee distil from each other; the mentee travels as SVD factors."""

    Config = FedKDConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "all"  # the mentee: one architecture and input shape everywhere (check); is_shared picks its keys

    @property
    def has_global_model(self) -> bool:
        return self.config.predict == "mentee"  # every client's mentee is the server's after aggregation

    def is_shared(self, key: str) -> bool:
        return key.startswith((BACKBONE_PREFIX, HEAD_PREFIX))

    def check(self, cfg: ExperimentConfig, data: FederatedData) -> None:
        super().check(cfg, data)
        from raysim.models import has_stages

        for key, arch in (("model.name", cfg.model.for_client(0)),
                          ("algorithm.mentor.name", self.config.mentor.name or cfg.model.for_client(0))):
            if not has_stages(arch):
                raise UserError(f"config key '{key}': fedkd distils hidden states, and {arch} exposes no stage "
                                f"features; use one of mlp, mlp_hete, cnn, resnet10, resnet18")

    # ------------------------------------------------------------------ model
    def _mentor_model_config(self) -> Any:
        m, base = self.config.mentor, self.cfg.model
        return dataclasses.replace(
            base, name=m.name or base.name, weights=None,
            width=m.width if m.width is not None else 2 * base.width,
            hidden=list(m.hidden) if m.hidden is not None else [2 * h for h in base.hidden],
            feature_dim=m.feature_dim if m.feature_dim is not None else base.feature_dim)

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Attach the mentor and the hidden-state maps (seeded from the run seed and the architecture alone)."""
        from raysim.registry import get_model

        shape, cid = model.input_shape, model.client_id
        mcfg = self._mentor_model_config()
        arch = self.config.mentor.name or self.cfg.model.for_client(cid)
        with torch.random.fork_rng(devices=[]):  # the CPU generator, forked and seeded; no CUDA device's touched
            torch.default_generator.manual_seed(init_seed(self.cfg.seed, f"fedkd-mentor:{arch}:{shape}"))
            backbone = get_model(arch)(input_shape=shape, cfg=mcfg, client_id=cid, seed=self.cfg.seed)
            mentor = ClassifierModel(backbone, mcfg.feature_dim, model.head.out_features)
            s_widths, t_widths = _stage_widths(model, shape), _stage_widths(mentor, shape)
            if len(t_widths) < len(s_widths):
                raise UserError(f"config key 'algorithm.mentor.name': the mentor ({arch}) has {len(t_widths)} "
                                f"stages, fewer than the mentee's {len(s_widths)}; fedkd maps each mentee stage to one "
                                f"of the mentor's")
            pairs = stage_pairs(len(s_widths), len(t_widths))
            maps = nn.ModuleList()
            for i_s, i_t in pairs:
                if s_widths[i_s] == t_widths[i_t]:
                    maps.append(nn.Identity())
                else:
                    layer = nn.Linear(s_widths[i_s], t_widths[i_t])
                    nn.init.xavier_uniform_(layer.weight, gain=1)  # as the authors' mdenses
                    maps.append(layer)
        model.mentor, model.mentor_maps, model.mentor_pairs = mentor, maps, tuple(pairs)
        return model

    # ------------------------------------------------------------------ driver side
    def init_server_state(self, initial_state: dict) -> dict:
        # version v: the mentee after round v's aggregation (0: the initial one); "held": the version each client
        # started its last round from (0 if it never trained), i.e. the mentee it keeps
        return {"model": {k: v.clone() for k, v in initial_state.items() if self.is_shared(k)},
                "version": 0, "update": None, "update_from": 0, "held": {}}

    def server_payload(self, server_state: dict, round: int) -> dict:
        if server_state["update"] is None:
            return {}  # round 1: every client holds the initial mentee
        return {"update": server_state["update"], "from": server_state["update_from"],
                "version": server_state["version"]}

    def eval_payload(self, server_state: dict) -> dict:
        return {} if self.config.predict == "mentor" else self.server_payload(server_state, -1)

    def client_payload(self, server_state: dict, client_id: int, round: int) -> Optional[dict]:
        """The dense mentee, for a client whose mentee the shared update does not apply to (it missed a round)."""
        if round == -1 and self.config.predict == "mentor":
            return None
        held = server_state["held"].get(client_id, 0)
        if held == server_state["version"] or (server_state["update"] is not None
                                               and held == server_state["update_from"]):
            return None
        return {"model": server_state["model"], "version": server_state["version"]}

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        uploads = [u for u in updates if u.upload]
        if not uploads:
            return server_state
        weights = [float(u.num_samples) if self.config.weighted else 1.0 for u in uploads]
        total = sum(weights)
        energy = energy_threshold(round, self.cfg.rounds, self.config.t_start, self.config.t_end)
        update = {}
        for k, w in server_state["model"].items():
            acc = torch.zeros(w.shape, dtype=torch.float64)
            for u, weight in zip(uploads, weights):  # client-id order
                acc.add_(reconstruct(u.upload["delta"][k], w.shape).to(torch.float64), alpha=weight / total)
            mean = acc if w.is_floating_point() else acc.round().to(w.dtype)
            update[k] = compress(mean, energy) if w.is_floating_point() and w.dim() >= 2 else \
                {"dense": mean.to(w.dtype)}
        before = server_state["version"]
        server_state["model"] = apply_update(server_state["model"], update)
        server_state.update(update=update, update_from=before, version=round)
        for u in uploads:
            server_state["held"][u.client_id] = before
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        update = server_state.get("update") or {}
        ranks = [p["us"].shape[1] for p in update.values() if "us" in p]
        return {"svd_energy": energy_threshold(round, self.cfg.rounds, self.config.t_start, self.config.t_end),
                "svd_rank_down": int(sum(ranks))}

    # ------------------------------------------------------------------ client side
    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """Load the private mentor and maps, then bring the mentee to the server's version: the dense mentee if
        sent, else the kept one plus the downloaded update (nothing in round 1)."""
        state, payload = ctx.state, ctx.payload
        if state.get("private"):
            model.load_state_dict(state["private"], strict=False)
        held = int(state.get("version", 0))
        base = {k: v.detach().cpu() for k, v in (state.get("mentee") or split_state(model, self.is_shared)).items()}
        version = held
        if "model" in payload:
            base, version = {k: v.detach().cpu().clone() for k, v in payload["model"].items()}, payload["version"]
        elif "update" in payload:
            if held != payload["from"]:
                raise RuntimeError(f"fedkd: client {ctx.client_id} holds mentee version {held}, but "
                                   f"the update applies to version {payload['from']} (and no dense mentee was sent)")
            base, version = apply_update(base, payload["update"]), payload["version"]
        model.load_state_dict(base, strict=False)
        ctx.scratch["base"], ctx.scratch["version"] = base, version

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mentee_logits, s_stages = model.forward_stages(x)
        mentor_logits, t_stages = model.mentor.forward_stages(x)
        hidden = mentee_logits.new_zeros(())
        for (i_s, i_t), w in zip(model.mentor_pairs, model.mentor_maps):
            hidden = hidden + F.mse_loss(w(s_stages[i_s]), t_stages[i_t])
        return mutual_distillation_loss(mentor_logits, mentee_logits, y, hidden)

    @torch.no_grad()
    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        """The mentee's update since the version it started from, every matrix as truncated-SVD factors."""
        energy = energy_threshold(ctx.round, ctx.total_rounds, self.config.t_start, self.config.t_end)
        base = ctx.scratch["base"]
        now = split_state(model, self.is_shared)
        return {"delta": {k: compress(now[k] - base[k], energy) for k in base}}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        """The mentee the client started from (the update comes next round), its version, and the private mentor."""
        return {"mentee": ctx.scratch["base"], "version": int(ctx.scratch["version"]),
                "private": split_state(model, lambda k: not self.is_shared(k))}

    def eval_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        if self.config.predict == "mentor":
            if ctx.state.get("private"):
                model.load_state_dict(ctx.state["private"], strict=False)
        else:
            self.client_setup(model, ctx)

    def predict(self, model: nn.Module, x: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        return model.mentor(x) if self.config.predict == "mentor" else model(x)


@torch.no_grad()
def _stage_widths(model: ClassifierModel, input_shape: tuple[int, ...]) -> list[int]:
    """Channels of each stage feature, from one forward pass of two zero inputs in eval mode."""
    was_training = model.training
    model.eval()
    try:
        stages = model.stage_features(torch.zeros(2, *input_shape))
    finally:
        model.train(was_training)
    return [int(s.shape[1]) for s in stages]
