"""``report.md`` and what ``raysim report`` prints."""

from __future__ import annotations

from pathlib import Path

from raysim.report.model import ALPHA, Report
from raysim.report.scoring import _ordered, _pm_bytes, comm_stats, has_sim_time, main_table_rows, target_sign
from raysim.report_stats import MIN_SEEDS, extra_sections, final_table_rows
from raysim.runlog import human_bytes
from raysim.tables import markdown_table
from raysim.tables import mean_pm as _pm


def _write_markdown(report: Report, path: Path, alpha: float) -> Path:

    seeds = sorted({len(g.values) for g in report.groups})
    lines = ["# raysim report", "",
             f"{sum(len(g.runs) for g in report.groups)} runs in {len(report.groups)} groups "
             f"(seeds per group: {', '.join(map(str, seeds))}).", "",
             f"## Best `{report.metric}`{report.unit}, mean ± std over seeds"
             + ("" if report.mode == "max" else " (best: the lowest)"), "",
             markdown_table(["method"] + report.settings, main_table_rows(report)), "",
             f"Bold: the best in its column. `*`: the column's best beats this method at p < {alpha:g} "
             f"(paired t-test over seeds when both ran the same seeds, else Welch's t-test; Holm-corrected over the "
             f"column's comparisons; no mark from fewer than {MIN_SEEDS} seeds on either side, though the "
             f"p-values are computed from two). "
             f"p-values (raw and Holm-adjusted) are in `summary.csv`. "
             + ("Rows and columns come from the configs' names (`<setting>-<method>`)." if report.layout == "name"
                else "Rows and columns come from the config keys that vary between groups."), "",
             *([f"Warnings: {'; '.join(report.notes)}.", ""] if report.notes else []),
             *extra_sections(report),
             f"## Communication and speed (target: {report.metric} {target_sign(report)} {report.target:g})", ""]
    rows = []
    simulated = has_sim_time(report)
    for g in _ordered(report):
        c = comm_stats(g, report.metric, report.target, report.mode)
        rows.append([g.method, g.setting, human_bytes(c["bytes_up_per_round"]),
                     human_bytes(c["bytes_down_per_round"]), f"{c['wall_s_per_round']:.2f}",
                     f"{c['reached']}/{c['runs']}", _pm(c["rounds_to_target"], ".1f"), _pm_bytes(c["mb_to_target"]),
                     _pm(c["wall_s_to_target"], ".1f")] + ([_pm(c["sim_h_to_target"], ".3g")] if simulated else []))
    lines += [markdown_table(["method", "setting", "up / round", "down / round", "s / round (median)",
                              "reached", "rounds to target", "bytes to target", "s to target"]
                             + (["simulated h to target"] if simulated else []), rows), "",
              "Up/down: bytes crossing the network per round (all sampled clients together); bytes to target: "
              "cumulative up + down until the first round at or above the target, over the seeds that reached it; "
              "s to target includes the first round's start-up.", ""]
    for name, title in (("acc_vs_round.png", "Accuracy per round"), ("acc_vs_mb.png", "Accuracy per megabyte"),
                        ("k_vs_round.png", "FAPD curriculum dimension k"),
                        ("p_vs_round.png", "UNIDEAL curriculum share p"),
                        ("acc_vs_sim_h.png", "Accuracy against simulated time"),
                        ("to_target.png",
                         f"Traffic and time to {report.metric} {target_sign(report)} {report.target:g}")):
        if name in report.files:
            lines += [f"## {title}", "", f"![{title}]({name})", ""]
    path.write_text("\n".join(lines))
    return path



def format_console(report: Report, out: Path) -> str:
    """What ``raysim report`` prints: the main table and where everything went."""

    lines = [f"best {report.metric}{report.unit}, mean ± std over seeds"
             f"{'' if report.mode == 'max' else ' (best: the lowest)'}; * = beaten by the column's best at "
             f"Holm-adjusted p < {ALPHA:g}",
             markdown_table(["method"] + report.settings, main_table_rows(report, markdown=False)),
             f"final-round {report.metric}{report.unit}, mean ± std over seeds",
             markdown_table(["method"] + report.settings, final_table_rows(report)),
             f"report: {out / 'report.md'} (tables: table.csv, summary.csv, comm.csv; plots: "
             f"{', '.join(n for n in report.files if n.endswith('.png')) or 'none'})"]
    lines += [f"raysim: {note}" for note in report.notes]
    return "\n".join(lines)
