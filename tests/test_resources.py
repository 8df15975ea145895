"""How raysim starts a local Ray: what it asks ray.init for, with and without a state memory budget."""

from __future__ import annotations

import ray

from raysim.config import load_config
from raysim.engine import resources


def _init_kwargs(monkeypatch, overrides: list[str]) -> dict:
    seen: dict = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    with resources.ray_session(load_config(None, overrides).engine) as started:
        assert started
    return seen


def test_state_budget_sizes_the_store_and_sends_every_return_to_it(monkeypatch):
    kw = _init_kwargs(monkeypatch, ["engine.state_memory_gb=0.5"])
    assert kw["object_store_memory"] == 512 * 1024**2
    # small client states must not stay inline in the driver's heap, where Ray never spills them
    assert kw["_system_config"]["max_direct_call_object_size"] == 0
    assert kw["_node_ip_address"] == "127.0.0.1"


def test_without_a_budget_small_returns_stay_inline_and_the_shared_config_is_untouched(monkeypatch):
    kw = _init_kwargs(monkeypatch, [])
    assert "object_store_memory" not in kw and "max_direct_call_object_size" not in kw["_system_config"]
    kw["_system_config"]["written_by_ray"] = 1  # ray.init writes into the dict it is given
    assert "written_by_ray" not in resources.LOCAL_SYSTEM_CONFIG
    assert kw["_system_config"]["preload_python_modules"] == ["torch", "raysim.engine.worker"]
    assert resources.local_ray_options()["_system_config"] is not resources.local_ray_options()["_system_config"]


def test_a_cluster_address_gets_no_local_settings(monkeypatch):
    kw = _init_kwargs(monkeypatch, ["engine.address=ray://head:10001", "engine.state_memory_gb=0.5"])
    assert kw["address"] == "ray://head:10001"
    assert "_system_config" not in kw and "object_store_memory" not in kw
