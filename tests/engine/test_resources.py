"""How raysim starts a local Ray: what it asks ray.init for, with and without a state memory budget."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import ray

from raysim.config import load_config
from raysim.engine import resources


def _init_kwargs(monkeypatch, overrides: list[str]) -> dict:
    seen: dict = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # no running cluster to join (raysim.engine.connect)
    monkeypatch.setenv("RAY_TMPDIR", str(Path(__file__).parent / "no-ray-here"))
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


def _family(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(
                    int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    out, todo = {pid}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state that these processes hold (from /proc, no tools)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in (Path("/proc") / str(pid) / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    out = []
    for table in ("tcp", "tcp6"):
        for line in (Path("/proc/net") / table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                hexaddr = fields[1].split(":")[0]
                raw = bytes.fromhex(hexaddr)
                if len(raw) == 4:
                    out.append(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:  # /proc prints IPv6 as four little-endian 32-bit words
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    out.append(socket.inet_ntop(socket.AF_INET6, words))
    return out


def test_a_local_ray_stays_on_loopback(ray_cluster):
    """The session's Ray is started as raysim starts one: node address, process arguments and listening sockets."""
    from ray._private import ray_constants

    assert [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]] == ["127.0.0.1"]
    assert ray_constants.ENABLE_RAY_CLUSTER, "the flag is restored once the node has started"
    family = _family(os.getpid())
    args = []
    for pid in family:
        try:
            args += (Path("/proc") / str(pid) / "cmdline").read_text().split("\0")
        except OSError:
            continue
    node_ips = {a.split("=", 1)[1] for a in args if a.startswith(("--node-ip-address=", "--node_ip_address="))}
    assert node_ips == {"127.0.0.1"}
    listening = _listening(family)
    assert len(listening) >= 3  # GCS, raylet, this driver, the workers
    assert all(a in ("127.0.0.1", "::ffff:127.0.0.1") for a in listening), listening


def _engine(workers: int, gpus: float, cpus: float = 1.0):
    return load_config(None, [f"engine.num_workers={workers}", f"engine.gpus_per_worker={gpus}",
                              f"engine.cpus_per_worker={cpus}"]).engine


def test_gpu_shares_are_packed_gpu_by_gpu_and_node_by_node():
    """Totals are not enough: a fractional share sits on one GPU and a worker's CPUs on one node (issue 30: five
    workers at 0.4 GPU on two GPUs pass a totals check, 2.0 <= 2, but Ray places only four)."""
    from raysim.engine.resources import check_resources, workers_on_node
    from raysim.errors import UserError

    two_gpus = {"CPU": 16.0, "GPU": 2.0}
    assert workers_on_node(_engine(1, 0.4), two_gpus) == 4 and workers_on_node(_engine(1, 0.25), two_gpus) == 8
    assert workers_on_node(_engine(1, 1 / 3), two_gpus) == 6 and workers_on_node(_engine(1, 2), two_gpus) == 1
    assert workers_on_node(_engine(1, 0.125, cpus=4), two_gpus) == 4  # the CPUs bind first
    with pytest.raises(UserError, match=r"^config key 'engine.gpus_per_worker': 5 workers x 0.4 GPU do not fit: a "
                                        r"share must sit on one GPU, so each GPU takes 2, and the nodes "
                                        r"\(CPU 16 GPU 2\) take 4; ask for fewer workers"):
        check_resources(_engine(5, 0.4), total=two_gpus, nodes=[two_gpus])
    check_resources(_engine(4, 0.4), total=two_gpus, nodes=[two_gpus])
    # two one-GPU nodes: 3 x 0.5 GPU fit (2 + 1); 3 x 0.6 GPU do not (1 + 1), though 1.8 <= 2
    one_gpu = [{"CPU": 4.0, "GPU": 1.0}] * 2
    check_resources(_engine(3, 0.5), total={"CPU": 8.0, "GPU": 2.0}, nodes=one_gpu)
    with pytest.raises(UserError, match=r"3 workers x 0.6 GPU do not fit: .* each GPU takes 1, .*"
                                        r"\(CPU 4 GPU 1, CPU 4 GPU 1\) take 2;"):
        check_resources(_engine(3, 0.6), total={"CPU": 8.0, "GPU": 2.0}, nodes=one_gpu)
    # whole CPUs per node: 3 x 2 CPU on two 3-CPU nodes (6 <= 6 in all, 2 <= 3 per node) place only two
    with pytest.raises(UserError, match=r"^config key 'engine.num_workers': 3 workers x 2 CPU do not fit: a worker's "
                                        r"CPUs must sit on one node, and the nodes \(CPU 3, CPU 3\) take 2$"):
        check_resources(_engine(3, 0, cpus=2), total={"CPU": 6.0}, nodes=[{"CPU": 3.0}] * 2)


def test_sigterm_stack_dumps_of_workers_are_dropped_and_a_crash_dump_is_kept():
    """Ray ends worker processes with SIGTERM and each prints its C++ handler's dump, which Ray forwards to the
    terminal: those lines go, the rest of the workers' output (a crash's dump included) stays."""
    lines = ["round 1 done",
             "*** SIGTERM received at time=1796144218 on cpu 0 ***",
             "PC: @     0x7f92050a3f16  (unknown)  (unknown)",
             "    @     0x7f920505a050  (unknown)  (unknown)",
             "[2026-12-01 16:42:26,753 E 14414 14414] logging.cc:474: *** SIGTERM received at time=1796143346 ***",
             "[2026-12-01 16:42:26,753 E 14414 14414] logging.cc:474: PC: @     0x7f92050a3f16  (unknown)",
             "[2026-12-01 16:42:26,753 E 14414 14414] logging.cc:474:     @     0x7f920505a050  (unknown)",
             "a hook's print",
             "*** SIGSEGV received at time=1796143347 on cpu 1 ***",
             "PC: @     0x7f92050a3f16  (unknown)  (unknown)"]
    assert resources._without_sigterm_dumps(lines) == ["round 1 done", "a hook's print", *lines[-2:]]


@pytest.mark.slow
def test_a_private_ray_ends_with_its_autoscaler_monitor_killed_and_nothing_left(cli_env):
    """``ray_session`` ends a Ray it started with ``end_private_ray``: the monitor (which waits a second on its
    SIGTERM) is killed outright, Ray is shut down, and none of the session's processes outlives it."""
    import subprocess
    import sys

    script = """
import os, ray
from raysim.config import load_config
from raysim.engine.resources import ray_session
with ray_session(load_config(None, ["engine.num_workers=1"]).engine) as started:
    node = ray._private.worker._global_node
    pids = [i.process.pid for infos in node.all_processes.values() for i in infos]
    monitor = node.all_processes["monitor"][0].process
print(started, ray.is_initialized(), monitor.returncode, *pids)
"""
    done = subprocess.run([sys.executable, "-c", script], env=cli_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    started, initialized, monitor_code, *pids = done.stdout.split()
    assert (started, initialized, monitor_code) == ("True", "False", "-9")  # -9: ended by SIGKILL
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists() and
            "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]
    assert pids and not left
