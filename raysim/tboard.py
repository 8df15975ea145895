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

import time
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
    a sweep's end) replaces the earlier HParams file. Written with TensorBoard's own event writer and protocol
    buffers, the events ``torch.utils.tensorboard`` writes, without importing torch: a sweep's or seed set's own
    process, which writes these at its end, has no other use for torch (1-3 s to import).
    """
    if not run_dir.is_dir() or not hparams:
        return
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    for old in run_dir.glob("events.out.tfevents.*.hparams"):
        old.unlink()
    clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in hparams.items()
             if v is not None}
    values = {k: float(v) for k, v in metrics.items() if v is not None}
    writer = EventFileWriter(str(run_dir), filename_suffix=".hparams")
    try:
        for summary in _session_summaries(clean):  # no experiment: TensorBoard builds it from every run
            writer.add_event(Event(summary=summary, wall_time=time.time()))
        for key, value in values.items():
            writer.add_event(Event(summary=Summary(value=[Summary.Value(tag=key, simple_value=value)]),
                                   wall_time=time.time(), step=0))
    finally:
        writer.close()


def _session_summaries(hparams: dict) -> list:
    """The HParams plugin's session-start (the hparams) and session-end summaries, as
    ``torch.utils.tensorboard.summary.hparams`` makes them (numbers, bools included, as ``number_value``; strings as
    ``string_value``)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.metadata import PLUGIN_DATA_VERSION, PLUGIN_NAME, SESSION_END_INFO_TAG, \
        SESSION_START_INFO_TAG
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo, SessionStartInfo

    start = SessionStartInfo()
    for key, value in hparams.items():
        if isinstance(value, (int, float)):
            start.hparams[key].number_value = value
        elif isinstance(value, str):
            start.hparams[key].string_value = value

    def summary(tag: str, **data: Any) -> Any:
        content = HParamsPluginData(version=PLUGIN_DATA_VERSION, **data)
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME,
                                                                      content=content.SerializeToString()))
        return Summary(value=[Summary.Value(tag=tag, metadata=meta)])

    return [summary(SESSION_START_INFO_TAG, session_start_info=start),
            summary(SESSION_END_INFO_TAG, session_end_info=SessionEndInfo(status=Status.Value("STATUS_SUCCESS")))]
