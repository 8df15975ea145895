"""A run's placement-group layout, in one place for the runner (driver), the pool (workers) and Tune (trials).

Bundle 0 holds the driver (and a Tune trial's own process); then one bundle per worker. With ``driver_cpus = 0``
the head bundle is empty and Tune leaves it out of the group: the driver then sits, using nothing, in the first
worker's bundle, so workers always take the group's last ``num_workers`` bundles.
"""

from __future__ import annotations

from typing import Any

DRIVER_BUNDLE = 0


def run_bundles(engine: Any) -> list[dict[str, float]]:
    """The bundles a whole run asks for: the driver's, then one per worker (what a Tune trial reserves)."""
    head = {"CPU": float(engine.driver_cpus)} if engine.driver_cpus else {}
    worker = {"CPU": float(engine.cpus_per_worker)}
    if engine.gpus_per_worker:
        worker["GPU"] = float(engine.gpus_per_worker)
    return [head] + [dict(worker) for _ in range(engine.num_workers)]


def worker_bundle(engine: Any, placement_group: Any, index: int) -> int:
    """Worker ``index``'s bundle: counted from the end, since Tune drops an empty head bundle."""
    return placement_group.bundle_count - engine.num_workers + index


def in_bundle(placement_group: Any, bundle: int) -> dict[str, Any]:
    """Actor options that place it in ``bundle`` of ``placement_group``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=placement_group,
                                                                    placement_group_bundle_index=bundle)}
