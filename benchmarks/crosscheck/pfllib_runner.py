"""Run one method of PFLlib (github.com/TsingZ0/PFLlib) on a federation exported by crosscheck.py.

    python pfllib_runner.py --peer PFLLIB_CHECKOUT --work EXPORT_DIR --algorithm FedAvg --params '{"mu": 0.01}'
                            --out result.json

Glue only: PFLlib's own server and client classes (``system/flcore``) are imported from the checkout and run
unchanged, as its ``main.py`` runs them; this script replaces main.py's dataset files and model choice with the
export: ``EXPORT_DIR/dataset/crosscheck/{train,test}/<client>.npz`` in PFLlib's format (``{'data': {'x', 'y'}}``),
and the model raysim builds for the method (``config.yaml`` + ``init.pt``), split as main.py splits its models
(``BaseHeadSplit(base, head)``: raysim's backbone and head). Writes PFLlib's per-round test accuracy
(``rs_test_acc``: total correct over total test samples, evaluated at the start of each round, so entry r is the
model after r rounds) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch

SERVERS = {"FedAvg": "serveravg", "FedProx": "serverprox", "MOON": "servermoon", "FedProto": "serverproto",
           "FedROD": "serverrod", "FedBABU": "serverbabu", "FedRep": "serverrep"}


def raysim_model(work: Path) -> torch.nn.Module:
    """The method's model exactly as raysim built it for the run (after the algorithm's adapt_model)."""
    from raysim.config import load_config
    from raysim.data import build_federated_data
    from raysim.models import build_model
    from raysim.registry import get_algorithm

    cfg = load_config(work / "config.yaml")
    data = build_federated_data(cfg)
    algorithm = get_algorithm(cfg.algorithm.name)(cfg)
    model = build_model(cfg, cfg.model.name, data.input_shape(0), data.num_classes, 0, algorithm)
    init = torch.load(work / "init.pt", weights_only=True)
    model.load_state_dict(init)
    return model


def keep_last_batch() -> None:
    """The one change of the diagnostic run: ``Client.load_train_data`` with ``drop_last=False`` (PFLlib's line is
    ``DataLoader(train_data, batch_size, drop_last=True, shuffle=True)`` in ``flcore/clients/clientbase.py``)."""
    from flcore.clients.clientbase import Client
    from torch.utils.data import DataLoader
    from utils.data_utils import read_client_data

    def load_train_data(self, batch_size=None):
        data = read_client_data(self.dataset, self.id, is_train=True, few_shot=self.few_shot)
        return DataLoader(data, batch_size or self.batch_size, drop_last=False, shuffle=True)

    Client.load_train_data = load_train_data


def finetune_from_global(server) -> None:
    """The diagnostic's one change for FedBABU: each client loads the server's global body before ``fine_tune``
    (PFLlib's ``FedBABU.train`` calls ``client.fine_tune()`` after its round loop without ``send_models()``, so
    each client fine-tunes its own model from its last local training, one round past the last aggregation)."""
    from flcore.clients.clientbabu import clientBABU

    original = clientBABU.fine_tune

    def fine_tune(self, which_module=("base", "head")):
        self.set_parameters(server.global_model)
        return original(self, list(which_module))

    clientBABU.fine_tune = fine_tune


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", required=True, type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--algorithm", required=True, choices=sorted(SERVERS))
    p.add_argument("--params", default="{}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--keep-last", action="store_true",
                   help="diagnostic: train on the last, partial batch too (PFLlib's Client.load_train_data drops it)")
    p.add_argument("--finetune-global", action="store_true",
                   help="diagnostic (FedBABU): fine-tune from the global body, not from each client's local model")
    a = p.parse_args()
    work = a.work.resolve()
    meta = json.loads((work / "federation.json").read_text())
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    model = raysim_model(work)
    sys.path.insert(0, str((a.peer / "system").resolve()))
    from flcore.trainmodel.models import BaseHeadSplit  # PFLlib's own split, as main.py applies it

    split = BaseHeadSplit(model.backbone, model.head)
    if a.keep_last:
        keep_last_batch()
    args = Namespace(
        device="cpu", dataset="crosscheck", num_classes=meta["num_classes"], model=split,
        batch_size=meta["batch_size"], local_learning_rate=meta["lr"], learning_rate_decay=False,
        learning_rate_decay_gamma=0.99, global_rounds=meta["rounds"], top_cnt=100, local_epochs=meta["local_epochs"],
        algorithm=a.algorithm, join_ratio=1.0, random_join_ratio=False, num_clients=meta["num_clients"], eval_gap=1,
        save_folder_name="items", auto_break=False, dlg_eval=False, dlg_gap=100, batch_num_per_client=2,
        num_new_clients=0, fine_tuning_epoch_new=0, few_shot=0, client_drop_rate=0.0, train_slow_rate=0.0,
        send_slow_rate=0.0, time_select=False, time_threthold=10000, goal="crosscheck", times=1,
        lamda=1.0, mu=0.0, tau=1.0, plocal_epochs=1, fine_tuning_epochs=5)
    for key, value in json.loads(a.params).items():
        setattr(args, key, value)
    os.chdir(work / "system")  # PFLlib reads ../dataset/<name>/ and writes ../results/
    module = __import__(f"flcore.servers.{SERVERS[a.algorithm]}", fromlist=[a.algorithm])
    server_cls = getattr(module, {"FedROD": "FedROD"}.get(a.algorithm, a.algorithm))
    server = server_cls(args, 0)
    if a.finetune_global:
        finetune_from_global(server)
    server.train()
    a.out.write_text(json.dumps({"acc": [float(v) for v in server.rs_test_acc], "algorithm": a.algorithm}))


if __name__ == "__main__":
    main()
