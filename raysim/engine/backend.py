"""Which executor a run gets, and how many workers when the config leaves it open: decided from the config and
what is in sight of this process, before anything slow starts (no Ray import). The numbers never depend on it."""

from __future__ import annotations

import os
import sys
from typing import Any

BACKENDS = ("auto", "ray", "inline")
RAY_WORKERS = 2  # engine.num_workers unset where Ray is wanted (a cluster, GPUs, engine.backend=ray)


def recorded_ray_cluster() -> bool:
    """Whether ``ray start`` recorded a cluster on this machine (the file ``ray.init()`` with no address reads),
    found without importing Ray (~1 s): ``$RAY_TMPDIR``, else ``$TMPDIR``, else /tmp, then ``ray/ray_current_cluster``
    (as ``ray._common.utils.get_ray_address_file``)."""
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or os.path.join(os.sep, "tmp")
    return os.path.isfile(os.path.join(tmp, "ray", "ray_current_cluster"))


def cluster_in_sight(engine: Any) -> bool:
    """A Ray cluster this run would join: ``engine.address`` other than null or ``local``, or (null) a
    ``RAY_ADDRESS`` or a cluster that ``ray start`` recorded."""
    if engine.address not in (None, "local"):
        return True
    return engine.address is None and bool(os.environ.get("RAY_ADDRESS") or recorded_ray_cluster())


def default_workers(engine: Any) -> tuple[int, str]:
    """``engine.num_workers`` when the config leaves it unset (null), and why: Ray's workers where Ray is wanted
    (a cluster in sight, a GPU share, ``engine.backend=ray``, an object-store budget), else one worker in this
    process, the fastest path on one machine for the runs Ray's start (~5 s here) cannot pay for, with the same
    numbers (the executor never changes a number)."""
    if cluster_in_sight(engine):
        return RAY_WORKERS, "a Ray cluster is in sight"
    if engine.gpus_per_worker > 0:
        return RAY_WORKERS, "GPU shares run on Ray workers"
    if engine.backend == "ray" or engine.state_memory_gb is not None:
        return RAY_WORKERS, "engine.backend=ray" if engine.backend == "ray" else "engine.state_memory_gb budgets Ray"
    return 1, "no Ray cluster or GPU in sight, so in process without Ray's start"


def choose_backend(engine: Any) -> str:
    """``engine.backend`` resolved: ``ray`` or ``inline``.

    ``auto`` is ``inline`` for a run that Ray would give nothing: one worker (``engine.num_workers=1``, or unset on
    one machine), no GPU share, no object-store budget (``engine.state_memory_gb``), and no Ray cluster in sight
    (``engine.address`` null or ``local``, no ``RAY_ADDRESS``, no cluster recorded by ``ray start``, no Ray already
    initialised in this process, such as a notebook's own ``ray.init()`` or a test session's). Everything else is
    ``ray``."""
    if engine.backend != "auto":
        return engine.backend
    if (engine.num_workers or 1) > 1 or engine.gpus_per_worker > 0 or engine.state_memory_gb is not None:
        return "ray"
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return "ray"
    return "ray" if cluster_in_sight(engine) else "inline"
