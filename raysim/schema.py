"""Every config key with its type, default and one-line help, read from the schema dataclasses themselves.

A key's help is its field's ``metadata["help"]`` if set, else the comment that ends the field's line in the class
body (``lr: float = 0.05  # local learning rate``), else a comment line right above it. ``raysim config keys`` prints
this table; a test checks that every built-in key has a help text.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import tokenize
import typing
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class KeyInfo:
    key: str
    type: str
    default: Any
    help: str


@functools.lru_cache(maxsize=None)
def _comments(cls: type) -> dict[str, str]:
    """Field name -> its trailing comment (or the comment lines just above it) in ``cls``'s own source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    line_field: dict[int, str] = {}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        # a field: NAME ':' at the class body's indentation (col 4 after the class line)
        if (tok.type == tokenize.NAME and tok.start[1] == 4 and i + 1 < len(tokens)
                and tokens[i + 1].string == ":" and tokens[i + 1].start[0] == tok.start[0]):
            line_field[tok.start[0]] = tok.string
            if above:
                out.setdefault(tok.string, " ".join(above))
            above = []
        elif tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if tok.start[0] in line_field:
                out[line_field[tok.start[0]]] = text  # a trailing comment wins over lines above
            elif tok.start[1] == 4:
                above.append(text)
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            if tok.start[0] not in line_field:
                above = []
    return out


def field_help(cls: type, f: dataclasses.Field) -> str:
    if f.metadata.get("help"):
        return str(f.metadata["help"])
    for klass in cls.__mro__:  # the class that declares the field (subclasses inherit fields)
        if dataclasses.is_dataclass(klass) and f.name in getattr(klass, "__annotations__", {}):
            text = _comments(klass).get(f.name)
            if text:
                return text
    return ""


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        names = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(names) + (" | null" if type(None) in args else "")
    if origin in (list, tuple, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]" if args else origin.__name__
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field, instance: Any) -> Any:
    return getattr(instance, f.name)


def describe(node: Any, prefix: str = "") -> list[KeyInfo]:
    """Walk a config dataclass instance; sections recurse, their own keys are listed with their values as defaults."""
    out: list[KeyInfo] = []
    cls = type(node)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(node):
        value = _default(f, node)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.extend(describe(value, key + "."))
            continue
        out.append(KeyInfo(key=key, type=f.metadata.get("type") or type_name(hints.get(f.name, Any)), default=value,
                           help=field_help(cls, f)))
    return out


def config_keys(algorithm: Optional[str] = None, models: tuple[str, ...] = (), dataset: Optional[str] = None,
                plugins: tuple[str, ...] = ()) -> list[KeyInfo]:
    """Every key of an experiment config: the common ones, ``algorithm.*`` of the chosen algorithm (default
    fedavg), and the sections that the named plugin models / dataset declare."""
    from raysim.config import load_config

    overrides = []
    if plugins:
        overrides.append(f"plugins=[{','.join(plugins)}]")
    if algorithm:
        overrides.append(f"algorithm.name={algorithm}")
    if models:
        overrides.append(f"model.name={models[0]}" if len(models) == 1 else f"model.name=[{','.join(models)}]")
    if dataset:
        overrides.append(f"data.name={dataset}")
    cfg = load_config(None, overrides, validate=False)
    return describe(cfg)


def format_keys(keys: list[KeyInfo]) -> str:
    import json

    def show(v: Any) -> str:
        return "null" if v is None else json.dumps(v) if isinstance(v, (list, dict, str)) else str(v).lower() \
            if isinstance(v, bool) else str(v)

    rows = [(k.key, k.type, show(k.default), k.help) for k in keys]
    w = [max(len(r[i]) for r in rows + [("key", "type", "default", "")]) for i in range(3)]
    lines = [f"{'key':<{w[0]}}  {'type':<{w[1]}}  {'default':<{w[2]}}  help"]
    lines += [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows]
    return "\n".join(lines)
