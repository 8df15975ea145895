"""The verbs that look before anything runs: ``raysim config``, ``raysim data show``, ``raysim list``."""

from __future__ import annotations

import argparse
from pathlib import Path

from raysim.cli.common import _plugins, _split_config_and_overrides
from raysim.cli.parser import LIST_KINDS
from raysim.errors import UserError


def _cmd_config(args: argparse.Namespace) -> int:
    from raysim.config import load_config, to_yaml

    if args.config_command == "show":
        config, overrides = _split_config_and_overrides(args)
        print(to_yaml(load_config(config, overrides)), end="")
        return 0
    from raysim.schema import config_keys, format_keys

    print(format_keys(config_keys(args.algorithm, tuple(args.model), args.dataset, _plugins(args.plugins))))
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from raysim.config import load_config
    from raysim.data.show import show

    if args.clients < 1:
        raise UserError("--clients must be >= 1")
    config, overrides = _split_config_and_overrides(args)
    cfg = load_config(config, overrides)
    table, png = show(cfg, Path(args.out) if args.out else None, clients=args.clients)
    print(table)
    print(f"raysim: heat map of label counts per client: {png}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from raysim.catalog import describe_experiments, matches
    from raysim.registry import describe, import_plugins

    import_plugins(list(_plugins(args.plugins)))
    if args.kind is None:
        print(_list_summary())
        return 0
    if args.kind == "experiments":
        rows = describe_experiments(args.pattern, bases=args.all)
    else:
        rows = [(n, d) for n, d in describe(args.kind[:-1]) if matches(n, args.pattern)]
    if not rows:
        raise UserError(f"no {args.kind} match {args.pattern!r}; `raysim list {args.kind}` lists them all")
    print(_two_columns(rows))
    return 0


def _list_summary() -> str:
    """``raysim list``: each kind with its count, a few names, and the command that lists it."""
    from raysim.catalog import TAG_CPU, TAG_GPU, TAG_ROOT, describe_experiments
    from raysim.registry import describe

    lines = []
    for kind in LIST_KINDS[:3]:
        found = [n for n, _ in describe(kind[:-1])]
        lines.append(f"{kind:<12} {len(found):>3}  {', '.join(found[:6])}{', ...' if len(found) > 6 else ''}  "
                     f"(raysim list {kind})")
    rows = describe_experiments()
    runs = [d for n, d in rows if not n.startswith("sweeps/")]
    count = {tag: sum(tag in d.split("]", 1)[0] for d in runs) for tag in (TAG_CPU, TAG_ROOT, TAG_GPU)}
    lines.append(f"{'experiments':<12} {len(runs):>3}  {count[TAG_CPU]} with embedded data on CPU, "
                 f"{count[TAG_ROOT]} needing data.root, {count[TAG_GPU]} needing a GPU; {len(rows) - len(runs)} "
                 f"sweeps  (raysim list experiments [PATTERN])")
    return "\n".join(lines)


def _two_columns(rows: list[tuple[str, str]]) -> str:
    """Names, and their descriptions wrapped to the terminal's width under a hanging indent (never cut)."""
    import shutil
    import textwrap

    width = max(len(name) for name, _ in rows)
    text_width = max(40, shutil.get_terminal_size((120, 24)).columns - width - 2)
    lines = []
    for name, doc in rows:
        wrapped = textwrap.wrap(doc, text_width) or [""]
        lines.append(f"{name:<{width}}  {wrapped[0]}")
        lines.extend(" " * (width + 2) + more for more in wrapped[1:])
    return "\n".join(lines)

