"""Which runs are one method in one setting, and what the method and the setting are called (the package's
docstring says how, by ``layout``)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from raysim.errors import UserError
from raysim.report.model import LAYOUTS, Group, Run, hashable, ignored
from raysim.tables import DEFAULT_COLUMNS


def group_runs(runs: list[Run], columns: Sequence[str] = DEFAULT_COLUMNS, layout: str = "auto") -> list[Group]:
    """Group by config minus seed/name/log/engine; label each group's method and setting by ``layout``."""
    return _group_runs(runs, columns, layout)[0]


def _group_runs(runs: list[Run], columns: Sequence[str], layout: str) -> tuple[list[Group], str]:
    if layout not in LAYOUTS:
        raise UserError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    buckets: dict[tuple, list[Run]] = {}
    for run in runs:
        key = tuple(sorted((k, hashable(v)) for k, v in run.config.items() if not ignored(k)))
        buckets.setdefault(key, []).append(run)
    keys = sorted({k for run in runs for k in run.config if not ignored(k)})
    named = [_named_cell(members) for members in buckets.values()]
    if layout == "name" and None in named:
        bad = next(m for m, n in zip(buckets.values(), named) if n is None)[0]
        raise UserError(f"{bad.path}: its config's name {bad.config.get('name')!r} is not '<setting>-<method>' with "
                        f"the method starting at algorithm.name {bad.config.get('algorithm.name')!r} "
                        f"(use the keys layout)")
    if layout != "keys" and None not in named:
        return _label_by_name(list(buckets.values()), named, keys), "name"
    varying = [k for k in keys if len({hashable(b[0].config.get(k)) for b in buckets.values()}) > 1]
    col_keys = [k for k in varying if any(k == c or k.startswith(c) for c in columns)]
    row_keys = [k for k in varying if k not in col_keys]
    # an algorithm's own keys (algorithm.mu) name a method only where they differ between runs of that algorithm:
    # between algorithms, the name already tells them apart
    by_algorithm: dict[str, list[dict]] = {}
    for members in buckets.values():
        by_algorithm.setdefault(hashable(members[0].config.get("algorithm.name")), []).append(members[0].config)
    groups = []
    for members in buckets.values():
        cfg = members[0].config
        peers = by_algorithm[hashable(cfg.get("algorithm.name"))]
        own = [k for k in row_keys if not k.startswith("algorithm.")
               or len({hashable(c.get(k)) for c in peers}) > 1]
        groups.append(Group(method=_method_label(cfg, own), setting=_setting_label(cfg, col_keys),
                            runs=sorted(members, key=_seed_key)))
    return groups, "keys"


def split_name(name: Any, algorithm: Any) -> Optional[tuple[str, str]]:
    """(setting, method) of a config named ``<setting>-<method>`` whose method is ``algorithm`` or starts with
    ``algorithm-`` (the last such place in the name); None when the name is not of that form."""
    name, algorithm = str(name or ""), str(algorithm or "")
    if not algorithm:
        return None
    token = f"-{algorithm}"
    at = name.rfind(token)
    while at > 0:
        end = at + len(token)
        if end == len(name) or name[end] == "-":
            return name[:at], name[at + 1:]
        at = name.rfind(token, 0, at)
    return None


def _named_cell(members: list[Run]) -> Optional[tuple[str, str]]:
    """The group's (setting, method) from its runs' names, if they all name the same one."""
    cells = {split_name(r.config.get("name"), r.config.get("algorithm.name")) for r in members}
    return cells.pop() if len(cells) == 1 and None not in cells else None


def _label_by_name(buckets: list[list[Run]], named: list[tuple[str, str]], keys: list[str]) -> list[Group]:
    """Groups labelled by their names; groups sharing a cell get the keys that tell them apart."""
    groups = []
    for members, (setting, method) in zip(buckets, named):
        clash = [b for b, cell in zip(buckets, named) if cell == (setting, method)]
        if len(clash) > 1:
            differ = [k for k in keys if len({hashable(b[0].config.get(k)) for b in clash}) > 1]
            cfg = members[0].config
            method += " (" + ", ".join(f"{k}={_value(cfg.get(k))}" for k in differ) + ")"
        groups.append(Group(method=method, setting=setting, runs=sorted(members, key=_seed_key)))
    return groups


def _seed_key(run: Run) -> tuple:
    return (str(type(run.seed)), run.seed if run.seed is not None else 0, str(run.path))


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ",".join(map(_value, value)) + "]"
    return str(value)


def _method_label(cfg: dict, row_keys: list[str]) -> str:
    """The algorithm's name and, in brackets, the other keys that tell this group from the others, by their config
    names (``fedavg (asynchronous.concurrency=40, asynchronous.mode=fedbuff)``)."""
    name = _value(cfg.get("algorithm.name", "?"))
    extra = [f"{k}={_value(cfg[k])}" for k in row_keys
             if k != "algorithm.name" and cfg.get(k) is not None]
    return f"{name} ({', '.join(extra)})" if extra else name


def _setting_label(cfg: dict, col_keys: list[str]) -> str:
    named = [k for k in col_keys if cfg.get(k) is not None]  # a key this run's dataset or model does not have
    if not named:
        return _value(cfg.get("data.name", "all"))
    return ", ".join(f"{k}={_value(cfg.get(k))}" for k in named)

