"""Shared fixtures: one local 2-CPU Ray for the whole session (ray.init takes ~4.5 s), torn down here only.

The helpers tests share (TINY, tiny_overrides, read_rows, strip_timing, refused_config) live in ``helpers.py``;
they are re-exported here, so ``from conftest import ...`` keeps working."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from helpers import (EXAMPLE_PLUGINS, ROOT, TEST_PLUGINS, TINY, context, crash_after, kill_group_once,  # noqa: F401
                     killed_worker_matches_inline, launch_cli, read_rows, refused_config, strip_timing, tiny_overrides,
                     wandb_history)

# the test plugins (tests/plugins) and the examples' import in this process, where in-process runs use them
for _folder in (str(TEST_PLUGINS), str(EXAMPLE_PLUGINS)):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's Ray: 2 CPUs and no GPU, whatever the machine has (the GPU fail-fast tests need none)."""
    import ray

    from raysim.engine.pool import warm_workers
    from raysim.engine.resources import init_local_ray

    # workers inherit the environment of the Ray that this process starts: let them import tests/plugins
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TEST_PLUGINS), str(EXAMPLE_PLUGINS),
                                                            os.environ.get("PYTHONPATH")]))
    init_local_ray(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level=logging.WARNING)
    with warm_workers():  # runs hand their workers on to the next run (each new worker process imports torch)
        yield ray
    ray.shutdown()


@pytest.fixture
def cli_env():
    """The environment for a ``raysim`` subprocess: unbuffered, the test plugins importable, no RAY_ADDRESS, and a
    Ray temp directory of its own, so that a run that starts Ray starts its own instead of joining a cluster that
    `ray start` recorded on this machine (the tests always start their own). Removed afterwards."""
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONUNBUFFERED="1", RAY_TMPDIR=temp,
               PYTHONPATH=os.pathsep.join(filter(None, [str(TEST_PLUGINS), os.environ.get("PYTHONPATH")])))
    yield env
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def unideal_run(tmp_path_factory) -> Path:
    """One tiny UNIDEAL run for the tests that only read what a run leaves behind (TensorBoard layout, p,
    client_metrics.jsonl, t-SNE): two rounds, evaluation in the second only, TensorBoard on."""
    import raysim

    d = tmp_path_factory.mktemp("unideal")
    return raysim.run(None, *tiny_overrides(d, algorithm__name="unideal", eval__every=2)).run_dir


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """``shared_run(**extra)``: the run of ``tiny_overrides(..., **extra)`` as (run_dir, rows), made once per session.

    For tests that only read an undisturbed run (a reference for a killed, resumed or other-worker-count run, or a
    run's files): an equal config asked for by several tests, in any file, runs once. In this process, like every
    tiny run (a test that asks for ``engine__backend="ray"`` also asks for ``ray_cluster``). Never change the run
    directory: copy it first."""
    import json

    from raysim.config import load_config, to_flat_dict
    from raysim.engine.runner import run_experiment

    made: dict[str, Path] = {}

    def get(**extra: object) -> tuple[Path, list[dict]]:
        flat = to_flat_dict(load_config(None, tiny_overrides(Path("."), **extra)))
        key = json.dumps({k: v for k, v in flat.items() if k != "log.dir"}, sort_keys=True, default=str)
        if key not in made:
            d = tmp_path_factory.mktemp("shared")
            made[key] = run_experiment(load_config(None, tiny_overrides(d, **extra)))[0]
        return made[key], read_rows(made[key])

    return get


def pytest_collection_modifyitems(config, items):
    """A test on the session's Ray runs whole experiments (seconds each): it is ``slow``, which ``make test-fast``
    skips. Tests that are slow for another reason (a subprocess, a sweep) carry ``@pytest.mark.slow`` themselves."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    # longest first: `make test`'s --dist loadfile hands whole files to its workers in this order, so that the two
    # end together instead of one finishing a long file alone. LONGEST: the files over 25 s, longest first (seconds
    # in a `make test` at 2 workers, 2026-12-03); then the files with the most slow tests; the rest in their order.
    slow: dict[str, int] = {}
    for item in items:
        slow[item.nodeid.split("::")[0]] = slow.get(item.nodeid.split("::")[0], 0) + \
            (item.get_closest_marker("slow") is not None)
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: (rank.get(item.nodeid.split("::")[0], len(rank)), -slow[item.nodeid.split("::")[0]]))


LONGEST = ("tests/test_crash_safety.py",  # 147 s
           "tests/test_preemption.py",  # 112
           "tests/engine/test_multinode.py",  # 87
           "tests/engine/test_faults.py",  # 41
           "tests/tune/test_running.py",  # 41
           "tests/tune/test_search.py",  # 37
           "tests/engine/test_stack.py",  # 34
           "tests/tune/test_study.py",  # 32
           "tests/engine/test_state.py")  # 29
