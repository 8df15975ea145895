"""Which executor a run gets, and whether it starts a Ray of its own: decided from the config and what is in sight
of this process (``raysim.raysight``), before anything slow starts (no Ray import). The numbers never depend on
it."""

from __future__ import annotations

from typing import Any

from raysim.raysight import cluster_in_sight, ray_initialized


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
    return "ray" if ray_initialized() or cluster_in_sight(engine) else "inline"


def starts_local_ray(engine: Any) -> bool:
    """Whether the run would start a Ray of its own on this machine: it runs on Ray, with no cluster in sight to
    join and no Ray this process already holds (what costs Ray's start, and what a local machine must hold)."""
    return choose_backend(engine) == "ray" and not (cluster_in_sight(engine) or ray_initialized())
