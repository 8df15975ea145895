"""``raysim data show CONFIG``: what a partition gives each client, as a table and a clients x classes heat map
(what Flower Datasets' ``plot_label_distributions(..., plot_type="heatmap")`` draws, made here with matplotlib:
Flower's function posts a usage event to its telemetry server, and raysim never reaches the network).

The federation is built exactly as a run builds it (``build_federated_data``), without Ray; counts are over each
client's whole share (its training and its test split).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

WIDE = 20  # more classes than this: the console shows each client's classes in a summary, not every count


def label_counts(data, clients: Optional[int] = None) -> np.ndarray:
    """[clients, classes] label counts of each client's training plus test samples (the first ``clients`` only)."""
    n = data.num_clients if clients is None else min(clients, data.num_clients)
    counts = np.zeros((n, data.num_classes), dtype=np.int64)
    for cid in range(n):
        for part in ("train", "test"):
            counts[cid] += np.bincount(data.tensors(cid, part)[1].numpy(), minlength=data.num_classes)
    return counts


def format_counts(counts: np.ndarray, total_clients: int) -> str:
    """One line per client: its samples and classes, with every class's count when there are few classes."""
    from raysim.tables import markdown_table

    classes = counts.shape[1]
    rows = []
    for cid, row in enumerate(counts):
        total = int(row.sum())
        share = row.max() / total if total else 0.0
        cells = [str(cid), str(total), str(int((row > 0).sum())), f"{share:.2f}"]
        if classes <= WIDE:
            cells += [str(int(c)) for c in row]
        rows.append(cells)
    header = ["client", "samples", "classes", "top share"] + ([str(c) for c in range(classes)] if classes <= WIDE
                                                             else [])
    text = markdown_table(header, rows)
    if total_clients > len(counts):
        text += f"\n(the first {len(counts)} of {total_clients} clients; --clients N shows more)"
    return text


def heat_map(counts: np.ndarray, title: str, path: Path) -> Path:
    """Clients (rows) x classes (columns), colour by count, the count written in each cell when they fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients, classes = counts.shape
    width = min(18.0, max(5.0, 0.35 * classes + 2.0))
    height = min(18.0, max(3.0, 0.3 * clients + 1.5))
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    image = ax.imshow(counts, aspect="auto", cmap="Greens", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="samples")
    if clients <= 40 and classes <= 30:
        threshold = counts.max() / 2 if counts.size else 0
        for (i, j), value in np.ndenumerate(counts):
            ax.text(j, i, str(int(value)), ha="center", va="center", fontsize=7,
                    color="white" if value > threshold else "black")
    if classes <= 30:
        ax.set_xticks(range(classes))
    if clients <= 40:
        ax.set_yticks(range(clients))
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title, fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def show(cfg: ExperimentConfig, out: Optional[Path] = None, clients: int = 50) -> tuple[str, Path]:
    """Build ``cfg``'s federation; returns (the console table, the heat map's path)."""
    from raysim.data import build_federated_data, is_indexed
    from raysim.errors import UserError

    data = build_federated_data(cfg)
    if not is_indexed(data) and data.num_clients > 10_000 and clients > 10_000:
        raise UserError("--clients: this federation makes each client's data on demand; show at most 10,000")
    shown = label_counts(data, clients)
    plotted = label_counts(data, 200) if is_indexed(data) and len(shown) < min(data.num_clients, 200) else shown
    out = Path(out) if out else Path("runs") / f"{cfg.name}-partition.png"  # beside the runs, not in the cwd
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {out.parent} ({exc.strerror})") from None
    title = (f"{cfg.data.name}, data.partition={cfg.data.partition}, {data.num_clients} clients, seed {cfg.seed}"
             + (f" (first {len(plotted)} clients)" if len(plotted) < data.num_clients else ""))
    return format_counts(shown, data.num_clients), heat_map(plotted, title, out)
