"""``raysim report RUN_DIR...``: tables, significance tests and plots from run directories alone.

Runs are found below the given paths (a run directory holds ``config.yaml`` and ``metrics.jsonl``; sweep and seed
parents are searched) and grouped by their config minus the seed and the keys that only say how or where a run ran
(``name``, ``log.*``, ``engine.*``). The main table is shaped like the papers': rows are methods, columns are
settings, cells are mean ± std over seeds of each run's best accuracy; the column's best is bold, and a ``*`` marks
each method that the best beats at p < 0.01 (a paired t-test on shared seeds, else Welch's, Holm-corrected over the
column: ``raysim.report_stats``, which also gives the final-round table and the client spread).

Which runs are a method and which a setting (``layout``):

* ``name``: from the configs' names, ``<setting>-<method>`` with the method starting at the algorithm's name, as the
  experiment files are named (``experiments/fapd/cifar10-moon.yaml`` is ``cifar10-moon``: setting ``cifar10``, method
  ``moon``; ``digits-fapd-nadpt``: ``digits`` and ``fapd-nadpt``; ``digits-niid1-cpu-fedproto``:
  ``digits-niid1-cpu`` and ``fedproto``). So every method of a seed's table lands in one table whatever its own
  hyperparameters, and a method that had to run a variant of the setting (UNIDEAL's FedAvg on the RGB domains)
  stays in its setting's column. Groups that still share a cell (a sweep over ``train.lr``, say) get the keys that
  tell them apart appended to the method: ``fedprox (lr=0.1)``.
* ``keys``: from the keys that vary between groups: columns are the varying ``data.*`` / ``clients.*`` /
  ``model.*`` keys (``columns``), rows ``algorithm.name`` plus the other varying keys.
* ``auto`` (the default): ``name`` when every group's runs are named that way (one name per group), else ``keys``.
"""

from raysim.report.build import group_warnings, make_report
from raysim.report.grouping import group_runs, split_name
from raysim.report.markdown import format_console
from raysim.report.model import (ALPHA, IGNORED_PREFIXES, LAYOUTS, LOWER_IS_BETTER, MB, RUN_LENGTH_KEYS, Group,
                                 Report, Run, is_percent, metric_mode)
from raysim.report.plots import _epoch_curve, plot_labels, target_figure, write_plots, write_target_plot
from raysim.report.runs import find_runs, is_run_dir, load_run, usable_rows
from raysim.report.scoring import check_metric, comm_stats, has_sim_time, main_table_rows, numeric_metrics, score
from raysim.tables import DEFAULT_COLUMNS

__all__ = ["ALPHA", "DEFAULT_COLUMNS", "IGNORED_PREFIXES", "LAYOUTS", "LOWER_IS_BETTER", "MB", "RUN_LENGTH_KEYS",
           "Group", "Report", "Run", "_epoch_curve", "check_metric", "comm_stats", "find_runs", "format_console",
           "group_runs", "group_warnings", "has_sim_time", "is_percent", "is_run_dir", "load_run", "main_table_rows",
           "make_report", "metric_mode", "numeric_metrics", "plot_labels", "score", "split_name", "target_figure",
           "usable_rows", "write_plots", "write_target_plot"]
