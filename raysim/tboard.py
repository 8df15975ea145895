"""What TensorBoard gets besides a run's scalars: HParams and a custom-scalars layout.

HParams hold the run's resolved config (so ``tensorboard --logdir runs/`` compares any runs, not only sweep trials;
a sweep later replaces a trial's HParams with its searched keys and best metric, :func:`write_hparams`). The
custom-scalars layout puts accuracy on one page beside the charts the algorithm declares
(``Algorithm.tensorboard_charts``: FAPD's curriculum dimension, UNIDEAL's distilled share).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from raysim.config import ExperimentConfig, to_flat_dict


def run_hparams(cfg: ExperimentConfig) -> dict[str, Any]:
    """The flat config minus where it was written; lists become strings (HParams takes scalars only)."""
    out = {}
    for key, value in to_flat_dict(cfg).items():
        if key in ("log.dir",) or value is None:
            continue
        out[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def anchored(regex: str) -> str:
    """A custom-scalars tag regex that matches whole tags only: TensorBoard searches each regex anywhere in a tag, so
    ``comm/bytes_up`` would also chart ``comm/bytes_up_total``."""
    core = regex[1:] if regex.startswith("^") else regex
    core = core[:-1] if core.endswith("$") and not core.endswith("\\$") else core
    return f"^{core}$"


def layout(charts: Mapping[str, Sequence[str]] = {}) -> dict:  # noqa: B006 - read only
    """The custom-scalars page: accuracy, then ``charts`` (title -> tag regexes, one multi-line chart each: the
    curriculum), loss and its parts, bytes per round. Every regex is anchored (:func:`anchored`), so a chart holds
    only the tags it names (per-round bytes, never the cumulative ``_total`` tags)."""
    page = {"accuracy": ["Multiline", [r"^acc/mean$", r"^acc/global$"]]}
    page.update({title: ["Multiline", [anchored(t) for t in tags]] for title, tags in charts.items()})
    page["loss and its parts"] = ["Multiline", [r"^loss/.*$"]]
    page["bytes per round"] = ["Multiline", [r"^comm/bytes_up$", r"^comm/bytes_down$"]]
    return {"raysim": page}


def write_run_header(run_dir: Path, cfg: ExperimentConfig, charts: Mapping[str, Sequence[str]] = {}) -> None:  # noqa: B006
    """HParams of the whole config and the custom-scalars layout (with the algorithm's own ``charts``), in
    ``events.*.hparams`` / ``events.*.layout`` of the run directory."""
    from torch.utils.tensorboard import SummaryWriter

    write_hparams(run_dir, run_hparams(cfg), {})
    for old in run_dir.glob("events.out.tfevents.*.layout"):  # a resumed run writes its header again
        old.unlink()
    writer = SummaryWriter(str(run_dir), filename_suffix=".layout")
    try:
        writer.add_custom_scalars(layout(charts))
    finally:
        writer.close()


def write_hparams(run_dir: Path, hparams: dict, metrics: dict) -> None:
    """TensorBoard HParams for one run or trial, in its run directory: ``tensorboard --logdir SWEEP_DIR`` compares
    trials.

    Besides the given summary metrics, the run's own ``acc/mean`` / ``acc/global`` curves are listed as metrics.
    A rewrite (after --resume) replaces the earlier HParams file.
    """
    if not run_dir.is_dir() or not hparams:
        return
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    for old in run_dir.glob("events.out.tfevents.*.hparams"):
        old.unlink()
    clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in hparams.items()
             if v is not None}
    values = {k: float(v) for k, v in metrics.items() if v is not None}
    names = {**values, "acc/mean": 0.0, "acc/global": 0.0}
    exp, ssi, sei = hparams_summary(clean, names)
    writer = SummaryWriter(str(run_dir), filename_suffix=".hparams")
    try:
        fw = writer._get_file_writer()  # noqa: SLF001 - the documented add_hparams() would open a sub-run
        for summary in (exp, ssi, sei):
            fw.add_summary(summary)
        for key, value in values.items():
            writer.add_scalar(key, value, 0)
    finally:
        writer.close()
