"""FedDyn (Acar et al., ICLR 2021): each client's objective gets a dynamic regulariser, a linear term from its own
past gradients plus a proximal term, so that the local optima agree with the global one; the server corrects the
average with its state h.

Paper: D. A. E. Acar, Y. Zhao, R. M. Navarro, M. Mattina, P. N. Whatmough, V. Saligrama, "Federated Learning Based
on Dynamic Regularization", ICLR 2021 (arXiv:2111.04263), Algorithm 1. Authors' code:
github.com/alpemreacar/FedDyn (``utils_methods.py`` ``train_FedDyn``; ``utils_general.py`` ``train_feddyn_mdl``;
``example_cifar_10.py`` for the defaults).

Client k, sampled in round t, starts from the server model θ^{t-1} and minimises

    R_k(θ) = L_k(θ) − ⟨∇L_k(θ_k^{t-1}), θ⟩ + (α_k/2)·‖θ − θ^{t-1}‖²

where ∇L_k(θ_k^{t-1}) is the client's gradient at its previous local optimum, kept as client state λ_k (the
authors' ``local_param_list``, which holds −∇L_k/α): −⟨∇L_k(θ_k^{t-1}), θ⟩ = α_k·⟨λ_k, θ⟩. After training, θ_k^t
being the trained model (first-order condition ∇L_k(θ_k^t) = ∇L_k(θ_k^{t-1}) − α_k(θ_k^t − θ^{t-1})),

    λ_k ← λ_k + (θ_k^t − θ^{t-1})                (client state; zeros before its first round: init_client_state)

The server keeps D = (1/N) Σ_{all k} λ_k (``server_state["drift"]``; in the paper's notation h = −α·D), updated from
this round's clients alone, and sets

    D ← D + (1/N) Σ_{k∈P_t} (θ_k^t − θ^{t-1})          N = ``clients.num``, P_t the round's clients
    θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t + D                (= mean − h/α)

exactly the authors' ``cld_mdl_param = avg_mdl_param + np.mean(local_param_list, axis=0)``. θ^t is what clients
download. The mean over P_t is uniform, as in the paper and the authors' code (raysim's FedAvg weights by samples).
Only parameters carry the regulariser and D; batch-norm running statistics and integer buffers take the uniform mean.

**The evaluated model** is the plain mean (1/|P_t|) Σ_{k∈P_t} θ_k^t, without D: the authors' ``train_FedDyn``
evaluates ``avg_model`` (built from ``avg_mdl_param``; ``tst_perf_sel``) and ``all_model`` (the mean of every
client's latest model; ``tst_perf_all``) and never ``cld_model`` (``utils_methods.py`` lines 396-416 at commit
48a19fa). The server keeps that mean beside θ^t (``server_state["mean"]``) and ``eval_payload`` sends it, so
``acc_mean`` and ``acc_global`` score it. ``algorithm.evaluate: server`` scores θ^t instead (the numbers raysim
reported before issue 38). Both at once would need a second evaluation pass each round, which the engine does not
offer an algorithm; ``all_model`` is not reproduced.

The authors' code, followed here: α_k = α / w_k with w_k = n_k / n̄ (``alpha_coef_adpt = alpha_coef /
weight_list[clnt]``, n̄ the mean training-set size over all clients, attached to ``data.meta`` by ``prepare_data``),
so a client with more data is held less tightly (``algorithm.scale_alpha: false`` uses α for every client, as the
paper's Algorithm 1 does); and the gradient norm clipped at 10 every step (``max_norm = 10`` in ``utils_general.py``;
``algorithm.max_grad_norm``, null for none). The authors put (α_k/2)‖θ‖² into SGD's weight decay, which the clip
does not see; here the whole regulariser is in the loss, so the clip sees it (same gradient, same step when the norm
stays under 10).

**Stacked clients** (``engine.vectorize``): the client hooks vectorise. ``client_setup`` puts α_k into the job's
state as a float32 scalar and ``client_loss`` reads it there, alone and in a stack alike (a stack's loss has no
``ctx.train_data`` to take n_k from; the arithmetic is the same float32 as a Python α_k's); λ_k is stacked per client
(every client's has one structure, since new clients start from zeros), and the stack clips each client's
gradient norm on its own, so a stack gives every client the numbers it gets alone, bit for bit on an MLP
(``tests/engine/test_stack.py``).

Defaults: α = 0.01 (``alpha_coef = 1e-2`` in ``example_cifar_10.py``; the paper tries {0.1, 0.01, 0.001}).

Logged loss parts: ``loss_ce``, ``loss_linear`` (α_k·⟨λ_k, θ⟩, negative as often as not) and ``loss_prox``
((α_k/2)‖θ − θ^{t-1}‖²); ``loss`` is their sum.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdate, TensorDict, is_parameter, weighted_average
from raysim.algorithms.configs.feddyn import FedDynConfig
from raysim.algorithms.fedprox import proximal_term
from raysim.data.base import is_indexed
from raysim.errors import UserError
from raysim.registry import register_algorithm

MEAN_SIZE = "feddyn_mean_train_size"  # data.meta key: n̄, the mean training-set size over all clients
ALPHA = "alpha"  # ctx.state key during a job: α_k as a float32 scalar (client_setup), never kept


# ---------------------------------------------------------------------------------------------- the math
def linear_term(pairs: Iterable[tuple[torch.Tensor, Optional[torch.Tensor]]],
                alpha: float | torch.Tensor) -> torch.Tensor:
    """α·Σ⟨λ, θ⟩ over (live parameter θ, kept λ) pairs, λ None counting as 0 (a client's first round):
    −⟨∇L_k(θ_k^{t-1}), θ⟩ in the paper's terms. λ never receives a gradient."""
    pairs = list(pairs)
    if not pairs:
        raise ValueError("linear_term: no parameters")
    total = torch.zeros((), device=pairs[0][0].device)
    for w, lam in pairs:
        if lam is not None:
            total = total + (w * lam.detach()).sum()
    return alpha * total


def server_update(model: TensorDict, drift: TensorDict, uploads: list[TensorDict],
                  num_clients: int) -> tuple[TensorDict, TensorDict, TensorDict]:
    """(θ^t, D, mean θ_k) from θ^{t-1}, D and this round's trained models θ_k (in client-id order): on parameters
    D ← D + (|P|/N)·(mean θ_k − θ^{t-1}) = D + Σ(θ_k − θ^{t-1})/N and θ^t = mean θ_k + D; elsewhere (running
    statistics, integer buffers) θ^t = mean θ_k. The mean is uniform; it is the model the authors evaluate."""
    mean = weighted_average(uploads, [1.0] * len(uploads))
    new_drift, new_model = dict(drift), {}
    for key, avg in mean.items():
        if not is_parameter(key, avg):
            new_model[key] = avg
            continue
        moved = (avg - model[key]) * (len(uploads) / num_clients)
        new_drift[key] = drift[key] + moved if key in drift else moved
        new_model[key] = avg + new_drift[key]
    return new_model, new_drift, mean


# ---------------------------------------------------------------------------------------------- the algorithm
@register_algorithm("feddyn")
class FedDyn(Algorithm):
    """Dynamic regulariser CE + α⟨λ_k, θ⟩ + (α/2)‖θ − θ^{t-1}‖² on clients; the server adds their drift."""

    Config = FedDynConfig
    uploads = Uploads.apart()  # server_aggregate reads each upload
    shared = "all"
    vectorizable = True  # engine.vectorize: α_k and λ_k come from ctx.state (see the module's docstring)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.clip_grad_norm = self.config.max_grad_norm  # read by the worker between backward() and step()

    # ------------------------------------------------------------------ driver
    def prepare_data(self, data: Any) -> Any:
        if self.config.scale_alpha and is_indexed(data):  # on-demand data: refused by check
            n = data.num_clients
            data.meta[MEAN_SIZE] = sum(data.num_train(c) for c in range(n)) / n
        return data

    def check(self, cfg, data) -> None:
        super().check(cfg, data)
        if self.config.scale_alpha and not is_indexed(data):
            raise UserError(f"config key 'algorithm.scale_alpha': feddyn scales α by each client's share of the "
                            f"mean training-set size, which {cfg.data.name} (made per client on demand) cannot give "
                            f"without making every client; set algorithm.scale_alpha=false")

    def init_server_state(self, initial_state: TensorDict) -> dict:
        state = super().init_server_state(initial_state)
        state["drift"] = {}  # D = (1/N) Σ λ_k: zero until the first clients report
        return state

    def server_aggregate(self, updates: list[ClientUpdate], server_state: dict, round: int) -> dict:
        if not updates:
            return server_state
        server_state["model"], server_state["drift"], server_state["mean"] = server_update(
            server_state["model"], server_state["drift"], [u.upload for u in updates], self.cfg.clients.num)
        return server_state

    def eval_payload(self, server_state: dict) -> dict:
        """The plain mean of the last round's models (``algorithm.evaluate: mean``, the authors' ``avg_model``), or
        θ^t (``server``); before any round, and from a checkpoint written before the mean was kept, θ^t."""
        if self.config.evaluate == "mean" and server_state.get("mean"):
            return {"model": server_state["mean"]}
        return self.server_payload(server_state, round=-1)

    # ------------------------------------------------------------------ client
    def client_alpha(self, ctx: ClientContext) -> float:
        """α_k: α, scaled by n̄/n_k when ``scale_alpha`` (the authors' ``alpha_coef / weight_list[clnt]``)."""
        alpha = self.config.alpha
        if self.config.scale_alpha:
            n_k = len(ctx.train_data[1]) if ctx.train_data is not None else 0
            alpha = alpha * ctx.meta[MEAN_SIZE] / max(n_k, 1)
        return alpha

    def init_client_state(self, model: nn.Module, ctx: ClientContext) -> dict:
        """λ_k = 0 for every parameter before the client's first round: the same numbers as no λ_k at all, and every
        client's state has one structure, so a stack of new and returning clients can stack them."""
        return {"lambda": {name: torch.zeros_like(p) for name, p in model.named_parameters()}}

    def client_setup(self, model: nn.Module, ctx: ClientContext) -> None:
        """The usual setup, then α_k into the job's state as a float32 scalar (``ALPHA``), which ``client_loss``
        reads: a stack's loss has no ``ctx.train_data`` to size the client by, and gets it stacked per client."""
        super().client_setup(model, ctx)
        alpha = torch.tensor(self.client_alpha(ctx), dtype=torch.float32, device=ctx.device)
        ctx.state = {**ctx.state, ALPHA: alpha}  # a new dict: the one passed in may be the stored state itself

    def client_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: ClientContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        alpha = ctx.state[ALPHA]  # set by client_setup
        ce = F.cross_entropy(model(x), y)
        lam, start = ctx.state.get("lambda", {}), ctx.payload["model"]
        params = list(model.named_parameters())
        linear = linear_term(((p, lam.get(name)) for name, p in params), alpha)
        prox = proximal_term(((p, start[name]) for name, p in params), alpha)
        return ce + linear + prox, {"ce": ce, "linear": linear, "prox": prox}

    def client_keep(self, model: nn.Module, ctx: ClientContext) -> dict:
        """λ_k + (θ_k^t − θ^{t-1}) for every parameter."""
        lam, start = ctx.state.get("lambda", {}), ctx.payload["model"]
        out = {}
        for name, p in model.named_parameters():
            moved = p.detach() - start[name]
            out[name] = lam[name] + moved if name in lam else moved
        return {"lambda": out}
