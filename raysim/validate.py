"""The one convention every config check follows, and the value tests they share; torch-free and free of the rest
of raysim, so that every section's module (``raysim.config``, the subsystems' ``raysim.sections.*``, the algorithms'
configs) can import it without an import circle.

A check is ``require(ok, key, why)``: unless ``ok``, a :class:`ConfigError` whose one line is
``config key 'KEY': WHY``; the commands print it and exit 2.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from raysim.errors import UserError

FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: torch scales float32 tensors by values up to this


class ConfigError(UserError):
    """A config key is unknown, mistyped or holds an impossible value."""


def require(ok: bool, key: str, why: str) -> None:
    """Refuse a config value: ``config key 'KEY': WHY`` unless ``ok`` (every config class's validate uses this)."""
    if not ok:
        raise ConfigError(f"config key '{key}': {why}")


def is_whole(value: Any, low: int = 0) -> bool:
    """An integer (not a bool) >= ``low``: what a count in a config must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_finite(value: Any, low: float = float("-inf"), *, strict: bool = False) -> bool:
    """A finite number (not NaN, not a bool) >= ``low`` (> ``low`` with ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > low if strict else value >= low


def one_of(value: Any, key: str, choices: Iterable[Any]) -> None:
    """Refuse ``value`` unless it is one of ``choices``, listing them."""
    choices = tuple(choices)
    require(value in choices, key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")


NAME_MAX, PATH_MAX = 255, 4096  # bytes in one path component and in a whole path (Linux's limits; most file systems)


def path_too_long(path: str, *, suffix: int = 0) -> str:
    """Why ``path`` cannot be a path on this machine (a component longer than NAME_MAX bytes, ``suffix`` bytes
    still to be added to its last one, or a whole longer than PATH_MAX), or "" when it can."""
    import os

    parts = [p for p in str(path).split(os.sep) if p]
    for i, part in enumerate(parts):
        size = len(os.fsencode(part)) + (suffix if i == len(parts) - 1 else 0)
        if size > NAME_MAX:
            what = f"with the {suffix}-byte suffix added, " if suffix and i == len(parts) - 1 else ""
            return (f"a path component of {size} bytes ({what}{part[:24]}...): file systems take at most "
                    f"{NAME_MAX}")
    if len(os.fsencode(str(path))) + suffix > PATH_MAX:
        return f"a path of {len(os.fsencode(str(path))) + suffix} bytes: file systems take at most {PATH_MAX}"
    return ""
