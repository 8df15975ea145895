"""What a run leaves behind: ``metrics.jsonl`` (one JSON object per round), ``client_metrics.jsonl`` (one per evaluated
round: every evaluated client's correct / total), TensorBoard scalars, console lines.

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
    "k": "curriculum/k",
    "p": "curriculum/p",
    "round_sim_s": "time/round_sim_s",  # system.enabled: the simulated clock
    "sim_time_s": "time/sim_s",
    "dropouts": "system/dropouts",
    "late": "system/late",
    "partial": "system/partial",
    "surplus": "system/surplus",
}
# system.enabled: these metrics also go to TensorBoard under sim_time/<name>, at steps of simulated seconds
SIM_TIME_CURVES = ("acc_mean", "acc_global", "acc_weighted", "loss")


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
    atomic_write_text(path, "".join(json.dumps(m) + "\n" for m in kept), fsync=True)


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
            self._clients_fh.write(json.dumps(client_row(metrics["round"], client_counts)) + "\n")
            self._clients_fh.flush()
            os.fsync(self._clients_fh.fileno())
        self._fh.write(json.dumps(metrics) + "\n")
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
            tag = TB_TAGS.get(key) or (key if "/" in key else f"loss/{key[5:]}" if key.startswith("loss_")
                                       else f"metrics/{key}")
            self.tb.add_scalar(tag, value, step)
        if client_counts:
            import numpy as np

            client_acc = {cid: correct / total for cid, (correct, total) in client_counts.items()}
            self.tb.add_histogram("acc/clients", np.array(list(client_acc.values())), step)
            if len(client_acc) <= self.per_client_max:
                for cid, acc in client_acc.items():
                    self.tb.add_scalar(f"per_client/acc_{cid:04d}", acc, step)  # sorts after acc, curriculum, loss
        self.tb.flush()

    def _write_epochs(self, metrics: dict, from_step: int = 0) -> None:
        """A per-local-epoch list (``<name>_epochs``, UNIDEAL's ``p_epochs``) as one point per local epoch, at step
        ``(round - 1) * epochs + epoch`` (epoch 1-based), under the round metric's tag plus ``_epoch``
        (``curriculum/p_epoch``): the schedule's course inside each round, on a step axis TensorBoard can plot."""
        if self.tb is None:
            return
        for key, values in metrics.items():
            if not (key.endswith(EPOCHS) and isinstance(values, list) and values):
                continue
            base = key[:-len(EPOCHS)]
            tag = (TB_TAGS.get(base) or f"metrics/{base}") + "_epoch"
            first = (metrics["round"] - 1) * len(values)
            for e, value in enumerate(values, start=1):
                if (first + e >= from_step and isinstance(value, (int, float)) and not isinstance(value, bool)
                        and math.isfinite(value)):
                    self.tb.add_scalar(tag, value, first + e)

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


def format_round(m: dict, rounds: int) -> str:
    """One console line per round."""
    parts = [f"round {m['round']:>{len(str(rounds))}}/{rounds}"]
    if m.get("acc_mean") is not None:
        parts.append(f"acc_mean {m['acc_mean']:.4f}")
    if m.get("acc_global") is not None:
        parts.append(f"acc_global {m['acc_global']:.4f}")
    parts.append(f"loss {m['loss']:.4f}")
    if "k" in m:
        parts.append(f"k {m['k']}")
    epochs = m.get("p_epochs")
    if isinstance(epochs, list) and len(epochs) > 1:  # the curriculum's course inside the round, start -> end
        parts.append(f"p {epochs[0]:.2f}->{epochs[-1]:.2f}")
    elif m.get("p") is not None:
        parts.append(f"p {m['p']:.2f}")
    if m.get("attack/asr") is not None:  # attack.name=backdoor or scaling: the backdoor's success rate
        parts.append(f"asr {m['attack/asr']:.4f}")
    parts.append(f"up {human_bytes(m['bytes_up'])} down {human_bytes(m['bytes_down'])}")
    parts.append(f"{m['wall_s']:.2f}s")
    return "  ".join(parts)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000.0
    return f"{n:.1f}GB"


def summary_table(rows: list[dict], run_dir: Path, elapsed: Optional[float] = None, resumed_after: int = 0) -> str:
    """The final table printed after a run; ``elapsed``: this invocation's seconds from launch to the end, start-up
    and shutdown included (the rounds' own time is in the metrics); ``resumed_after``: the round this invocation
    resumed after (0: it started the run), so that its times are told apart from the whole run's."""
    if not rows:
        return f"no rounds completed; run directory: {run_dir}"
    last = rows[-1]
    lines = [("rounds", str(last["round"]))]
    accs = [r for r in rows if r.get("acc_mean") is not None]
    if accs:
        best = max(accs, key=lambda r: r["acc_mean"])
        lines.append(("best acc_mean", f"{best['acc_mean']:.4f} (round {best['round']})"))
        lines.append(("final acc_mean", f"{accs[-1]['acc_mean']:.4f}"))
    globs = [r for r in rows if r.get("acc_global") is not None]
    if globs:
        best = max(globs, key=lambda r: r["acc_global"])
        lines.append(("best acc_global", f"{best['acc_global']:.4f} (round {best['round']})"))
    lines.append(("bytes up / down",
                  f"{human_bytes(last['bytes_up_total'])} / {human_bytes(last['bytes_down_total'])}"))
    per_round = f"{last['wall_s_total'] / last['round']:.2f}s per round"
    mine = [r for r in rows if r["round"] > resumed_after]
    if elapsed is None:
        lines.append(("wall time", f"{last['wall_s_total']:.1f}s ({per_round})"))
    elif resumed_after and mine:
        lines.append(("wall time", f"{elapsed:.1f}s from launch to the end of this resume "
                                   f"({sum(r['wall_s'] for r in mine):.1f}s in its {len(mine)} rounds)"))
        lines.append(("whole run", f"{last['wall_s_total']:.1f}s in all {last['round']} rounds ({per_round})"))
    else:
        lines.append(("wall time", f"{elapsed:.1f}s from launch to the end ({last['wall_s_total']:.1f}s in rounds, "
                                   f"{per_round})"))
    course = curriculum_line(rows)
    if course:
        lines.append(("curriculum p", course))
    lines.append(("run directory", str(run_dir)))
    lines.append(("tensorboard", f"tensorboard --logdir {run_dir}"))
    width = max(len(k) for k, _ in lines)
    bar = "-" * (width + 2 + max(len(v) for _, v in lines))
    return "\n".join([bar] + [f"{k:<{width}}  {v}" for k, v in lines] + [bar])


def curriculum_line(rows: list[dict]) -> str:
    """What UNIDEAL's ``p`` is and how it moved, in one line ("" for a run without ``p_epochs``)."""
    runs = [r["p_epochs"] for r in rows if isinstance(r.get("p_epochs"), list) and r["p_epochs"]]
    if not runs:
        return ""
    what = "share of each batch distilled from the global head, easiest samples first"
    first, last = runs[0], runs[-1]
    if len(last) > 1 and last[0] != last[-1]:
        return f"{what}: {last[0]:.2f} -> {last[-1]:.2f} over each round's {len(last)} local epochs"
    if first[-1] != last[-1]:
        return f"{what}: {first[-1]:.2f} in round {rows[0]['round']} -> {last[-1]:.2f} in round {rows[-1]['round']}"
    return f"{what}: {last[-1]:.2f} throughout (the curriculum does not move)"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


class ProgressLine:
    """``format_round`` plus the time since this invocation started and an ETA from its mean round time."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.t0: Optional[float] = None
        self.first = 0

    def start(self, after_round: int = 0) -> None:
        import time

        self.t0, self.first = time.monotonic(), after_round

    def format(self, m: dict) -> str:
        import time

        if self.t0 is None:
            self.start(m["round"] - 1)
        elapsed = time.monotonic() - self.t0
        done = max(1, m["round"] - self.first)
        eta = elapsed / done * max(0, self.rounds - m["round"])
        return f"{format_round(m, self.rounds)}  [{_clock(elapsed)} elapsed, eta {_clock(eta)}]"


class LiveRound:
    """On a terminal, a line under the round lines that shows the running round's progress (clients trained of
    sampled, then evaluated), redrawn in place about once a second by a background thread that asks the driver."""

    def __init__(self, rounds: int, stream: Any = None, every_s: float = 1.0):
        import sys
        import threading

        self.rounds, self.every_s = rounds, every_s
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._shown = False

    def start(self, control: Any) -> None:
        """Poll ``control.progress()`` (a ``raysim.engine.runner.RunControl``) in a background thread."""
        import threading

        def poll() -> None:
            while not self._stop.wait(self.every_s):
                try:
                    rnd, done, total, kind = control.progress(timeout=5)
                except Exception:  # noqa: BLE001 - the run is ending or the driver is busy: skip a redraw
                    continue
                if total and rnd <= self.rounds:
                    what = {"train": "clients trained", "evaluate": "evaluation chunks done"}.get(kind, "server steps")
                    self.show(f"  round {rnd}/{self.rounds}: {done}/{total} {what}")

        self._thread = threading.Thread(target=poll, daemon=True, name="raysim-live-round")
        self._thread.start()

    def show(self, text: str) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self._shown = True

    def clear(self) -> None:
        """Call before printing a round line, so the live line never mixes with it."""
        with self._lock:
            if self._shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self._shown = False

    def stop(self) -> None:
        """Stop polling (call it after the last round, while Ray is still up) and erase the live line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=6)
        with self._lock:
            if self._shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self._shown = False
