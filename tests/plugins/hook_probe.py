"""A test-only algorithm that uses every hook of the contract and records what it saw (listed under ``plugins``).

- init_client_state: a client starts with ``visits = 0``; client_keep adds one each round it trains, and
  client_loss checks that it sees the kept value (ctx.state);
- client_upload: the head plus non-weight tensors (a visit count and the client's label counts);
- client_payload: client c alone receives ``own = [c] * (c + 1)`` floats; client_loss checks it got its own;
- server_aggregate: records which client sent what (``seen``: client id -> its visits);
- server_train: on a worker, a seeded random step of ``noise`` (same numbers whatever the worker count);
- client_loss also scribbles on its payload in place: the next job on the same worker must not see that;
  and it logs a draw from torch's global RNG (``loss_draw``), which must not depend on the worker.
"""

import torch
import torch.nn.functional as F

from raysim.algorithms.base import Algorithm, split_state, weighted_average
from raysim.registry import register_algorithm


@register_algorithm("hook_probe")
class HookProbe(Algorithm):
    shared = "head"

    def init_server_state(self, initial_state):
        state = super().init_server_state(initial_state)
        state.update(seen={}, noise=torch.zeros(3), trained_rounds=torch.zeros((), dtype=torch.int64))
        return state

    def server_payload(self, server_state, round):
        return {"model": server_state["model"], "noise": server_state["noise"]}

    def client_payload(self, server_state, client_id, round):
        return {"own": torch.full((client_id + 1,), float(client_id))}

    def init_client_state(self, model, ctx):
        return {"visits": torch.zeros((), dtype=torch.int64)}

    def client_setup(self, model, ctx):
        model.load_state_dict({k: v for k, v in ctx.state.items() if k != "visits"}, strict=False)
        model.load_state_dict(ctx.payload["model"], strict=False)

    def client_loss(self, model, x, y, ctx):
        own = ctx.payload["own"]
        assert own.numel() == ctx.client_id + 1 and bool((own == ctx.client_id).all()), "wrong per-client payload"
        assert "visits" in ctx.state, "the client's state is not in ctx.state"
        if "scribbled" not in ctx.payload:  # this job's first batch
            assert float(ctx.payload["model"]["head.bias"].abs().max()) < 1e3, "a payload changed by an earlier job"
            ctx.payload["model"]["head.bias"].add_(1e4)  # in place: must stay inside this job
            ctx.payload["scribbled"] = True
        # a draw from torch's global RNG, logged as loss_draw: the same on any worker only if every job reseeds it
        return F.cross_entropy(model(x), y), {"draw": torch.rand(())}

    def client_upload(self, model, ctx):
        return {"head": split_state(model, lambda k: k.startswith("head.")),
                "visits": ctx.state["visits"] + 1,
                "labels": torch.bincount(ctx.train_data[1], minlength=ctx.num_classes)}

    def client_keep(self, model, ctx):
        return {**split_state(model, lambda k: True), "visits": ctx.state["visits"] + 1}

    def server_aggregate(self, updates, server_state, round):
        server_state["model"] = weighted_average([u.upload["head"] for u in updates],
                                                 [float(u.num_samples) for u in updates])
        server_state["seen"] = {**server_state["seen"], **{u.client_id: int(u.upload["visits"]) for u in updates}}
        return server_state

    def server_train(self, server_state, updates, ctx):
        server_state["noise"] = server_state["noise"] + torch.rand(3)
        server_state["trained_rounds"] = server_state["trained_rounds"] + 1
        return server_state

    def on_round_end(self, round, metrics, server_state):
        return {"visits_sum": sum(server_state["seen"].values()), "noise": float(server_state["noise"].sum()),
                "trained_rounds": int(server_state["trained_rounds"])}
