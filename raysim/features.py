"""A run's test-set features and their t-SNE embedding (FAPD's Fig. 4): ``raysim report --tsne RUN_DIR``.

The features are what each client's evaluation model (the one ``acc_mean`` scores, rebuilt from the run's last
checkpoint by the client-job core, ``raysim.engine.core.ClientJobs.eval_model``, exactly as an evaluation job
rebuilds it) gives its own test samples through ``model.features``: for FedAvg and FAPD every client holds the global
model, so these are the global model's features of the pooled test set; for personalised methods, each client's own.
Everything runs in this process, on the CPU, without Ray.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from raysim.errors import UserError

TSNE_MAX = 2000  # t-SNE is quadratic in memory and slow on a CPU past a few thousand points
EXACT_MAX = 500


def export_features(run_dir: Path) -> dict[str, Any]:
    """Features of every client's test samples at the run's checkpointed round: ``features`` [N, D], ``labels`` [N],
    ``clients`` [N], ``predicted`` [N] (the class the evaluation model predicts: its accuracy is the run's),
    ``round``."""
    from raysim.algorithms.base import eval_features
    from raysim.config import load_config
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.algorithms.training import torch_threads
    from raysim.engine.state import checkpoint_dir, client_file, has_checkpoint, read_checkpoint, safe_load, server_file
    from raysim.registry import get_algorithm, import_plugins

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"--tsne: {run_dir} is not a run directory (no config.yaml)")
    if not has_checkpoint(run_dir):
        raise UserError(f"--tsne: {run_dir} has no checkpoint ({server_file(run_dir)}): no round completed")
    cfg = load_config(run_dir / "config.yaml")
    import_plugins(cfg.plugins)
    algorithm = get_algorithm(cfg.algorithm.name)(cfg)
    data = algorithm.prepare_data(build_federated_data(cfg))
    ckpt = read_checkpoint(run_dir)
    rnd, server_state = int(ckpt["round"]), ckpt["server_state"]
    shared = algorithm.eval_payload(server_state)
    client_files = {int(k): int(v) for k, v in ckpt["client_files"].items()}
    jobs = ClientJobs(cfg, data, "cpu")  # the client-side algorithm, as a worker holds its own
    feats, labels, clients, predicted = [], [], [], []
    with torch_threads(cfg.engine.cpus_per_worker):
        for cid in range(data.num_clients):
            if len(data.clients[cid].test) == 0:
                continue
            own = algorithm.client_payload(server_state, cid, -1)
            state = (safe_load(client_file(checkpoint_dir(run_dir), cid, client_files[cid]))
                     if cid in client_files else None)
            with torch.no_grad():
                model, ctx = jobs.eval_model(cid, rnd, shared, own, state)
            x, y, _ = data.tensors(cid, "test")
            feats.append(eval_features(model, x).float().numpy())
            predicted.append(jobs.predict(model, ctx, x).numpy())
            labels.append(y.numpy())
            clients.append(np.full(len(y), cid, dtype=np.int64))
    if not feats:
        raise UserError(f"--tsne: no client of {run_dir} has test samples")
    return {"features": np.concatenate(feats), "labels": np.concatenate(labels).astype(np.int64),
            "clients": np.concatenate(clients), "predicted": np.concatenate(predicted).astype(np.int64), "round": rnd,
            "title": f"{cfg.name}, seed {cfg.seed}"}


def tsne(run_dir: Path, out: Path, *, max_points: int = TSNE_MAX, seed: int = 0,
         perplexity: float = 30.0) -> dict[str, Path]:
    """Export the features (``features.npz``), embed at most ``max_points`` of them (a class-stratified random
    subset, drawn with ``seed``) in 2-D with ``sklearn.manifold.TSNE`` (``tsne.csv``: x, y, label, client) and
    draw them coloured by class (``tsne.png``)."""
    from sklearn.manifold import TSNE

    if max_points < 2:
        raise UserError(f"--tsne-max must be at least 2, got {max_points}")
    exported = export_features(run_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {out} ({exc.strerror})") from None
    files = {"features.npz": out / "features.npz"}
    arrays = {k: exported[k] for k in ("features", "labels", "clients", "predicted")}
    np.savez_compressed(files["features.npz"], **arrays, round=exported["round"])
    pick = stratified_subset(exported["labels"], max_points, seed)
    x = exported["features"][pick]
    # perplexity must stay below the number of points; sklearn refuses otherwise
    # exact below EXACT_MAX points: Barnes-Hut's OpenMP threads took 15 s for 60 points on a loaded 2-core machine,
    # the exact method under 1 s
    emb = TSNE(n_components=2, perplexity=min(perplexity, max(1.0, (len(x) - 1) / 3)), init="pca",
               method="exact" if len(x) <= EXACT_MAX else "barnes_hut", random_state=seed).fit_transform(x)
    files["tsne.csv"] = out / "tsne.csv"
    with open(files["tsne.csv"], "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["x", "y", "label", "client"])
        for (a, b), label, client in zip(emb, exported["labels"][pick], exported["clients"][pick]):
            w.writerow([f"{a:.6g}", f"{b:.6g}", int(label), int(client)])
    files["tsne.png"] = _plot(emb, exported["labels"][pick], out / "tsne.png",
                              f"{exported['title']}: t-SNE of test features (round {exported['round']}, "
                              f"{len(pick)} of {len(exported['labels'])} samples)")
    return files


def stratified_subset(labels: np.ndarray, max_points: int, seed: int) -> np.ndarray:
    """Sorted indices of at most ``max_points`` samples, each class keeping its share (all when they fit)."""
    n = len(labels)
    if n <= max_points:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    picked = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        take = max(1, int(round(max_points * len(members) / n)))
        picked.append(rng.choice(members, size=min(take, len(members)), replace=False))
    return np.sort(np.concatenate(picked))[:max_points]


def _plot(emb: np.ndarray, labels: np.ndarray, path: Path, title: Optional[str] = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = np.unique(labels)
    cmap = plt.get_cmap("tab10" if len(classes) <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(6, 6), layout="constrained")
    for i, c in enumerate(classes):
        sel = labels == c
        ax.scatter(emb[sel, 0], emb[sel, 1], s=4, color=cmap(i % cmap.N), label=str(int(c)) if len(classes) <= 20
                   else None)
    if len(classes) <= 20:
        ax.legend(markerscale=3, fontsize=7, title="class", loc="best", frameon=False)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
