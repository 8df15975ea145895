"""FedGen (Zhu, Hong & Zhou, ICML 2021, "Data-Free Knowledge Distillation for Heterogeneous Federated Learning").

Authors' code: github.com/zhuangdizhu/FedGen — FLAlgorithms/servers/serverpFedGen.py (``train_generator``,
``get_label_weights``), FLAlgorithms/users/userpFedGen.py (``train``), FLAlgorithms/trainmodel/generator.py
(``Generator``, ``DiversityLoss``), utils/model_config.py (GENERATORCONFIGS, RUNCONFIGS), serverbase.py
(``init_ensemble_configs``: n_teacher_iters = 5), main.py (gen_batch_size = 32).

The server learns a label-conditioned generator G(y, ε) of *features* (the head's input, the authors'
latent_layer_idx = -1), so that the participating clients' heads h_k, weighted per label by their label counts
α_k^y = n_k^y / Σ_j n_j^y, classify G(y, ε) as y (paper Eq. 4, with the authors' diversity term):

    min_G  E_{y ~ U(Y_t), ε ~ U[0,1)^d} [ Σ_k α_k^y · CE(h_k(G(y, ε)), y) ]  +  η · L_div(ε, G(y, ε))
    L_div = exp( −mean_{i,j} ‖ε_i − ε_j‖²/d · ‖G_i − G_j‖₁/D )

The authors' code computes the teacher term differently: its per-sample CE [B] times the weights [B, 1] broadcasts
to [B, B], so each head's term is mean_i(α_k^{y_i}) · mean_j(CE_kj), the batch's mean weight times its mean CE,
not the per-sample weighting above. ``algorithm.teacher_weighting``: ``per_sample`` (the paper, default) or
``batch_mean`` (the authors' code).

where Y_t are the labels some participating client holds. It runs in ``server_train`` (on a worker, seeded from
(seed, round)): ensemble_epochs // n_teacher_iters × n_teacher_iters Adam steps (lr 3e-4 decayed ×0.98 per round,
weight decay 1e-2, state kept across rounds), as in ``serverpFedGen.train_generator``. The server averages the
whole model (FedAvg by sample count); the generator's state dict and the federation's label set go down with it
from round 2 on (clients do not use it in round 1).

Client k in round t > 1 (the authors' ``regularization = glob_iter > 0``), per batch (x, y):

    L = CE(f(x), y) + (B̂/B) · α_t · CE(h(G(ŷ, ε)), ŷ) + β_t · KL( softmax(h(G(y, ε))) ‖ softmax(f(x)) )

with ŷ ~ U(labels of the federation) (B̂ = gen_batch_size of them), α_t = max(1e-4, α · 0.98^(t−1)), likewise β_t
(α = β = 10: RUNCONFIGS['mnist'], the defaults here; UNIDEAL's configs use 1 in the paper-sized settings and 0.2 in
the CPU ones, scaled to their optimiser's step: see experiments/unideal/*/fedgen.yaml), G in eval mode and not
trained by clients. As in userpFedGen.py the generated features pass through the head only
(``start_layer_idx=-1``), so the α-term trains the head alone; the KL target is detached, so the β-term trains the
whole model through f(x). Round 1 is plain CE.

Differences from the authors' code, all deliberate: label counts are the exact training-label counts
(``bincount``), not the authors' 1 + counts of the batches seen this round (the same proportions up to that +1
smoothing; a label is "qualified" when some participating client holds one, as their MIN_SAMPLES_PER_LABEL=1 test
on the smoothed counts); the labels clients sample ŷ from are those any client has reported so far (the authors
read every user's data up front); ε is drawn from torch.rand (U[0,1), as the authors' code does, despite its
comment). The unused ``ensemble_beta`` adversarial student term (0 in every RUNCONFIG) and ``early_stop`` (20
local steps, never reached at their settings) are left out.

FedGen-P (UNIDEAL's variant: only the head shared, the body local) is this class with ``shared = "head"``:
uploads, the averaged ``model`` and the generator's teachers (uploaded heads) already go through ``is_shared``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import (Algorithm, ClientContext, ClientUpdate, ServerContext, TensorDict,
                                    split_state, weighted_average)
from raysim.algorithms.configs.fedgen import FedGenConfig, FedGenPConfig
from raysim.registry import register_algorithm

MIN_WEIGHT = 1e-4  # userpFedGen.exp_lr_scheduler: max(1e-4, init * decay ** glob_iter)
GENERATOR_STREAM = 0xFED6E7  # seeds the generator's initial weights from the run seed


# ---------------------------------------------------------------------------------------------- the generator
class Generator(nn.Module):
    """generator.py's ``Generator`` (embedding=False): [ε, onehot(y)] -> Linear -> BatchNorm1d -> ReLU -> Linear."""

    def __init__(self, num_classes: int, feature_dim: int, hidden_dim: int = 256, noise_dim: int = 32):
        super().__init__()
        self.num_classes, self.noise_dim = num_classes, noise_dim
        self.fc = nn.Linear(noise_dim + num_classes, hidden_dim)
        self.bn = nn.BatchNorm1d(hidden_dim)
        self.out = nn.Linear(hidden_dim, feature_dim)  # the authors' representation_layer

    def forward(self, labels: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(labels, self.num_classes).to(eps.dtype)
        return self.out(F.relu(self.bn(self.fc(torch.cat([eps, onehot], dim=1)))))

    def noise(self, n: int, device: torch.device, rng: Optional[torch.Generator] = None) -> torch.Tensor:
        """ε ~ U[0, 1)^noise_dim, as the authors' ``torch.rand``; from ``rng`` (CPU) if given."""
        if rng is not None:
            return torch.rand(n, self.noise_dim, generator=rng).to(device)
        return torch.rand(n, self.noise_dim, device=device)


def make_generator(num_classes: int, feature_dim: int, config: FedGenConfig, seed: int = 0) -> Generator:
    """A generator with initial weights drawn from ``seed``, leaving every RNG of the caller untouched: it is built
    on the CPU from the CPU generator, forked and seeded. (``torch.manual_seed`` here would also reseed every CUDA
    device to a constant in the middle of a client job, so that on a GPU every client drew the same ε and ŷ.)"""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(int(np.random.SeedSequence([seed, GENERATOR_STREAM]).generate_state(1)[0]))
        return Generator(num_classes, feature_dim, config.generator_hidden_dim, config.noise_dim)


# ---------------------------------------------------------------------------------------------- the math
def label_weights(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_label_weights``: counts [K clients, C] -> (weights [C, K] with weights[y, k] = n_k^y / Σ_j n_j^y,
    qualified labels: those some client holds). A label nobody holds gets zero weights (it is never sampled)."""
    counts = counts.to(torch.float64)
    totals = counts.sum(dim=0)
    weights = torch.where(totals > 0, counts / totals.clamp_min(1), torch.zeros_like(counts)).T
    qualified = torch.nonzero(counts.max(dim=0).values >= 1).flatten()
    return weights.to(torch.float32), qualified


def teacher_loss(features: torch.Tensor, y: torch.Tensor, head_weight: torch.Tensor, head_bias: torch.Tensor,
                 weights: torch.Tensor, weighting: str = "per_sample") -> torch.Tensor:
    """The generator's teacher loss over heads h_k(z) = z W_kᵀ + b_k (head_weight [K, C, D], head_bias [K, C],
    weights [C, K]), summed over the K heads:

    * ``per_sample`` (paper Eq. 4): Σ_k mean_i α_k^{y_i} · CE(h_k(features_i), y_i);
    * ``batch_mean`` (the authors' ``serverpFedGen.train_generator``: ``torch.mean(nll(reduce=False) * weight)``
      with weight of shape [B, 1] broadcasts to [B, B]): Σ_k mean_i(α_k^{y_i}) · mean_j CE(h_k(features_j), y_j)."""
    logits = torch.einsum("nd,kcd->knc", features, head_weight) + head_bias[:, None, :]
    k, n, c = logits.shape
    ce = F.cross_entropy(logits.reshape(k * n, c), y.repeat(k), reduction="none").view(k, n)
    alpha = weights[y].T  # [K, n]
    if weighting == "batch_mean":
        return (alpha.mean(dim=1) * ce.mean(dim=1)).sum()
    return (alpha * ce).mean(dim=1).sum()


def diversity_loss(noise: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """generator.py's ``DiversityLoss(metric='l1')``: exp(−mean_{i,j} l2(ε_i, ε_j) · l1(G_i, G_j)), with
    l2 = mean squared difference and l1 = mean absolute difference over the vector's entries."""
    features = features.flatten(1)
    layer_dist = (features[None, :, :] - features[:, None, :]).abs().mean(dim=2)
    noise_dist = (noise[None, :, :] - noise[:, None, :]).pow(2).mean(dim=2)
    return torch.exp(torch.mean(-noise_dist * layer_dist))


def train_generator(generator: Generator, optimizer: torch.optim.Optimizer, head_weight: torch.Tensor,
                    head_bias: torch.Tensor, weights: torch.Tensor, qualified: torch.Tensor, steps: int,
                    batch_size: int, rng: torch.Generator, ensemble_alpha: float = 1.0,
                    ensemble_eta: float = 1.0, weighting: str = "per_sample") -> dict[str, list[float]]:
    """``steps`` Adam steps on ``ensemble_alpha · teacher_loss + ensemble_eta · diversity_loss``, labels drawn
    uniformly (with replacement) from ``qualified`` and ε from U[0,1), all from ``rng``; the heads stay fixed.
    Returns the per-step teacher and diversity losses (unweighted)."""
    device = head_weight.device
    generator.train()
    head_weight, head_bias, weights = head_weight.detach(), head_bias.detach(), weights.to(device)
    log: dict[str, list[float]] = {"teacher": [], "diversity": []}
    for _ in range(steps):
        y = qualified[torch.randint(len(qualified), (batch_size,), generator=rng)].to(device)
        eps = generator.noise(batch_size, device, rng)
        feats = generator(y, eps)
        t_loss = teacher_loss(feats, y, head_weight, head_bias, weights, weighting)
        d_loss = diversity_loss(eps, feats)
        optimizer.zero_grad(set_to_none=True)
        (ensemble_alpha * t_loss + ensemble_eta * d_loss).backward()
        optimizer.step()
        log["teacher"].append(float(t_loss.detach()))
        log["diversity"].append(float(d_loss.detach()))
    return log


def decayed(value: float, round: int, decay: float) -> float:
    """userpFedGen.exp_lr_scheduler(glob_iter = round − 1): max(1e-4, value · decay^(round − 1))."""
    return max(MIN_WEIGHT, value * decay ** (round - 1))


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("fedgen")
class FedGen(Algorithm):
    """Model averaged; a server-trained feature generator regularises clients with generated samples."""

    Config = FedGenConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "all"  # FedGen-P: "head"

    # ------------------------------------------------------------------ driver
    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        num_classes, feature_dim = initial_state["head.weight"].shape
        gen = make_generator(num_classes, feature_dim, self.config, self.cfg.seed)
        state.update({"generator": {k: v.detach().clone() for k, v in gen.state_dict().items()},
                      "generator_opt": None, "generator_stats": {},
                      "labels_seen": torch.zeros(num_classes, dtype=torch.bool)})
        return state

    def server_payload(self, server_state: dict, round: int) -> dict:
        """The model; from round 2 on (when clients use it), the generator and the labels clients sample from."""
        payload = super().server_payload(server_state, round)
        if round > 1 and server_state["generator_opt"] is not None:
            payload["generator"] = server_state["generator"]
            payload["labels"] = torch.nonzero(server_state["labels_seen"]).flatten()
        return payload

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        if updates:
            server_state["model"] = weighted_average([u.upload["model"] for u in updates],
                                                     [float(u.num_samples) for u in updates])
            counts = torch.stack([u.upload["label_counts"] for u in updates]).sum(dim=0)
            server_state["labels_seen"] = server_state["labels_seen"] | (counts > 0)
        return server_state

    def server_train(self, server_state: dict, updates: list[ClientUpdate], ctx: ServerContext) -> dict:
        """Train the generator against this round's uploaded heads (``train_generator`` in serverpFedGen.py)."""
        if not updates:
            return server_state
        c = self.config
        device = ctx.device
        counts = torch.stack([u.upload["label_counts"] for u in updates])
        weights, qualified = label_weights(counts)
        if len(qualified) == 0:
            return server_state
        head_w = torch.stack([u.upload["model"]["head.weight"] for u in updates]).to(device, torch.float32)
        head_b = torch.stack([u.upload["model"]["head.bias"] for u in updates]).to(device, torch.float32)
        gen = make_generator(ctx.num_classes, head_w.shape[2], c).to(device)
        gen.load_state_dict(server_state["generator"])
        opt = torch.optim.Adam(gen.parameters(), lr=c.ensemble_lr, betas=(0.9, 0.999), eps=1e-8,
                               weight_decay=c.generator_weight_decay)
        if server_state["generator_opt"] is not None:
            opt.load_state_dict(server_state["generator_opt"])
        lr = c.ensemble_lr * c.generator_lr_decay ** (ctx.round - 1)
        for group in opt.param_groups:
            group["lr"] = lr
        rng = torch.Generator().manual_seed(ctx.seed)
        log = train_generator(gen, opt, head_w, head_b, weights, qualified, c.generator_steps,
                              c.generator_batch_size or self.cfg.train.batch_size, rng, c.ensemble_alpha,
                              c.ensemble_eta, c.teacher_weighting)
        server_state["generator"] = {k: v.detach().clone() for k, v in gen.state_dict().items()}
        server_state["generator_opt"] = opt.state_dict()
        server_state["generator_stats"] = {"teacher_loss": float(np.mean(log["teacher"])),
                                           "diversity_loss": float(np.mean(log["diversity"])), "lr": lr}
        return server_state

    def on_round_end(self, round: int, metrics: dict, server_state: dict) -> dict[str, float]:
        """The generator's mean losses over this round's steps (what the authors print), and its learning rate."""
        return {f"generator/{k}": v for k, v in server_state.get("generator_stats", {}).items()}

    # ------------------------------------------------------------------ clients
    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        super().client_setup(model, ctx)
        payload = ctx.payload
        if payload.get("generator") is not None:
            gen = make_generator(ctx.num_classes, self.cfg.model.feature_dim, self.config).to(ctx.device)
            gen.load_state_dict(payload["generator"])
            gen.eval()  # userpFedGen.train: self.generative_model.eval(); clients never step it
            ctx.payload["_generator_module"] = gen  # the job's private payload copy

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feats = model.features(x)
        logits = model.head(feats)
        ce = F.cross_entropy(logits, y)
        gen = ctx.payload.get("_generator_module")
        if gen is None or ctx.round <= 1:
            return ce, {"ce": ce}
        c = self.config
        alpha = decayed(c.generative_alpha, ctx.round, c.generative_decay)
        beta = decayed(c.generative_beta, ctx.round, c.generative_decay)
        labels = ctx.payload["labels"]
        with torch.no_grad():  # the generator is fixed on clients; its outputs are inputs to the head
            target_p = F.softmax(model.head(gen(y, gen.noise(len(y), y.device))), dim=1)
            y_hat = labels[torch.randint(len(labels), (c.gen_batch_size,), device=labels.device)].to(y.device)
            gen_feats = gen(y_hat, gen.noise(c.gen_batch_size, y.device))
        latent = F.kl_div(F.log_softmax(logits, dim=1), target_p, reduction="batchmean")
        gen_ce = F.cross_entropy(model.head(gen_feats), y_hat)  # head only (start_layer_idx=-1)
        ratio = c.gen_batch_size / self.cfg.train.batch_size
        loss = ce + ratio * alpha * gen_ce + beta * latent
        return loss, {"ce": ce, "gen": gen_ce, "latent": latent}

    def client_upload(self, model: nn.Module, ctx: ClientContext) -> dict:
        """The shared weights and the client's training-label counts (the generator's per-label teacher weights)."""
        labels = ctx.train_data[1]
        return {"model": split_state(model, self.is_shared),
                "label_counts": torch.bincount(labels, minlength=ctx.num_classes).cpu()}


@register_algorithm("fedgen-p")
class FedGenP(FedGen):
    """FedGen with only the head shared (UNIDEAL's variant); bodies stay local, so architectures may differ.

    Heads are averaged and are the generator's teachers (UNIDEAL's Table 1 lists it as FedGen-P)."""

    Config = FedGenPConfig
    shared = "head"
