"""Run the FedNH authors' code (github.com/Yutong-Dai/FedNH) on a federation exported by crosscheck.py.

    python fednh_runner.py --peer FEDNH_CHECKOUT --work EXPORT_DIR --algorithm FedNH --params '{"scale": 1.0}'
                           --out result.json

Glue only: the authors' ``FedNHClient`` (client training with gradient clipping at 10, ``_estimate_prototype``) and
``FedNHServer`` (``aggregate``: the uniform mean of the bodies and the smoothed prototypes; ``run``: the round loop,
seeded per round) run unchanged. What this script supplies instead of their ``main.py``: the clients' exported
tensors as datasets, the server-side test set as the union of the clients' test splits (so the global model's
accuracy is pooled over the clients' tests, as raysim's ``acc_weighted``), and the model: their ``Conv2CifarNH``
layout (a body, then the cosine classifier ``scaling * normalize(f) @ prototype.T`` with a frozen unit-norm
``prototype`` and a learned ``scaling``) around raysim's backbone, with raysim's initial weights and prototypes
(``_initialize_model`` is the one override). The learning rate is held constant (their ``client_lr_scheduler:
diminishing`` at a decay of 1; their default ``stepwise`` divides it by 10 halfway), as raysim's is.
Writes the global model's pooled test accuracy after each round to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Split(torch.utils.data.Dataset):
    """A client's exported split, with the ``targets`` tensor their Client reads for label counts."""

    def __init__(self, path: Path):
        data = np.load(path, allow_pickle=True)["data"].tolist()
        self.x = torch.as_tensor(data["x"], dtype=torch.float32)
        self.targets = torch.as_tensor(data["y"], dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        return self.x[i], self.targets[i]


class Joined(Split):
    def __init__(self, parts: list[Split]):  # noqa: D107 - the union of several splits
        self.x = torch.cat([p.x for p in parts])
        self.targets = torch.cat([p.targets for p in parts])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", required=True, type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--algorithm", default="FedNH", choices=["FedNH"])
    p.add_argument("--params", default="{}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args()
    work = a.work.resolve()
    meta = json.loads((work / "federation.json").read_text())
    params = {"scale": 1.0, "rho": 0.9, **json.loads(a.params)}
    sys.path.insert(0, str(a.peer.resolve()))
    from src.flbase.model import Model
    from src.flbase.strategies.FedNH import FedNHClient, FedNHServer

    from raysim.config import load_config
    from raysim.data import build_federated_data
    from raysim.models import build_model
    from raysim.registry import get_algorithm

    cfg = load_config(work / "config.yaml")
    data = build_federated_data(cfg)
    raysim_model = build_model(cfg, cfg.model.name, data.input_shape(0), data.num_classes, 0,
                               get_algorithm(cfg.algorithm.name)(cfg))
    raysim_model.load_state_dict(torch.load(work / "init.pt", weights_only=True))

    class RaysimNH(Model):
        """Their Conv2CifarNH's classifier around raysim's backbone (with raysim's initial weights)."""

        def __init__(self, config: dict):
            super().__init__(config)
            self.return_embedding = config["FedNH_return_embedding"]
            self.body = raysim_model.backbone
            self.prototype = nn.Parameter(raysim_model.head.prototype.detach().clone())
            self.scaling = nn.Parameter(raysim_model.head.scale.detach().clone().reshape(1))

        def forward(self, x):
            emb = self.body(x)
            emb = torch.div(emb, torch.norm(emb, p=2, dim=1, keepdim=True).clamp(min=1e-12))
            proto = self.prototype if not self.prototype.requires_grad else F.normalize(self.prototype, dim=1)
            logits = self.scaling * torch.matmul(emb, proto.T)
            return (emb, logits) if self.return_embedding else logits

    class Client(FedNHClient):
        def _initialize_model(self):
            import copy

            self.model = copy.deepcopy(RaysimNH(self.client_config))
            self.criterion = self.criterion.to(self.device)
            self.model.prototype.requires_grad_(False)  # as theirs: the prototypes are never trained locally

    n = meta["num_clients"]
    client_config = {
        "model": "RaysimNH", "num_classes": meta["num_classes"], "num_epochs": meta["local_epochs"],
        "batch_size": meta["batch_size"], "optimizer": "SGD", "client_lr": meta["lr"],
        "client_lr_scheduler": "diminishing", "lr_decay_per_round": 1.0, "sgd_momentum": 0.0, "sgd_weight_decay": 0.0,
        "num_rounds": meta["rounds"], "global_seed": a.seed, "use_tqdm": False, "FedNH_return_embedding": False,
        "FedNH_head_init": "orthogonal", "FedNH_client_adv_prototype_agg": False, "FedNH_fix_scaling": False,
    }
    server_config = {
        "strategy": "FedNH", "num_rounds": meta["rounds"], "num_clients": n, "participate_ratio": 1.0,
        "drop_ratio": 0.0, "test_every": 1, "split_testset": False, "use_tqdm": False, "dataset": "crosscheck",
        "partition": "noniid-label-distribution", "beta": "exported", "num_classes_per_client": None,
        "num_shards_per_client": None,
        "num_classes": meta["num_classes"], "learning_rate": 1.0, "lr_decay_per_round": 1.0, "exclude": (),
        "FedNH_smoothing": params["rho"], "FedNH_server_adv_prototype_agg": False,
    }
    root = work / "dataset" / "crosscheck"
    trains = [Split(root / "train" / f"{c}.npz") for c in range(n)]
    tests = [Split(root / "test" / f"{c}.npz") for c in range(n)]
    criterion = nn.CrossEntropyLoss()
    clients = {c: Client(criterion, trains[c], tests[c], dict(client_config), c, "cpu") for c in range(n)}
    server = FedNHServer(server_config, clients, exclude=(), server_side_criterion=criterion,
                         global_testset=Joined(tests), global_trainset=Joined(trains), client_cstr=Client,
                         server_side_client_config=dict(client_config), server_side_client_device="cpu")
    server.run(filename=str(work / "best_global_model.pt"), use_wandb=False, global_seed=a.seed)
    acc = [float(server.gfl_test_acc_dict[r]["acc_by_criteria"]["uniform"]) for r in range(1, meta["rounds"] + 1)]
    a.out.write_text(json.dumps({"acc": [float("nan")] + acc, "algorithm": "FedNH"}))  # entry r: after round r


if __name__ == "__main__":
    main()
