"""FLTrust's server side (Cao, Fang, Liu, Gong, NDSS 2021): the root dataset and the server's own update each round.

The root dataset is drawn from a public split that the config names (``aggregator.root``): ``server_holdout``, the
samples ``data.server_holdout`` takes out of every client's training split (each seen as its client sees it), of
which ``aggregator.root_samples`` are drawn from the seed (the paper: 100). Each round the server trains the global
model on it with the clients' local settings (``train.*``: batch size, optimiser, learning rate, momentum, weight
decay; cross-entropy) for as many steps as the round's median client takes (``train.local_epochs`` passes over its
samples in batches of ``train.batch_size``): the paper's clients and server both run ``ModelUpdate`` for the same
R_l local iterations, and FLTrust rescales every client's update to the server's norm, so a server that took more
steps (100 root samples against 65 a client: 8 steps against 4, a norm 3x theirs under momentum 0.9) would scale
the round's step up by as much. Its update g0 = trained − global scores the clients'
(:func:`raysim.robust.aggregators.fltrust`). The training runs on the driver with :mod:`raysim.algorithms.training`'s
loop, in epochs over the root data reshuffled from (seed, round); an algorithm's own local loss (FedProx's proximal
term) is not part of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.aggregation import flatten
from raysim.algorithms.base import load_entries
from raysim.algorithms.training import (LocalOptimizer, Trainee, batch_bounds, epoch_batches, make_optimizer,
                                        run_phases)
from raysim.errors import UserError
from raysim.seeds import FLTRUST_STREAM, job_seed

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig
    from raysim.stages import StageSetup


def root_data(cfg: ExperimentConfig, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """FLTrust's root dataset (x, y): ``aggregator.root_samples`` of the server's holdout drawn from the seed (all of
    it when null), in the holdout's order (client by client)."""
    from raysim.data.base import ClientSplit, FederatedData

    held = getattr(data, "holdout_by_client", None) or []
    total = sum(len(h) for h in held)
    wanted = cfg.aggregator.root_samples
    if total == 0:
        raise UserError("config key 'data.server_holdout': fltrust's root dataset is the server's holdout, and this "
                        "data holds none out (set data.server_holdout, e.g. 0.1)")
    if wanted is not None and wanted > total:
        raise UserError(f"config key 'aggregator.root_samples': {wanted} root samples, and data.server_holdout="
                        f"{cfg.data.server_holdout} holds out {total} (raise data.server_holdout or lower "
                        f"aggregator.root_samples)")
    views = [ClientSplit(domain=s.domain, train=h, test=np.zeros(0, dtype=np.int64), features=s.features,
                         shift=s.shift, scale=s.scale, width=s.width) for s, h in zip(data.clients, held) if len(h)]
    view = FederatedData(domains=data.domains, clients=views, num_classes=data.num_classes)
    parts = [view.tensors(i, "train")[:2] for i in range(len(views))]
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    if wanted is not None:
        gen = torch.Generator().manual_seed(job_seed(cfg.seed, 0, 0, FLTRUST_STREAM))
        chosen = torch.sort(torch.randperm(total, generator=gen)[:wanted]).values
        x, y = x[chosen], y[chosen]
    return x, y


def local_steps(samples: list[int], batch_size: int, epochs: int) -> int:
    """The local steps of the round's median client (the lower of the two middle ones): ``epochs`` passes over its
    samples in the one loop's batches (:func:`raysim.algorithms.training.batch_bounds`)."""
    steps = sorted(epochs * len(batch_bounds(n, batch_size)) for n in samples)
    return steps[(len(steps) - 1) // 2]


class _RootTrainee(Trainee):
    """Cross-entropy on the root dataset with the clients' optimiser (``train.*``), for ``budget`` steps."""

    def __init__(self, cfg: ExperimentConfig, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                 gen: torch.Generator, budget: int):
        self.cfg, self.model, self.x, self.y, self.gen = cfg, model, x, y, gen
        self.budget, self.taken = budget, 0

    def begin_phase(self, params: list, lr: Optional[float]) -> LocalOptimizer:
        return make_optimizer(self.cfg, params, lr)

    def steps(self) -> Any:
        return epoch_batches(len(self.y), self.cfg.train.batch_size, self.gen, "cpu")

    def fits(self, step: Any) -> bool:
        self.taken += 1
        return self.taken <= self.budget

    def loss(self, step: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(self.x[step]), self.y[step])


class ServerUpdate:
    """The server's own update each round, on the driver (built once, before round 1, from the stage's setup)."""

    def __init__(self, cfg: ExperimentConfig, setup: StageSetup):
        from raysim.models import build_model

        self.cfg = cfg
        self.x, self.y = root_data(cfg, setup.data)
        with torch.random.fork_rng(devices=[]):  # building a model reseeds torch's global generator
            self.model = build_model(cfg, cfg.model.for_client(0), setup.data.input_shape(0),
                                     setup.data.num_classes, 0, setup.algorithm)

    def row(self, global_model: dict, keys: list[str], rnd: int, steps: int) -> torch.Tensor:
        """g0 = (the global model trained ``steps`` steps on the root dataset) − global, over ``keys``, as one float64
        row."""
        seed = job_seed(self.cfg.seed, 0, rnd, FLTRUST_STREAM)
        load_entries(self.model, global_model)
        params = list(self.model.parameters())
        epochs = -(-steps // len(batch_bounds(len(self.y), self.cfg.train.batch_size)))
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            torch.manual_seed(seed)  # a model that draws (dropout) draws the same on every run
            self.model.train()
            run_phases([(params, epochs)], _RootTrainee(self.cfg, self.model, self.x, self.y,
                                                        torch.Generator().manual_seed(seed), steps))
        trained = self.model.state_dict()
        return flatten({k: trained[k] for k in keys})[1] - flatten({k: global_model[k] for k in keys})[1]
