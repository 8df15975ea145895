"""What Ray this process would use, found without importing Ray (~1 s): a cluster in sight, and how many workers
a config that leaves ``engine.num_workers`` unset gets. Below the config (which resolves the count when it loads)
and the engine (which picks the executor from it, ``raysim.engine.backend``)."""

from __future__ import annotations

import os
import sys
from typing import Any

RAY_WORKERS = 2  # engine.num_workers unset where Ray is wanted (a cluster, GPUs, engine.backend=ray)


def recorded_ray_cluster() -> bool:
    """Whether ``ray start`` recorded a cluster on this machine (the file ``ray.init()`` with no address reads),
    found without importing Ray (~1 s): ``$RAY_TMPDIR``, else ``$TMPDIR``, else /tmp, then ``ray/ray_current_cluster``
    (as ``ray._common.utils.get_ray_address_file``)."""
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or os.path.join(os.sep, "tmp")
    return os.path.isfile(os.path.join(tmp, "ray", "ray_current_cluster"))


def ray_initialized() -> bool:
    """Whether this process already holds a Ray (a notebook's ``ray.init()``, a test session's, a Tune trial's),
    found without importing Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(getattr(ray, "is_initialized", lambda: False)())


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
