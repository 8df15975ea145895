"""The system model's files (``system.csv``, ``system.capacity``, ``system.availability.trace``): reading CSV rows
and FedScale's pickles, every mistake one line naming the config key and the file. A pickle is read by
:class:`_RestrictedUnpickler`, which builds plain dicts, lists and numbers only and refuses any class or function
it names, so nothing in it runs."""

from __future__ import annotations

import csv
import json
import math
import pickle
from pathlib import Path

import numpy as np

from raysim.config import ConfigError


def _fail(key: str, path: str, why: str) -> ConfigError:
    return ConfigError(f"config key '{key}': {path}: {why}")


def _read_rows(key: str, path: str, header: tuple[str, ...]) -> list[list[str]]:
    """The data rows of a CSV whose first row is ``header`` (cells stripped)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise _fail(key, path, "no such file")
    try:
        with open(file, newline="") as fh:
            rows = [[cell.strip() for cell in row] for row in csv.reader(fh) if row and any(c.strip() for c in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _fail(key, path, f"cannot be read as CSV ({exc})") from None
    if not rows or tuple(c.lower() for c in rows[0]) != header:
        raise _fail(key, path, f"the first row must be the header {','.join(header)}")
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise _fail(key, path, f"line {i} has {len(row)} fields, the header {len(header)}")
    return rows[1:]


def _number(key: str, path: str, line: int, name: str, text: str, *, whole: bool = False) -> float:
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        raise _fail(key, path, f"line {line}: {name} must be a {'whole number' if whole else 'number'}, "
                               f"got {text!r}") from None
    if not math.isfinite(value):
        raise _fail(key, path, f"line {line}: {name} must be finite, got {text!r}")
    return value


def _client_id(key: str, path: str, line: int, value: object, num_clients: int) -> int:
    if isinstance(value, str):
        value = _number(key, path, line, "client_id", value, whole=True)
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 <= int(value) < num_clients:
        where = f"line {line}: " if line else ""
        raise _fail(key, path, f"{where}client id {value!r} is not a client of this federation (ids 0 to "
                               f"{num_clients - 1})")
    return int(value)


class _RestrictedUnpickler(pickle.Unpickler):
    """A FedScale trace is plain dicts, lists and numbers: anything else in the pickle is refused, never built."""

    def find_class(self, module: str, name: str) -> type:
        raise pickle.UnpicklingError(f"it names {module}.{name}, while a trace holds only dicts, lists and numbers")


def _read_pickle_or_json(key: str, path: str, what: str) -> object:
    """FedScale's trace at ``path``: JSON where the name ends in .json, else a pickle read by
    :class:`_RestrictedUnpickler`; a file that is neither is one line: ``path`` is not ``what``."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise _fail(key, path, "no such file")
    try:
        if path.lower().endswith(".json"):
            return json.loads(file.read_text())
        with open(file, "rb") as fh:
            return _RestrictedUnpickler(fh).load()
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _fail(key, path, f"is not {what}: {first}") from None
