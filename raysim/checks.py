"""Settings that run but quietly do not mean what they seem: one ``raysim: warning:`` line each on stderr.

``load_config`` calls :func:`warn_config` on every validated config, so ``raysim run``, ``--seeds`` and Tune trials
all show them; the checks are pure functions of the config (:func:`config_warnings`) so tests can call them. The
data's warnings live here; an algorithm declares its own (``Algorithm.config_warnings``).
"""

from __future__ import annotations

from typing import Any


def config_warnings(cfg: Any) -> list[str]:
    """The warnings that ``cfg`` deserves (empty for a config that means what it says)."""
    from raysim.registry import get_algorithm

    out: list[str] = []
    data = cfg.data
    if data.partition == "niid2" and data.clients_per_domain == 1 and data.label_skew == "split":
        out.append("data.partition=niid2 with data.clients_per_domain=1 gives each domain whole to one client, so "
                   "the Dirichlet label redistribution has nobody to redistribute to: this is exactly niid1 "
                   "(raise data.clients_per_domain, or set data.label_skew=subsample)")
    out += get_algorithm(cfg.algorithm.name).config_warnings(cfg)
    return out


def warn_config(cfg: Any) -> None:
    from raysim.runlog import warn_stderr

    for message in config_warnings(cfg):
        warn_stderr(message)
