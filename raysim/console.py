"""What a run prints: the start line's description of how the run runs, one line per round, and the summary table.

Everything here is read from the round's metrics and the config: ε from ``epsilon`` (DP-FedAvg's accountant, at the
config's δ), the simulated clock from ``sim_time_s`` (asynchronous modes and ``system.enabled``), the curricula from
``k`` (FAPD) and ``p_epochs`` (UNIDEAL). No import of torch or the engine: the CLI prints the first lines before
anything slow starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional


def privacy_delta(cfg: Any) -> Optional[float]:
    """δ of DP-FedAvg's (ε, δ) guarantee as the accountant takes it (``raysim.sections.privacy.central_delta``:
    ``privacy.delta``, else 0.01 / ``clients.num``); None without ``privacy.enabled``. A round's own
    ``privacy/delta`` wins where it is logged (a resumed run keeps the δ its checkpoint was accounted at)."""
    privacy = getattr(cfg, "privacy", None)
    if privacy is None or not privacy.enabled:
        return None
    from raysim.sections.privacy import central_delta

    return central_delta(cfg)


def clock_mode(cfg: Any) -> str:
    """What runs on the simulated clock: the asynchronous mode with its concurrency and buffer, or synchronous rounds
    with their deadline ("" without a clock)."""
    asynchronous, system = cfg.asynchronous, cfg.system
    if asynchronous.on:
        flight = (f"{asynchronous.concurrency} clients in flight" if asynchronous.concurrency
                  else "the synchronous cohort in flight")
        how = (f"a server step every {asynchronous.buffer_size} arrivals" if asynchronous.mode == "fedbuff"
               else f"every arrival mixed in at alpha {asynchronous.alpha:g}, {asynchronous.staleness} staleness")
        return f"{asynchronous.mode} ({flight}, {how})"
    if system.enabled:
        if system.deadline_s is None:
            return "synchronous rounds (no deadline)"
        over = f", {system.over_selection:.0%} over-selection" if system.over_selection else ""
        return f"synchronous rounds (a {system.deadline_s:g} s deadline{over})"
    return ""


def describe_mode(cfg: Any) -> str:
    """How the run runs, beyond its method and data, for the start line: the asynchronous mode with its concurrency
    and buffer, the simulated clock, DP-FedAvg's budget and DP-SGD ("" for plain synchronous rounds)."""
    clock = clock_mode(cfg)
    parts = [f"{clock} on a simulated clock"] if clock else []
    delta = privacy_delta(cfg)
    if delta is not None:
        p = cfg.privacy
        budget = (f"to ε {p.target_epsilon:g}" if p.noise_multiplier is None and p.target_epsilon is not None
                  else f"noise multiplier {p.noise_multiplier:g}" if p.noise_multiplier is not None else "")
        parts.append(f"DP-FedAvg {budget} at δ {delta:.3g}, clip {p.clip:g}{' (adaptive)' if p.adaptive_clip else ''}"
                     .replace("  ", " "))
    if getattr(cfg.privacy, "dpsgd", False):
        parts.append(f"DP-SGD on clients (noise {cfg.privacy.dpsgd_noise:g}, clip {cfg.privacy.dpsgd_clip:g}, "
                     f"{getattr(cfg.privacy, 'dpsgd_sampling', 'poisson')} batches)")
    return ", ".join(parts)


