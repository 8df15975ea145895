"""Name -> implementation for algorithms, models and datasets.

Each module registers itself with a decorator; the built-in modules are imported lazily on first lookup so that
``import raysim`` stays cheap and a worker imports only what it runs.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from raysim.errors import UserError

_ALGORITHMS: dict[str, type] = {}
_MODELS: dict[str, Callable[..., Any]] = {}
_DATASETS: dict[str, Callable[..., Any]] = {}

_BUILTIN_MODULES = {
    "algorithm": ["raysim.algorithms.fedavg", "raysim.algorithms.local", "raysim.algorithms.partialavg",
                  "raysim.algorithms.unideal", "raysim.algorithms.fedrep", "raysim.algorithms.fapd"],
    "model": ["raysim.models.small", "raysim.models.zoo"],
    "dataset": ["raysim.data.sklearn_sets", "raysim.data.digits", "raysim.data.tabular", "raysim.data.images"],
}
_loaded: set[str] = set()


def _load_builtins(kind: str) -> None:
    if kind in _loaded:
        return
    _loaded.add(kind)
    for module in _BUILTIN_MODULES[kind]:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real missing dependency inside an existing module
                raise


def import_plugins(modules: list[str] | tuple[str, ...]) -> None:
    """Import user modules that register their own algorithms, models or datasets (config key ``plugins``).

    They must be importable on every node (installed, or on PYTHONPATH), since workers look names up too.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UserError(f"config key 'plugins': cannot import {module!r} ({exc})") from None


def register_algorithm(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        cls.name = name
        _ALGORITHMS[name] = cls
        return cls

    return wrap


def register_model(name: str) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable) -> Callable:
        _MODELS[name] = fn
        return fn

    return wrap


def register_dataset(name: str) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable) -> Callable:
        _DATASETS[name] = fn
        return fn

    return wrap


def _get(table: dict, kind: str, key: str, name: str) -> Any:
    _load_builtins(kind)
    if name not in table:
        raise UserError(f"config key '{key}': unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def get_algorithm(name: str) -> type:
    return _get(_ALGORITHMS, "algorithm", "algorithm.name", name)


def get_model(name: str) -> Callable[..., Any]:
    return _get(_MODELS, "model", "model.name", name)


def get_dataset(name: str) -> Callable[..., Any]:
    return _get(_DATASETS, "dataset", "data.name", name)


def names(kind: str) -> list[str]:
    _load_builtins(kind)
    return sorted({"algorithm": _ALGORITHMS, "model": _MODELS, "dataset": _DATASETS}[kind])
