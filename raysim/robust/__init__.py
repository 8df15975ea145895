"""Byzantine-robust aggregation and attacks: the ``aggregator`` and ``attack`` config sections
(:mod:`raysim.sections.robust`), the aggregation rules (:mod:`raysim.robust.aggregators`) and the attacks
(:mod:`raysim.robust.attacks`), as functions of the round's updates; they take part in the round as two stages
(``raysim.stages``): :mod:`raysim.robust.attack_stage` and :mod:`raysim.robust.rule_stage`, on the round's rows
(:mod:`raysim.robust.rows`).

The rules and attacks are public, for reuse outside a run: each takes the round's updates as the rows of one
``(n, d)`` float64 tensor (``from raysim.robust import geometric_median, min_max``; docs/robust.md lists them).
They are loaded on first use, so that reading a config (:mod:`raysim.sections.robust`) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "raysim.robust.aggregators": (
        "median", "trimmed_mean", "krum_scores", "krum", "multikrum", "bulyan", "norm_bound", "centered_clip",
        "geometric_median", "nearest_neighbor_mixing", "bucketing", "fltrust", "foolsgold_weights", "foolsgold",
        "aggregate"),
    "raysim.robust.attacks": (
        "malicious_clients", "flip_labels", "add_trigger", "dba_bars", "add_bars", "sign_flip", "gaussian", "scaling",
        "scaling_boosts", "alie_z", "alie", "ipm", "min_max", "min_sum", "fang_trim", "fang_krum", "mimic_direction",
        "mimic_target", "poison_updates"),
}
__all__ = sorted(name for names in _PUBLIC.values() for name in names)


def __getattr__(name: str) -> Any:
    for module, names in _PUBLIC.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'raysim.robust' has no attribute {name!r}")