def format_round(m: dict, rounds: int, delta: Optional[float] = None) -> str:
    """One console line per round; ``delta``: DP-FedAvg's δ, shown beside the round's ε."""
    parts = [f"round {m['round']:>{len(str(rounds))}}/{rounds}"]
    if m.get("acc_mean") is not None:
        parts.append(f"acc_mean {m['acc_mean']:.4f}")
    if m.get("acc_global") is not None:
        parts.append(f"acc_global {m['acc_global']:.4f}")
    loss = m.get("loss", m.get("nonprivate/loss"))  # privacy: the clients' loss is a non-private diagnostic
    if _number(loss):
        parts.append(f"loss {loss:.4f}")
    if "k" in m:
        parts.append(f"k {m['k']}")
    epochs = m.get("p_epochs")
    if isinstance(epochs, list) and len(epochs) > 1:  # the curriculum's course inside the round, start -> end
        parts.append(f"p {epochs[0]:.2f}->{epochs[-1]:.2f}")
    elif m.get("p") is not None:
        parts.append(f"p {m['p']:.2f}")
    if m.get("attack/asr") is not None:  # attack.name=backdoor or scaling: the backdoor's success rate
        parts.append(f"asr {m['attack/asr']:.4f}")
    if _number(m.get("epsilon")):  # privacy.enabled: the privacy spent so far
        delta = m["privacy/delta"] if _number(m.get("privacy/delta")) else delta
        parts.append(f"ε {m['epsilon']:.2f}" + (f" (δ {delta:.3g})" if delta is not None else ""))
    if _number(m.get("dpsgd/epsilon_max")):  # privacy.dpsgd: the largest sample-level ε of any client so far
        parts.append(f"sample ε ≤ {m['dpsgd/epsilon_max']:.3g}")
    up, down = (m.get(k, m.get(f"nonprivate/{k}")) for k in ("bytes_up", "bytes_down"))  # Poisson sampling's
    if isinstance(up, (int, float)) and isinstance(down, (int, float)):  # cohort, so its bytes, are non-private
        parts.append(f"up {human_bytes(up)} down {human_bytes(down)}")
    parts.append(f"{m['wall_s']:.2f}s")
    if _number(m.get("sim_time_s")):  # the simulated clock at the end of the round (asynchronous, system.enabled)
        step = f" (+{_duration(m['round_sim_s'])})" if _number(m.get("round_sim_s")) else ""
        parts.append(f"sim {_clock(m['sim_time_s'])}{step}")
    return "  ".join(parts)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000.0
    return f"{n:.1f}GB"


def _duration(seconds: float) -> str:
    """Simulated seconds in the unit a reader takes in at once: 0.42s, 35s, 12.5min, 3.2h."""
    if seconds < 10:
        return f"{seconds:.2g}s"
    if seconds < 600:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.1f}min" if seconds < 3 * 3600 else f"{seconds / 3600:.1f}h"


def summary_table(rows: list[dict], run_dir: Path, elapsed: Optional[float] = None, resumed_after: int = 0,
                  cfg: Any = None) -> str:
    """The final table printed after a run; ``elapsed``: this invocation's seconds from launch to the end, start-up
    and shutdown included (the rounds' own time is in the metrics); ``resumed_after``: the round this invocation
    resumed after (0: it started the run), so that its times are told apart from the whole run's; ``cfg``: the
    run's config, for what the rows do not hold (δ, the asynchronous mode)."""
    if not rows:
        return f"no rounds completed; run directory: {run_dir}"
    rows = sorted(rows, key=lambda r: r["round"])
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
    up, down = (last.get(k, last.get(f"nonprivate/{k}")) for k in ("bytes_up_total", "bytes_down_total"))
    if isinstance(up, (int, float)) and isinstance(down, (int, float)):
        lines.append(("bytes up / down", f"{human_bytes(up)} / {human_bytes(down)}"))
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
    lines += [(key, value) for key, value in (("simulated time", sim_time_line(rows, cfg)),
                                              ("privacy", privacy_line(rows, cfg)),
                                              ("sample-level DP", dpsgd_line(rows)),
                                              ("curriculum k", k_line(rows)),
                                              ("curriculum p", curriculum_line(rows))) if value]
    lines.append(("run directory", str(run_dir)))
    if any(Path(run_dir).glob("events.out.tfevents.*")):  # log.tensorboard: false writes none
        lines.append(("tensorboard", f"tensorboard --logdir {run_dir}"))
    width = max(len(k) for k, _ in lines)
    bar = "-" * (width + 2 + max(len(v) for _, v in lines))
    return "\n".join([bar] + [f"{k:<{width}}  {v}" for k, v in lines] + [bar])


