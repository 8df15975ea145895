"""Shared helpers for the benchmark scripts: machine facts, quiet-machine gate, statistics, process memory, Ray.

Benchmarks measure wall time on a shared 2-core machine, so every measured batch first waits for the 1-minute
load average to drop (``wait_quiet``) and records the load it ran under; figures are min/median/max of repeats.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
OUT = BENCH / "out"  # git-ignored: run directories and JSON results
VENV_PY = ROOT / ".venv" / "bin" / "python"


# ---------------------------------------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    """What a reader needs to compare figures: cores, memory, CPU model, versions, date."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    info: dict[str, Any] = {"nproc": os.cpu_count(), "mem_gib": round(mem_kb / 1024**2, 1), "cpu": cpu,
                            "python": platform.python_version(),
                            "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    for mod in ("torch", "ray", "numpy"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing module is just not reported
            pass
    return info


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(threshold: float = 2.5, max_wait_s: float = 1800.0, poll_s: float = 30.0,
               enabled: bool = True) -> float:
    """Wait until the 1-minute load is below ``threshold`` (at most ``max_wait_s``); return the load then.

    Other jobs may share the machine; a figure taken under load says more about them than about raysim.
    """
    if not enabled:
        return loadavg()
    deadline = time.monotonic() + max_wait_s
    while True:
        load = loadavg()
        if load < threshold or time.monotonic() >= deadline:
            return load
        print(f"[bench] load {load:.2f} >= {threshold}; waiting (at most {max_wait_s / 60:.0f} min in all)", flush=True)
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------------------- statistics
def summary(values: Iterable[float]) -> dict[str, float]:
    vals = sorted(float(v) for v in values)
    if not vals:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan"), "n": 0}
    return {"min": vals[0], "median": statistics.median(vals), "max": vals[-1], "n": len(vals)}


def fmt(s: dict[str, float], scale: float = 1.0, digits: int = 3) -> str:
    """``median (min–max)`` of a summary, scaled (e.g. 1e3 for ms)."""
    return (f"{s['median'] * scale:.{digits}f} ({s['min'] * scale:.{digits}f}–{s['max'] * scale:.{digits}f})")


def save_json(name: str, payload: dict) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


# ---------------------------------------------------------------------------------------------------- processes
def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def vm_hwm_mib(pid: int) -> float:
    """Peak resident set size of a live process (VmHWM), MiB."""
    return _status_kb(pid, "VmHWM") / 1024


def rss_mib(pid: int) -> float:
    return _status_kb(pid, "VmRSS") / 1024


def pss_mib(pid: int) -> float:
    """Proportional set size: shared pages (torch's libraries, plasma) split between their users, so a sum over
    processes counts each page once."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (a local Ray's gcs, raylet and workers are children of the script)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def find_actor_pids(name: str, root: Optional[int] = None) -> list[int]:
    """Pids of this script's Ray actors whose process title starts with ``ray::<name>`` (Ray renames them)."""
    root = os.getpid() if root is None else root
    return [p for p in descendants(root) if cmdline(p).startswith(f"ray::{name}")]


# ---------------------------------------------------------------------------------------------------- Ray
def start_ray(num_cpus: int = 2, object_store_gb: Optional[float] = None, extra_pythonpath: Iterable[str] = ()) -> None:
    """A local Ray exactly as ``raysim run`` starts it (prestarted workers with torch preloaded), once per script.

    ``extra_pythonpath`` is exported before ``ray.init`` so workers can import benchmark-only plugins.
    """
    from raysim.engine.resources import init_local_ray

    paths = [str(p) for p in extra_pythonpath]
    if paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
        sys.path[:0] = paths
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    init_local_ray(object_store_gb, num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)


def run_cli(args: list[str], env: Optional[dict] = None, marker: Optional[str] = None,
            cwd: Optional[Path] = None) -> dict[str, Any]:
    """Launch ``raysim run ARGS`` as a subprocess; seconds from launch to the end of round 1 (the first line
    containing ``marker``; by default round 1's console line, ``round  1/R`` padded for R >= 10), to the end of
    every round (``round_ends_s``, as each round's line arrives) and to exit. ``cwd`` (default: the repository) is
    also where Ray workers import from."""
    if not any(a.startswith("engine.address=") for a in args):  # its own Ray, whatever else runs on the machine
        args = [*args, "engine.address=local"]
    cmd = [str(ROOT / ".venv" / "bin" / "raysim"), "run", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    first = float("nan")
    round_ends: list[float] = []
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - t0
        lines.append(line)
        if _ROUND_LINE.match(line):
            round_ends.append(now)
        if first != first and (_ROUND_ONE.match(line) if marker is None else marker in line):
            first = now
    rc = proc.wait()
    total = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"raysim run exited {rc}:\n{''.join(lines[-20:])}")
    return {"round1_s": first, "total_s": total, "round_ends_s": round_ends}


_ROUND_LINE = re.compile(r"^round\s+\d+/\d+")  # raysim.runlog.format_round's line, one per round
_ROUND_ONE = re.compile(r"^round\s+1/\d+")


def ensure_venv(venv: Path, packages: list[str], probe_code: str, tag: str) -> str:
    """Build a peer's own virtual environment once (its pins clash with raysim's); return what ``probe_code`` prints
    there (the peer's version)."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", probe_code]
    if python.exists():
        done = subprocess.run(probe, capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    print(f"[{tag}] building {venv} (first use; pip install {' '.join(packages)})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
