"""The report's figures: accuracy per round, per megabyte and per simulated hour, the curricula's k and p, and the
traffic and time each method took to reach the target (``to_target.png``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from raysim.report.model import Report, Run, x_value
from raysim.report.scoring import _ordered, comm_stats, has_sim_time, target_sign
from raysim.runlog import warn_stderr


def _curve(runs: list[Run], y: str, x: Optional[str] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per round: mean and std over runs of ``y`` (and the mean of ``x`` when given, else the round)."""
    by_round: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for r in run.rows:
            if r.get(y) is None:
                continue
            xv = r["round"] if x is None else x_value(r, x)
            if not math.isfinite(xv):  # a run without that axis (no simulated clock)
                continue
            by_round.setdefault(r["round"], []).append((xv, r[y]))
    rounds = sorted(by_round)
    xs = np.array([np.mean([p[0] for p in by_round[k]]) for k in rounds])
    ys = np.array([np.mean([p[1] for p in by_round[k]]) for k in rounds])
    sd = np.array([np.std([p[1] for p in by_round[k]], ddof=1) if len(by_round[k]) > 1 else 0.0 for k in rounds])
    return xs, ys, sd


def _epoch_curve(runs: list[Run], y: str, x: Optional[str] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As :func:`_curve` for a per-local-epoch list (``p_epochs``): one point per local epoch, local epoch e of E
    of round r at x = r - 1 + e / E (the round's last epoch at x = r)."""
    by_x: dict[float, list[float]] = {}
    for run in runs:
        for r in run.rows:
            values = r.get(y)
            if not isinstance(values, list) or not values:
                continue
            for e, v in enumerate(values, start=1):
                if v is not None:
                    by_x.setdefault(r["round"] - 1 + e / len(values), []).append(float(v))
    xs = sorted(by_x)
    ys = np.array([np.mean(by_x[k]) for k in xs])
    sd = np.array([np.std(by_x[k], ddof=1) if len(by_x[k]) > 1 else 0.0 for k in xs])
    return np.array(xs), ys, sd



MAX_PANELS = 12  # settings (panels) in one figure; more make a figure nobody can read
MAX_METHODS = 20  # methods (distinct colours) in one figure
PANELS_PER_ROW = 4


def _plottable(report: Report) -> bool:
    """Plots of more settings or methods than a figure can show are left out, with the reason, instead of a
    figure thousands of pixels wide (``raysim report`` on a folder of unrelated runs)."""
    too_many = [f"{n} {what} (at most {cap})" for n, what, cap in
                ((len(report.settings), "settings", MAX_PANELS), (len(report.methods), "methods", MAX_METHODS))
                if n > cap]
    if not too_many:
        return True
    note = (f"plots left out: {' and '.join(too_many)} are more than one figure shows; report fewer runs, or choose "
            f"the setting keys with --columns")
    report.notes.append(note)
    warn_stderr(note)
    return False


LABEL_WIDTH = 48  # a legend label longer than this wraps onto more lines (its text stays whole)
CHARS_PER_INCH = 13  # legend text at fontsize 8: about this many characters to the inch


def plot_labels(report: Report) -> dict[str, str]:
    """Method -> the label its curves carry: the method itself, the keys that tell it from the others by their config
    names (``fedavg (asynchronous.concurrency=40, asynchronous.mode=fedbuff)``), wrapped after a comma when long,
    so that a plot reads alone."""
    import textwrap

    return {m: "\n".join(textwrap.wrap(m, LABEL_WIDTH, break_long_words=False, break_on_hyphens=False))
            for m in report.methods}


def _legend_columns(labels: list[str], width_in: float) -> int:
    """As many legend columns (at most 4) as labels of this length fit across ``width_in`` inches."""
    longest = max((len(line) for label in labels for line in label.splitlines()), default=1)
    return max(1, min(len(labels), 4, int(width_in * CHARS_PER_INCH // (longest + 6))))


def write_plots(report: Report, out: Path) -> dict[str, Path]:
    """Accuracy vs round and vs cumulative MB (mean line, std band over seeds); k vs round where FAPD logged it, p
    vs round where UNIDEAL did.

    One panel per setting, holding only settings with data (no empty k or p panel for a setting without them); one
    legend under the panels naming each method with the keys that tell it apart (``plot_labels``), each method in the
    same colour everywhere."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    labels = plot_labels(report)
    cmap = plt.get_cmap("tab10" if len(report.methods) <= 10 else "tab20")
    colours = {m: cmap(i % cmap.N) for i, m in enumerate(report.methods)}
    files = {}
    plots = [("acc_vs_round.png", report.metric, None, "round", report.metric),
             ("acc_vs_mb.png", report.metric, "mb", "cumulative MB (up + down)", report.metric),
             ("k_vs_round.png", "k", None, "round", "curriculum dimension k"),
             ("p_vs_round.png", "p", None, "round", "distilled share p (mean over local epochs)")]
    if has_sim_time(report):
        plots.append(("acc_vs_sim_h.png", report.metric, "sim_h", "simulated hours", report.metric))
    if any(isinstance(r.get("p_epochs"), list) for g in report.groups for run in g.runs for r in run.rows):
        plots[-1] = ("p_vs_round.png", "p_epochs", None, "round (one point per local epoch)",
                     "distilled share p")  # the curriculum's course inside each round
    for name, y, x, xlabel, ylabel in plots:
        curve = _epoch_curve if y == "p_epochs" else _curve
        curves = {s: [(g, curve(g.runs, y, x)) for g in _ordered(report) if g.setting == s]
                  for s in report.settings}
        curves = {s: [(g, c) for g, c in cs if len(c[0])] for s, cs in curves.items()}
        settings = [s for s in report.settings if curves[s]]
        if not settings:
            continue
        n = len(settings)
        across, down = min(n, PANELS_PER_ROW), -(-n // PANELS_PER_ROW)
        methods = [m for m in report.methods if any(g.method == m for s in settings for g, _ in curves[s])]
        seeds = {g.method: len(g.runs) for g in report.groups}
        texts = [f"{labels[m]} (n={seeds[m]})" for m in methods]
        ncol = _legend_columns(texts, 5.0 * across)
        lines = sum(max(t.count("\n") + 1 for t in texts[i:i + ncol]) for i in range(0, len(texts), ncol))
        fig, axes = plt.subplots(down, across, figsize=(5.0 * across, 3.6 * down + 0.16 * lines + 0.12),
                                 squeeze=False, layout="constrained")
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        handles = {}
        for ax, setting in zip(axes.flat, settings):
            for g, (xs, ys, sd) in curves[setting]:
                step = "post" if y == "k" else None
                line, = ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, markersize=3, color=colours[g.method],
                                drawstyle="steps-post" if step else "default")
                ax.fill_between(xs, ys - sd, ys + sd, alpha=0.2, color=colours[g.method], step=step)
                handles.setdefault(g.method, line)
            if x is None:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title("\n".join(textwrap.wrap(setting, 45)), fontsize=10)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        fig.legend([handles[m] for m in methods], texts, loc="outside lower center", ncol=ncol, fontsize=8,
                   frameon=False)
        fig.savefig(out / name, dpi=110)
        files[name] = out / name
        plt.close(fig)
    return files


def write_target_plot(report: Report, out: Path) -> dict[str, Path]:
    """``to_target.png`` (see :func:`target_figure`); nothing when no method reached the target."""
    fig = target_figure(report)
    if fig is None:
        return {}
    import matplotlib.pyplot as plt

    path = out / "to_target.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {path.name: path}


def target_figure(report: Report) -> Any:
    """UNIDEAL's Fig. 1: for every method, the traffic (up + down) and the wall-clock time it took to reach the
    report's target (mean ± std over the seeds that reached it), one panel per setting, one labelled point per
    method; methods that never reached it are listed under the panel. None when no method reached the target.

    Traffic spans decades (a head against a whole model), so the axis is logarithmic; a method that sends nothing
    (``local``) sits at 0 on a symmetric-log axis, linear below the smallest traffic drawn. Only major ticks carry
    labels unless the axis spans less than a decade, and a label is put left of its point in the right part of a
    panel, so no label overlaps another or leaves the figure."""
    stats = {s: [(g, comm_stats(g, report.metric, report.target, report.mode)) for g in report.groups
                 if g.setting == s] for s in report.settings}
    settings = [s for s in report.settings if any(c["reached"] for _, c in stats[s])]
    if not settings:
        return None
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    labels = plot_labels(report)
    cmap = plt.get_cmap("tab10" if len(report.methods) <= 10 else "tab20")
    colours = {m: cmap(i % cmap.N) for i, m in enumerate(report.methods)}
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # "6", not "6×10⁰"
    across, down = min(len(settings), PANELS_PER_ROW), -(-len(settings) // PANELS_PER_ROW)
    fig, axes = plt.subplots(down, across, figsize=(5.5 * across, 4.4 * down), squeeze=False, layout="constrained")
    for ax in axes.flat[len(settings):]:
        ax.set_visible(False)
    placed = []
    for ax, setting in zip(axes.flat, settings):
        missed, points = [], []
        for g, c in sorted(stats[setting], key=lambda gc: gc[0].method):
            if not c["reached"]:
                missed.append(labels[g.method])
                continue
            (mb, mb_sd), (sec, sec_sd) = c["mb_to_target"], c["wall_s_to_target"]
            ax.errorbar(mb, sec, xerr=mb_sd, yerr=sec_sd, fmt="o", color=colours[g.method], capsize=3)
            points.append((mb, sec, f"{labels[g.method]} ({c['reached']}/{c['runs']}, {mb:.3g} MB)"))
        positive = [mb for mb, _, _ in points if mb > 0]
        if len(positive) < len(points):  # a method that sent nothing: 0 on a symmetric-log axis
            ax.set_xscale("symlog", linthresh=min(positive) / 2 if positive else 1.0, linscale=0.5)
            ax.set_xlim(left=0)
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(plain if max(positive) / min(positive) < 10 else NullFormatter())
        ax.xaxis.set_major_formatter(plain)
        ax.margins(x=0.08, y=0.12)
        ax.set_xlabel(f"MB (up + down) to {report.metric} {target_sign(report)} {report.target:g}")
        ax.set_ylabel("seconds to target")
        ax.set_title(setting, fontsize=10)
        ax.grid(alpha=0.3)
        if missed:
            never = textwrap.fill("never reached: " + "; ".join(m.replace("\n", " ") for m in missed), 90)
            ax.text(0.0, -0.22, never, transform=ax.transAxes, fontsize=7, va="top")
        placed.append((ax, points))
    fig.canvas.draw()  # final limits: labels in a panel's right third go left of their point
    for ax, points in placed:
        for mb, sec, text in points:
            fx, fy = ax.transAxes.inverted().transform(ax.transData.transform((mb, sec)))
            right = fx > 0.6
            ax.annotate(text, (mb, sec), fontsize=7, textcoords="offset points",
                        xytext=(-4 if right else 4, -10 if fy > 0.85 else 4), ha="right" if right else "left")
    return fig
