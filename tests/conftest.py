"""Shared fixtures: one local 2-CPU Ray for the whole session (ray.init takes ~4.5 s), torn down here only.

The helpers tests share (TINY, tiny_overrides, read_rows, strip_timing, refused_config) live in ``helpers.py``;
they are re-exported here, so ``from conftest import ...`` keeps working."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from helpers import (EXAMPLE_PLUGINS, ROOT, TINY, read_rows, refused_config, strip_timing,  # noqa: F401
                     tiny_overrides)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from raysim.engine.resources import init_local_ray

    # workers inherit the environment of the Ray that this process starts: let them import tests/plugins
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests" / "plugins"), str(EXAMPLE_PLUGINS),
                                                            os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(ROOT / "tests" / "plugins"))
    sys.path.insert(0, str(EXAMPLE_PLUGINS))
    init_local_ray(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def unideal_run(ray_cluster, tmp_path_factory) -> Path:
    """One tiny UNIDEAL run for the tests that only read what a run leaves behind (TensorBoard layout, p,
    client_metrics.jsonl, t-SNE): two rounds, evaluation in the second only, TensorBoard on."""
    import raysim

    d = tmp_path_factory.mktemp("unideal")
    return raysim.run(None, *tiny_overrides(d, algorithm__name="unideal", eval__every=2)).run_dir


def pytest_collection_modifyitems(config, items):
    """A test on the session's Ray runs whole experiments (seconds each): it is ``slow``, which ``make test-fast``
    skips. Tests that are slow for another reason (a subprocess, a sweep) carry ``@pytest.mark.slow`` themselves."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
