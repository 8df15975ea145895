"""The plain serial PyTorch loop of benchmarks/pfl.py: FedAvg in one process, no engine, no raysim import.

    python benchmarks/_pfl/plain_loop.py BUNDLE.pt OUT.json

What a researcher would write by hand: the workload's data and network (``workloads.py``), the bundle's initial
weights, cohorts and job seeds (written by benchmarks/pfl.py from raysim's own functions), ``torch.optim.SGD`` on
each sampled client in turn, then the sample-weighted average of their weights (in float64, in client-id order:
raysim's order, so the per-round training losses equal raysim's). One torch thread, as one raysim worker has.
Writes the wall-clock time at the end of every round, the per-round training losses and the final accuracy.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

from workloads import WORKLOADS, batch_starts, build_net, make_data

EVAL_CHUNK = 1024


def main(bundle_path: str, out_path: str) -> None:
    torch.set_num_threads(1)
    b = torch.load(bundle_path, weights_only=False)
    name = b["workload"]
    w = WORKLOADS[name]
    per, lr, bs, epochs = w.per_client, b["lr"], b["batch_size"], b["local_epochs"]
    x_np, y_np = make_data(name, b["seed"], b["clients"])
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    n_train = b["clients"] * per
    net = build_net(name)
    net.load_state_dict(b["initial_state"])
    global_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    round_ends, losses = [], []
    for cohort, seeds in zip(b["cohorts"], b["seeds"]):
        total = float(per * len(cohort))
        acc = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        loss_sum = 0.0
        for cid, seed in zip(cohort, seeds):
            net.load_state_dict(global_state)
            torch.default_generator.manual_seed(seed)  # dropout's draws, as in raysim's job (CPU only: cheaper)
            gen = torch.Generator().manual_seed(seed)
            opt = torch.optim.SGD(net.parameters(), lr=lr)
            net.train()
            xc, yc = x[cid * per:(cid + 1) * per], y[cid * per:(cid + 1) * per]
            client_loss = torch.zeros((), dtype=torch.float64)
            for _ in range(epochs):
                order = torch.randperm(per, generator=gen)
                for s, e in batch_starts(per, bs):
                    bi = order[s:e]
                    loss = F.cross_entropy(net(xc[bi]), yc[bi])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    client_loss += loss.detach().double() * len(bi)
            loss_sum += float(client_loss) / (per * epochs) * per
            for k, v in net.state_dict().items():
                acc[k].add_(v.detach().to(torch.float64), alpha=per / total)
        global_state = {k: acc[k].to(v.dtype) for k, v in global_state.items()}
        losses.append(loss_sum / total)
        if len(losses) == len(b["cohorts"]):  # the last round ends with the evaluation, as in raysim and pfl
            net.load_state_dict(global_state)
            net.eval()
            xt, yt = x[n_train:], y[n_train:]
            with torch.no_grad():
                correct = sum(int((net(xt[s:s + EVAL_CHUNK]).argmax(1) == yt[s:s + EVAL_CHUNK]).sum())
                              for s in range(0, len(yt), EVAL_CHUNK))
        round_ends.append(time.time())
    with open(out_path, "w") as fh:
        json.dump({"round_ends": round_ends, "losses": losses, "acc": correct / len(yt)}, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
