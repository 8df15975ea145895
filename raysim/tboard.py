"""What every run directory gives TensorBoard besides its scalars: HParams and a custom-scalars layout.

HParams hold the run's resolved config (so ``tensorboard --logdir runs/`` compares any runs, not only sweep trials;
a sweep later replaces a trial's HParams with its searched keys and best metric). The custom-scalars layout puts
accuracy beside the curriculum on one page: ``k`` for FAPD, ``p`` for UNIDEAL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raysim.config import ExperimentConfig, to_flat_dict

# the curriculum scalar an algorithm logs (metrics.jsonl key -> TensorBoard tag), for the layout
CURRICULUM_TAGS = {"k": "curriculum/k", "p": "curriculum/p"}


def run_hparams(cfg: ExperimentConfig) -> dict[str, Any]:
    """The flat config minus where it was written; lists become strings (HParams takes scalars only)."""
    out = {}
    for key, value in to_flat_dict(cfg).items():
        if key in ("log.dir",) or value is None:
            continue
        out[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def layout(curriculum: str | None) -> dict:
    charts = {"accuracy": ["Multiline", ["acc/mean", "acc/global"]]}
    if curriculum:
        charts[f"curriculum {curriculum}"] = ["Multiline", [CURRICULUM_TAGS[curriculum]]]
    charts["loss and its parts"] = ["Multiline", [r"loss/.*"]]
    charts["bytes per round"] = ["Multiline", ["comm/bytes_up", "comm/bytes_down"]]
    return {"raysim": charts}


def curriculum_of(algorithm: str) -> str | None:
    if algorithm == "fapd":
        return "k"
    if algorithm == "unideal":
        return "p"
    return None


def write_run_header(run_dir: Path, cfg: ExperimentConfig) -> None:
    """HParams of the whole config and the custom-scalars layout, in ``events.*.hparams`` of the run directory."""
    from torch.utils.tensorboard import SummaryWriter

    from raysim.tune import write_hparams

    write_hparams(run_dir, run_hparams(cfg), {})
    writer = SummaryWriter(str(run_dir), filename_suffix=".layout")
    try:
        writer.add_custom_scalars(layout(curriculum_of(cfg.algorithm.name)))
    finally:
        writer.close()
