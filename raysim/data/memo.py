"""Built federations kept in this process: a process that runs several runs (a Tune trial process reused across
trials, a seed set's process, a notebook calling ``raysim.run`` again) builds each dataset once per config.

Only datasets that are a function of the config alone are kept: raysim's own builders that read no file of the
user's (scikit-learn's bundled tables, FedProx's synthetic data). Those that read ``data.root`` are rebuilt every
run, from raysim's on-disk cache, which is keyed by their files' sizes and times (``raysim.data.cache``); so are
datasets that plugins register (they may read anything). The key is everything such a builder reads: the ``data``
section, ``seed`` and ``clients.num``, and the builder itself. Every run gets a private deep copy, so what a run or
an algorithm's ``prepare_data`` changes in its data (FAPD attaches its teacher's features) never reaches the next
run: a kept dataset gives the numbers a fresh build gives.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

# raysim's builders whose data depends on the config alone (no file under data.root, no download)
PURE_DATASETS = ("sklearn_digits", "breast_cancer", "wine", "digits_table", "synthetic")
MAX_BYTES = 1 << 30  # what the kept datasets may hold in all (a larger one is not kept)
MAX_ENTRIES = 4

_kept: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # key -> (the built data, its array bytes), newest last
stats = {"built": 0, "reused": 0}  # for tests and benchmarks: builds done and builds saved in this process


def memo_key(cfg: ExperimentConfig, builder: Callable) -> Optional[str]:
    """The key a built dataset is kept under, or None when it is not kept (a plugin's builder, or one that reads
    the user's files)."""
    from raysim.config import flatten_dict

    if cfg.data.name not in PURE_DATASETS or not getattr(builder, "__module__", "").startswith("raysim.data"):
        return None
    return json.dumps({"data": flatten_dict(cfg.data), "seed": cfg.seed, "clients.num": cfg.clients.num,
                       "builder": f"{builder.__module__}.{builder.__qualname__}"}, sort_keys=True, default=str)


def built_once(cfg: ExperimentConfig, builder: Callable, build: Callable[[], Any]) -> Any:
    """``build()``'s result for ``cfg``, built once per process and key; each caller gets its own copy."""
    key = memo_key(cfg, builder)
    if key is None:
        stats["built"] += 1
        return build()
    if key in _kept:
        _kept.move_to_end(key)
        stats["reused"] += 1
        return copy.deepcopy(_kept[key][0])
    data = build()
    stats["built"] += 1
    size = _array_bytes(data)
    if size <= MAX_BYTES:
        _kept[key] = (copy.deepcopy(data), size)
        while len(_kept) > MAX_ENTRIES or sum(n for _, n in _kept.values()) > MAX_BYTES:
            _kept.popitem(last=False)
    return data


def forget() -> None:
    """Drop every kept dataset (their memory goes back)."""
    _kept.clear()


def _array_bytes(obj: Any, seen: Optional[set[int]] = None) -> int:
    """The bytes of the numpy arrays reachable through ``obj``'s attributes, lists and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_array_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_array_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return _array_bytes(vars(obj), seen)
    return 0
