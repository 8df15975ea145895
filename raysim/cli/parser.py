"""The ``raysim`` command line: every verb's arguments, help and examples."""

from __future__ import annotations

import argparse

from raysim.tables import DEFAULT_COLUMNS


def _parser() -> argparse.ArgumentParser:
    from raysim import __version__

    p = argparse.ArgumentParser(prog="raysim", description="Ray-based federated learning simulation.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES["raysim"])
    p.add_argument("--version", action="version", version=f"raysim {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment", formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Run one experiment: raysim run CONFIG.yaml [dotted.key=value ...]",
                         epilog=_EXAMPLES["run"])
    run.add_argument("config", nargs="?", help="experiment YAML (default: built-in defaults; optional with --resume)")
    run.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. rounds=5 train.lr=0.1")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    run.add_argument("--quiet", action="store_true", help="no per-round lines")
    run.add_argument("--overwrite", action="store_true",
                     help="start over in log.dir: remove the run it holds first (refused for a folder that is not a "
                          "raysim run directory, and while another process runs in it)")
    run.add_argument("--seeds", metavar="SEEDS",
                     help="run the config once per seed (0-9, 0,3,5 or 0-4,10), in parallel where resources allow, "
                          "each in PARENT/seed-<n> (PARENT = log.dir or runs/<config>-seeds-<time>); "
                          "with --resume PARENT, continue such a set")

    tune = sub.add_parser("tune", help="hyperparameter sweep with Ray Tune", epilog=_EXAMPLES["tune"],
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          description="Run a sweep: raysim tune SWEEP.yaml [dotted.key=value ...]. Overrides of "
                                      "sweep keys (num_samples=4, scheduler.name=asha, metric=acc_global, dir=...) "
                                      "set the sweep; all others set every trial's experiment config.")
    tune.add_argument("sweep", nargs="?", help="sweep YAML (optional with --resume)")
    tune.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    tune.add_argument("--resume", metavar="SWEEP_DIR", help="continue an interrupted sweep")
    tune.add_argument("--quiet", action="store_true", help="no per-round lines, only trials done and best so far")

    report = sub.add_parser("report", help="tables, significance tests and plots from run directories",
                            epilog=_EXAMPLES["report"], formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Summarise runs: raysim report RUN_DIR... [--out DIR]. Run directories may "
                                        "be nested in sweep or seed directories.")
    report.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run directories or folders that hold them")
    report.add_argument("--out", metavar="DIR", help="where to write (default: RUN_DIR/report for one RUN_DIR, "
                                                     "else ./report)")
    report.add_argument("--metric", default="acc_mean", metavar="KEY",
                        help="any numeric metrics.jsonl key to compare: acc_mean (default), acc_global, acc_weighted, "
                             "loss, bytes_up_total, k, p ...")
    report.add_argument("--mode", default="auto", choices=("auto", "max", "min"),
                        help="whether the metric's best is its maximum or its minimum (auto: the metric's own "
                             "direction: min for losses, bytes, seconds, epsilon and attack/asr, max for accuracies "
                             "and the rest)")
    report.add_argument("--target", type=float, default=0.5,
                        help="value of the metric for the rounds / MB / seconds-to-target columns (default 0.5)")
    report.add_argument("--columns", default=",".join(DEFAULT_COLUMNS), metavar="PREFIXES",
                        help="comma-separated config-key prefixes that make the table's columns (settings); other "
                             f"varying keys make its rows (methods). Default: {','.join(DEFAULT_COLUMNS)}")
    report.add_argument("--no-plots", action="store_true", help="tables only")
    report.add_argument("--layout", default="auto", choices=("auto", "name", "keys"),
                        help="name: methods as rows and settings as columns, read from config names "
                             "'<setting>-<method>' (the seeds' tables); keys: columns from the keys that vary; "
                             "auto: name when every run is named that way")
    report.add_argument("--tsne", metavar="RUN_DIR", help="export RUN_DIR's test-set features (last checkpoint) and "
                                                         "draw their t-SNE (features.npz, tsne.csv, tsne.png)")
    report.add_argument("--tsne-max", type=int, default=2000, metavar="N",
                        help="t-SNE at most N test samples, a class-stratified subset (default 2000)")

    config = sub.add_parser("config", help="show a resolved config, or every config key with its help",
                            epilog=_EXAMPLES["config"], formatter_class=argparse.RawDescriptionHelpFormatter)
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the resolved YAML of CONFIG plus overrides",
                                 description="Print the resolved YAML of CONFIG plus overrides: every key filled in.",
                                 epilog=_EXAMPLES["config show"], formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("config", nargs="?", help="experiment YAML (default: the built-in defaults)")
    show.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    keys = config_sub.add_parser("keys", help="every key: type, default and help",
                                 description="Every config key with its type, default and one-line help.",
                                 epilog=_EXAMPLES["config keys"], formatter_class=argparse.RawDescriptionHelpFormatter)
    keys.add_argument("--algorithm", metavar="NAME", help="list this algorithm's algorithm.* keys (default fedavg)")
    keys.add_argument("--model", metavar="NAME", action="append", default=[],
                      help="add the model.<NAME>.* section a plugin model declares")
    keys.add_argument("--dataset", metavar="NAME", help="add the data.<NAME>.* section a plugin dataset declares")
    keys.add_argument("--plugins", metavar="MODULES", default="", help="comma-separated plugin modules to import")

    data = sub.add_parser("data", help="look at a federation before running it", epilog=_EXAMPLES["data"],
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    data_sub = data.add_subparsers(dest="data_command", required=True)
    data_show = data_sub.add_parser("show", help="label counts per client and a clients x classes heat map (PNG)",
                                    description="Build CONFIG's federation as a run would (no Ray) and show what each "
                                                "client holds: label counts per client, and a heat map PNG.",
                                    epilog=_EXAMPLES["data"], formatter_class=argparse.RawDescriptionHelpFormatter)
    data_show.add_argument("config", nargs="?", help="experiment YAML or a shipped experiment's name")
    data_show.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    data_show.add_argument("--out", metavar="PNG", help="the heat map's file (default: runs/<name>-partition.png)")
    data_show.add_argument("--clients", type=int, default=50, metavar="N",
                           help="print the first N clients (default 50; the heat map shows up to 200)")

    lister = sub.add_parser("list", help="the registered algorithms, models or datasets (plugins included), or the "
                                         "shipped experiments",
                            epilog=_EXAMPLES["list"], formatter_class=argparse.RawDescriptionHelpFormatter)
    lister.add_argument("kind", nargs="?", choices=LIST_KINDS,
                        help="what to list (none: a summary of each with its count)")
    lister.add_argument("pattern", nargs="?", metavar="PATTERN",
                        help="only names containing PATTERN (or matching a glob such as 'fapd/*moon*')")
    lister.add_argument("--all", action="store_true", help="experiments: also the base files others extend")
    lister.add_argument("--plugins", metavar="MODULES", default="", help="comma-separated plugin modules to import")
    return p


LIST_KINDS = ("algorithms", "models", "datasets", "experiments")

_EXAMPLES = {
    "raysim": """examples:
  raysim run experiments/smoke.yaml                       a FedAvg run in under a minute
  raysim run experiments/default.yaml rounds=20 train.lr=0.1
  raysim config keys --algorithm unideal                  every key, its type, default and help
  raysim list algorithms                                  what algorithm.name accepts
  raysim tune experiments/sweeps/smoke-lr.yaml            a Ray Tune sweep
  raysim report runs/a runs/b --out runs/report           tables, t-tests and plots
  python -m raysim ...                                    the same command""",
    "run": """examples:
  raysim run experiments/smoke.yaml
  raysim run experiments/default.yaml rounds=20 train.lr=0.1 log.dir=runs/mine
  raysim run --resume runs/mine                    continue after a crash, Ctrl-C or SIGTERM
  raysim run experiments/smoke.yaml log.dir=runs/mine --overwrite      start runs/mine over
  raysim run experiments/smoke.yaml --seeds 0-4    five seeds, results.md with mean +- std
  raysim run experiments/default.yaml engine.address=auto engine.num_workers=16   on a running cluster""",
    "tune": """examples:
  raysim tune experiments/sweeps/smoke-lr.yaml dir=runs/sweeps/smoke-lr
  raysim tune experiments/sweeps/smoke-lr.yaml num_samples=8 search.name=optuna scheduler.name=hyperband
  raysim tune --resume runs/sweeps/smoke-lr""",
    "report": """examples:
  raysim report runs/smoke-best runs/smoke-local --out runs/smoke-report --target 0.6
  raysim report runs/sweeps/smoke-lr --metric acc_global
  raysim report runs/sweeps/smoke-lr --metric loss          lower is better for loss, bytes, seconds, epsilon
  raysim report runs/robust --metric attack/asr             and an attack's success rate""",
    "config": """examples:
  raysim config show experiments/smoke.yaml rounds=3      the resolved YAML, every key filled in
  raysim config keys                                      common keys (and FedAvg's)
  raysim config keys --algorithm fapd                     plus algorithm.* of FAPD
  raysim config keys --plugins my_models --model tiny     plus a plugin model's model.tiny.* keys""",
    "config show": """examples:
  raysim config show experiments/smoke.yaml               the smoke experiment, every key filled in
  raysim config show smoke rounds=3 train.lr=0.2          a shipped experiment by name, with overrides
  raysim config show algorithm.name=fedprox               the defaults with FedProx (and its algorithm.mu)
  raysim config show runs/mine/config.yaml > mine.yaml    a run's config, to edit and run again""",
    "config keys": """examples:
  raysim config keys                                      common keys (and FedAvg's)
  raysim config keys --algorithm fedprox                  plus FedProx's algorithm.* keys
  raysim config keys | grep '^data\\.'                     only the data.* keys
  raysim config keys --plugins resmlp --model resmlp      plus a plugin model's model.resmlp.* keys""",
    "data": """examples:
  raysim data show smoke                                  the smoke experiment's Dirichlet(0.5) split
  raysim data show smoke data.partition=pathological data.classes_per_client=2
  raysim data show smoke data.partition=shard --out shards.png""",
    "list": """examples:
  raysim list algorithms
  raysim list                                      a summary: how many of each, and a few names
  raysim list experiments                          the shipped configs (raysim run NAME), tagged with what they need
  raysim list experiments fapd/cifar10             only the names containing fapd/cifar10
  raysim list models --plugins my_models""",
}

