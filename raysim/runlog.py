"""What a run leaves behind: ``metrics.jsonl`` (one JSON object per round), ``client_metrics.jsonl`` (one per evaluated
round: every evaluated client's correct / total), TensorBoard scalars. The console's lines are ``raysim.console``'s
(re-exported here).

Metric names in ``metrics.jsonl`` are flat (``acc_mean``, ``bytes_up`` ...); TensorBoard gets them under
grouped tags (``acc/mean``, ``comm/bytes_up`` ...) so related curves share a panel.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from raysim.console import (LiveRound, ProgressLine, curriculum_line, format_round,  # noqa: F401 - importers
                            human_bytes, summary_table)
from raysim.fsutil import atomic_write_text

# metrics.jsonl name -> TensorBoard tag; keys not listed here and containing "/" are written as they are
TB_TAGS = {
    "acc_mean": "acc/mean",
    "acc_global": "acc/global",
    "acc_weighted": "acc/weighted",
    "loss": "loss/train",
    "bytes_up": "comm/bytes_up",
    "bytes_down": "comm/bytes_down",
    "bytes_up_total": "comm/bytes_up_total",
    "bytes_down_total": "comm/bytes_down_total",
    "wall_s": "time/round_s",
    "epsilon": "privacy/epsilon",
    "wall_s_total": "time/total_s",
    # the curricula's own charts (and p_epochs: Curriculum/p_epoch) under "Curriculum/": TensorBoard's Time Series, the
    # page it opens on, sorts its groups by name, capitals first, and expands only the first two, so the curriculum
    # is the first thing it shows, above acc/ (FAPD's controller metrics, curriculum/stable ..., come further down)
    "k": "Curriculum/k",
    "p": "Curriculum/p",
    "round_sim_s": "time/round_sim_s",  # system.enabled: the simulated clock
    "sim_time_s": "time/sim_s",
    "dropouts": "system/dropouts",
    "late": "system/late",
    "partial": "system/partial",
    "surplus": "system/surplus",
}
# system.enabled: these metrics also go to TensorBoard under sim_time/<name>, at steps of simulated seconds
SIM_TIME_CURVES = ("acc_mean", "acc_global", "acc_weighted", "loss")
# a per-local-epoch list (p_epochs) is drawn over this many steps a round, each epoch's value held over its share:
# TensorBoard's default smoothing (0.6, an average over points) then follows the schedule within a few points
# instead of turning a round's handful of epochs into a wave
EPOCH_STEPS_PER_ROUND = 100


def tb_tag(key: str) -> str:
    """The TensorBoard tag of a ``metrics.jsonl`` key: ``TB_TAGS``, a key with ``/`` as it is, ``loss_<part>`` as
    ``loss/<part>``, anything else under ``metrics/``."""
    return TB_TAGS.get(key) or (key if "/" in key else f"loss/{key[5:]}" if key.startswith("loss_")
                                else f"metrics/{key}")


def read_metrics(path: Path, *, warn: Optional[Callable[[str], None]] = None) -> list[dict]:
    """The rows of a ``metrics.jsonl``. A torn last line (a kill or power cut in the middle of a write, or a run
    still writing) is skipped, and reported through ``warn`` when given; a damaged line before the last is an error.
    """
    if not path.is_file():
        return []
    with open(path, "rb") as fh:
        lines = fh.read().decode("utf-8", errors="replace").splitlines()
    rows = []
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "round" not in row:
                raise ValueError("not a round's metrics")
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deep to read
            if all(not rest.strip() for rest in lines[i + 1:]):  # the last line: torn by an interrupted write
                if warn is not None:
                    warn(f"{path}: skipped an incomplete last line (line {i + 1}: a run killed mid-write, "
                         f"or one still writing)")
                break
            from raysim.errors import UserError

            raise UserError(f"{path} is damaged at line {i + 1} of {len(lines)} (not a JSON object with 'round')") \
                from None
        rows.append(row)
    return rows


CLIENT_METRICS = "client_metrics.jsonl"
EPOCHS = "_epochs"  # a metric named <name>_epochs holds one value per local epoch of the round (UNIDEAL's p_epochs)


def _truncate(path: Path, resume_round: int) -> None:
    """Keep the whole lines of rounds up to the checkpoint (a torn last line is dropped), atomically."""
    kept = [m for m in read_metrics(path) if m["round"] <= resume_round]
    # fsync, as for every metrics line
    atomic_write_text(path, "".join(json_line(m) for m in kept), fsync=True)


def json_line(row: dict) -> str:
    """One line of strict JSON: a NaN or infinite number (a round with no client's loss, a diverged value) is
    written as null, which every JSON reader takes (bare NaN is Python's extension, not JSON)."""
    return json.dumps(_nulls(row), allow_nan=False) + "\n"


def _nulls(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulls(v) for v in value]
    return value


def client_row(round: int, counts: dict[int, tuple[int, int]]) -> dict:
    """One ``client_metrics.jsonl`` line: parallel lists in client-id order (compact for thousands of clients)."""
    ids = sorted(counts)
    return {"round": round, "client": ids, "correct": [int(counts[c][0]) for c in ids],
            "total": [int(counts[c][1]) for c in ids], "acc": [counts[c][0] / counts[c][1] for c in ids]}


def warn_stderr(message: str) -> None:
    print(f"raysim: warning: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Logger ``name`` at ERROR only while the block runs (a library's chatter kept off the run's stderr), then at
    its own level again."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def quiet_tensorboard_threads() -> None:
    """TensorBoard writes events on a thread of its own; a failed write there (a full disk) prints that thread's
    traceback, then the writer raises the same error in the run's own thread at its next call, where the run stops
    with one line. Such a thread's traceback is left out (the process's other threads keep Python's hook)."""
    import threading

    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "raysim_quiet_tensorboard", False):
        return

    def hook(args: Any) -> None:
        if isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, Exception):
            return  # the writer raises it again in the run's thread
        previous(args)

    hook.raysim_quiet_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _after_the_last_event_file(run_dir: Path) -> None:
    """Wait, if need be, until the clock's second is past every event file's in ``run_dir``.

    TensorBoard reads a run's event files in name order, and a name is ``events.out.tfevents.<second>.<host>.<pid>.
    <counter>`` with the pid and the counter compared as text: a resume's file opened in the same second as the file
    it resumes (a fast run, or raysim.run called twice in one process) can sort first, and then its purge is read
    before the points it should hide and the old points are appended after the rewritten ones. A second or two at
    most, and only when resuming that soon; a file stamped further ahead (a skewed clock) is not waited for."""
    import time

    stamps = (path.name.split(".")[3] for path in run_dir.glob("events.out.tfevents.*"))  # the glob's "*" is [3]
    seconds = [int(stamp) for stamp in stamps if stamp.isdigit()]
    wait = max(seconds, default=0) + 1 - time.time()
    if 0 < wait <= 3:
        time.sleep(wait)


class RunLog:
    """Owned by the driver; resumes cleanly by truncating what came after the checkpoint."""

    def __init__(self, run_dir: Path, *, tensorboard: bool, per_client_max: int, resume_round: int = 0):
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.clients_path = run_dir / CLIENT_METRICS
        self.per_client_max = per_client_max
        if resume_round:
            _truncate(self.metrics_path, resume_round)
            _truncate(self.clients_path, resume_round)
        self._fh = open(self.metrics_path, "a")
        self._clients_fh = open(self.clients_path, "a")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            quiet_tensorboard_threads()
            if resume_round:
                _after_the_last_event_file(run_dir)
            # purge_step hides events a crashed run wrote after its last checkpoint
            self.tb = SummaryWriter(str(run_dir), purge_step=resume_round + 1 if resume_round else None)
            if resume_round:  # the purge also hid the kept rounds' per-epoch points at steps from resume_round + 1
                for m in read_metrics(self.metrics_path):  # (their steps run further): write those again, after it
                    self._write_epochs(m, from_step=resume_round + 1)
                    self._write_sim_time(m, from_step=resume_round + 1)
                self.tb.flush()

    def write(self, metrics: dict, client_counts: Optional[dict[int, tuple[int, int]]] = None) -> None:
        """``client_counts`` (client -> (correct, total)) goes to ``client_metrics.jsonl`` first, so every round in
        ``metrics.jsonl`` has its clients' line; resuming trims both files to the checkpoint."""
        if client_counts:
            self._clients_fh.write(json_line(client_row(metrics["round"], client_counts)))
            self._clients_fh.flush()
            os.fsync(self._clients_fh.fileno())
        self._fh.write(json_line(metrics))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self.tb is None:
            return
        step = metrics["round"]
        self._write_epochs(metrics)
        self._write_sim_time(metrics)
        for key, value in metrics.items():
            if key == "round" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            self.tb.add_scalar(tb_tag(key), value, step)
        if client_counts:
            import numpy as np

            client_acc = {cid: correct / total for cid, (correct, total) in client_counts.items()}
            self.tb.add_histogram("acc/clients", np.array(list(client_acc.values())), step)
            if len(client_acc) <= self.per_client_max:
                for cid, acc in client_acc.items():
                    self.tb.add_scalar(f"per_client/acc_{cid:04d}", acc, step)  # sorts after acc, curriculum, loss
        self.tb.flush()

    def _write_epochs(self, metrics: dict, from_step: int = 0) -> None:
        """A per-local-epoch list (``<name>_epochs``, UNIDEAL's ``p_epochs``) under the round metric's tag plus
        ``_epoch`` (``Curriculum/p_epoch``), over ``EPOCH_STEPS_PER_ROUND`` steps a round: round r spans steps
        (r - 1) * 100 + 1 .. r * 100, and each of its E local epochs holds its value over 100 // E of them. The
        schedule's course inside each round, on an integer step axis that TensorBoard's smoothing follows."""
        if self.tb is None:
            return
        for key, values in metrics.items():
            if not (key.endswith(EPOCHS) and isinstance(values, list) and values):
                continue
            tag = tb_tag(key[:-len(EPOCHS)]) + "_epoch"
            per = max(1, EPOCH_STEPS_PER_ROUND // len(values))
            start = (metrics["round"] - 1) * EPOCH_STEPS_PER_ROUND
            for e, value in enumerate(values):
                if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
                    continue
                for step in range(start + e * per + 1, start + (e + 1) * per + 1):
                    if step >= from_step:
                        self.tb.add_scalar(tag, value, step)

    def _write_sim_time(self, metrics: dict, from_step: int = 0) -> None:
        """``system.enabled``: the accuracy and loss curves again under ``sim_time/<name>``, at the step of the
        round's ``sim_time_s`` in whole simulated seconds (TensorBoard's steps are integers)."""
        if self.tb is None or not isinstance(metrics.get("sim_time_s"), (int, float)):
            return
        step = int(round(metrics["sim_time_s"]))
        if step < from_step:
            return
        for key in SIM_TIME_CURVES:
            value = metrics.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.tb.add_scalar(f"sim_time/{key}", value, step)

    def close(self) -> None:
        """Close both writers; an error from either (a full disk) is raised after both are closed."""
        errors = []
        for close in (self._fh.close, self._clients_fh.close, self.tb.close if self.tb is not None else None):
            try:
                if close is not None:
                    close()
            except Exception as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
        if errors:
            raise errors[0]
