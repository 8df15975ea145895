"""Settings that run but quietly do not mean what they seem: one ``raysim: warning:`` line each on stderr (and
settings that only run slower than they might: one ``raysim: note:`` line each).

``load_config`` calls :func:`warn_config` on every validated config, so ``raysim run``, ``--seeds`` and Tune trials
all show them; the checks are pure functions of the config (:func:`config_warnings`) so tests can call them. The
data's warnings live here; an algorithm declares its own (``Algorithm.config_warnings``).
"""

from __future__ import annotations

from typing import Any


def config_warnings(cfg: Any) -> list[str]:
    """The warnings that ``cfg`` deserves (empty for a config that means what it says)."""
    from raysim.registry import loaded_algorithm

    out: list[str] = []
    data = cfg.data
    if data.partition == "niid2" and data.clients_per_domain == 1 and data.label_skew == "split":
        out.append("data.partition=niid2 with data.clients_per_domain=1 gives each domain whole to one client, so "
                   "the Dirichlet label redistribution has nobody to redistribute to: this is exactly niid1 "
                   "(raise data.clients_per_domain, or set data.label_skew=subsample)")
    algorithm = loaded_algorithm(cfg.algorithm.name)  # a built-in not imported yet: its Config's warnings are its own
    out += algorithm.config_warnings(cfg) if algorithm is not None else cfg.algorithm.config_warnings(cfg)
    out += vectorize_notices(cfg)
    from raysim.sections.robust import robust_notices

    out += robust_notices(cfg)
    from raysim.sections.privacy import privacy_notices

    out += privacy_notices(cfg)
    return out


def vectorize_notices(cfg: Any) -> list[str]:
    """``engine.vectorize=N`` where some clients will train one at a time anyway (they fall back: nothing is
    refused), one line per reason. Nothing for ``off`` and ``auto`` (auto stacks clients where it can and pays)."""
    from raysim.capabilities import refusal
    from raysim.registry import get_model

    setting = str(cfg.engine.vectorize)
    if not setting.isdigit() or int(setting) < 2:
        return []
    out = []
    head = f"engine.vectorize={setting}:"
    if refusal(cfg.algorithm.name, "stack") is not None:  # the declaration (a setting says its own)
        out.append(f"{head} algorithm {cfg.algorithm.name} declares no vectorisable client hooks "
                   f"(Algorithm.vectorizable), so its clients train one at a time")
    names = sorted(set(cfg.model.names()))
    per_client = [n for n in names if getattr(get_model(n), "per_client", False)]
    if per_client:
        out.append(f"{head} model {per_client[0]} gives every client its own architecture (HETE), so its clients "
                   f"train one at a time")
    elif len(names) > 1:
        out.append(f"{head} clients of different architectures ({', '.join(names)}) are never stacked together: "
                   f"each stack trains one batched computation per architecture")
    return out


def config_notes(cfg: Any) -> list[str]:
    """Of :func:`config_warnings`, those that only say how fast a setting runs, not what it means (clients trained
    one at a time, uploads not summed where the clients trained): printed as ``raysim: note:``, not as warnings."""
    from raysim.sections.robust import robust_notices

    return vectorize_notices(cfg) + robust_notices(cfg)


def warn_config(cfg: Any) -> None:
    import sys

    from raysim.runlog import warn_stderr

    notes = config_notes(cfg)
    for message in config_warnings(cfg):
        if message in notes:
            print(f"raysim: note: {message}", file=sys.stderr, flush=True)
        else:
            warn_stderr(message)