def sim_time_line(rows: list[dict], cfg: Any = None) -> str:
    """The simulated clock at the end and when the best accuracy came ("" for a run without one)."""
    clocked = [r for r in rows if _number(r.get("sim_time_s"))]
    if not clocked:
        return ""
    end = clocked[-1]["sim_time_s"]
    text = f"{_clock(end)} ({end / 3600:.3g} h) at round {clocked[-1]['round']}"
    accs = [r for r in clocked if _number(r.get("acc_mean"))]
    if accs:
        best = max(accs, key=lambda r: r["acc_mean"])
        text += f"; best acc_mean at {best['sim_time_s'] / 3600:.3g} h"
    mode = clock_mode(cfg) if cfg is not None else ""
    return f"{text}; {mode}" if mode else text


def privacy_line(rows: list[dict], cfg: Any = None) -> str:
    """DP-FedAvg's ε after the last round at the config's δ, with the noise and clip that spent it ("")."""
    spent = [r for r in rows if _number(r.get("epsilon"))]
    if not spent:
        return ""
    last = spent[-1]
    delta = last["privacy/delta"] if _number(last.get("privacy/delta")) else \
        privacy_delta(cfg) if cfg is not None else None
    text = f"ε {last['epsilon']:.2f}" + (f" at δ {delta:.3g}" if delta is not None else "") + \
        f" after round {last['round']}"
    target = getattr(getattr(cfg, "privacy", None), "target_epsilon", None)
    how = [f"target ε {target:g}"] if target is not None else []
    if _number(last.get("privacy/noise_multiplier")):
        how.append(f"noise multiplier {last['privacy/noise_multiplier']:.4g}")
    if _number(last.get("privacy/clip")):
        how.append(f"clip {last['privacy/clip']:.3g}")
    return f"{text} ({', '.join(how)})" if how else text


def dpsgd_line(rows: list[dict]) -> str:
    """DP-SGD: the largest and the mean sample-level ε over the clients that trained ("")."""
    last = next((r for r in reversed(rows) if _number(r.get("dpsgd/epsilon_max"))), None)
    if last is None:
        return ""
    mean = f", mean {last['dpsgd/epsilon_mean']:.3g}" if _number(last.get("dpsgd/epsilon_mean")) else ""
    return f"ε ≤ {last['dpsgd/epsilon_max']:.3g} for every client that trained{mean} (DP-SGD, each client's own δ)"


def k_line(rows: list[dict]) -> str:
    """FAPD's curriculum dimension: where it started and each round it moved ("" for a run without ``k``)."""
    ks = [(r["round"], r["k"]) for r in rows if _number(r.get("k"))]
    if not ks:
        return ""
    moves = [(rnd, k) for (_, before), (rnd, k) in zip(ks, ks[1:]) if k != before]
    if not moves:
        return (f"{ks[0][1]:g} throughout rounds {ks[0][0]}-{ks[-1][0]}: the curriculum has not moved yet (the "
                f"consensus controller grows k once acc_global stops moving)")
    shown = moves if len(moves) <= 6 else moves[:3] + [(None, None)] + moves[-2:]
    steps = " -> ".join("..." if rnd is None else f"{k:g} (round {rnd})" for rnd, k in shown)
    return f"{ks[0][1]:g} -> {steps}; {len(moves)} move{'s' if len(moves) > 1 else ''}"


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

    def __init__(self, rounds: int, delta: Optional[float] = None):
        self.rounds, self.delta = rounds, delta
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
        return f"{format_round(m, self.rounds, self.delta)}  [{_clock(elapsed)} elapsed, eta {_clock(eta)}]"


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
