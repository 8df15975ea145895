"""What TensorBoard gets besides a run's scalars: HParams and a custom-scalars layout.

HParams hold the run's whole resolved config, for every run, seed and sweep trial alike (a sweep adds a trial's best
metric when it ends, :func:`write_hparams`), so ``tensorboard --logdir runs/`` compares any runs. No run writes an
HParams *experiment* (the list of columns): TensorBoard then takes the columns from all the runs it reads, marks the
keys whose values differ between them and lists those first (``algorithm.name`` and ``seed`` in a comparison of
two methods over seeds), where one run's experiment would have fixed the columns to that run's keys, in name order.
The custom-scalars layout puts the charts the algorithm declares (``Algorithm.tensorboard_charts``: FAPD's
curriculum dimension, UNIDEAL's distilled share) first on one page, then accuracy, loss and traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from raysim.config import ExperimentConfig, to_flat_dict


def run_hparams(cfg: ExperimentConfig) -> dict[str, Any]:
    """The flat config minus where it was written; lists become strings (HParams takes scalars only)."""
    return _scalars(to_flat_dict(cfg))


def _scalars(flat: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value if isinstance(value, (int, float, str, bool)) else str(value)
            for key, value in flat.items() if key != "log.dir" and value is not None}


def saved_hparams(run_dir: Path) -> Optional[dict[str, Any]]:
    """HParams of the config a run directory holds (``config.yaml``, resolved when the run started), as
    :func:`run_hparams` gives them; None when it has none or its config switched TensorBoard off."""
    import yaml

    from raysim.config import flatten_dict

    try:
        raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(raw, dict) or (raw.get("log") or {}).get("tensorboard") is False:
        return None
    return _scalars(flatten_dict(raw))


def anchored(regex: str) -> str:
    """A custom-scalars tag regex that matches whole tags only: TensorBoard searches each regex anywhere in a tag, so
    ``comm/bytes_up`` would also chart ``comm/bytes_up_total``."""
    core = regex[1:] if regex.startswith("^") else regex
    core = core[:-1] if core.endswith("$") and not core.endswith("\\$") else core
    return f"^{core}$"


def layout(charts: Mapping[str, Sequence[str]] = {}) -> dict:  # noqa: B006 - read only
    """The custom-scalars page: ``charts`` first (title -> tag regexes, one multi-line chart each: the curriculum,
    what the algorithm is about), then accuracy, loss and its parts, bytes per round. Every regex is anchored
    (:func:`anchored`), so a chart holds only the tags it names (per-round bytes, never the cumulative ``_total``
    tags)."""
    page = {title: ["Multiline", [anchored(t) for t in tags]] for title, tags in charts.items()}
    page["accuracy"] = ["Multiline", [r"^acc/mean$", r"^acc/global$"]]
    # privacy: the loss (and Poisson sampling's bytes) are non-private diagnostics, under nonprivate/
    page["loss and its parts"] = ["Multiline", [r"^loss/.*$", r"^nonprivate/loss.*$"]]
    page["bytes per round"] = ["Multiline", [r"^comm/bytes_up$", r"^comm/bytes_down$", r"^nonprivate/bytes_up$",
                                             r"^nonprivate/bytes_down$"]]
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

    Writes the session's start (its hparams) and end, never an experiment (see the module's docstring): TensorBoard
    lists the runs' scalars as the metrics, the given summary ``metrics`` among them. A rewrite (after --resume, or
    a sweep's end) replaces the earlier HParams file.
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
    _, ssi, sei = hparams_summary(clean, {})
    writer = SummaryWriter(str(run_dir), filename_suffix=".hparams")
    try:
        fw = writer._get_file_writer()  # noqa: SLF001 - the documented add_hparams() would open a sub-run
        for summary in (ssi, sei):  # no experiment: TensorBoard builds it from every run, differing keys first
            fw.add_summary(summary)
        for key, value in values.items():
            writer.add_scalar(key, value, 0)
    finally:
        writer.close()
