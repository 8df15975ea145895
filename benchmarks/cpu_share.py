"""Which processes a raysim run's CPU goes to: CPU seconds of every process on the machine between the end of round 2
and the end of round R-1 of ``raysim run`` on one of pfl.py's workloads, grouped by kind (Ray's workers, the
driver, raylet, GCS, log monitor, dashboard, ...), with the run's share of the machine (issue 35's profile of the
CNN on Ray).

    .venv/bin/python benchmarks/cpu_share.py [--workload cnn] [--engine ray2] [--rounds 7] [--set KEY=VALUE ...]

Each process's user + system time is read from /proc/PID/stat at every round line the run prints; processes that
started or ended in between count from zero or up to their last reading. Linux only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import ROOT  # noqa: E402
from pfl import RAYSIM_ENGINES, overrides, settings  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
KINDS = ("ray::ClientWorker", "ray::IDLE", "raylet", "gcs_server", "log_monitor", "dashboard", "runtime_env",
         "monitor.py", "raysim run")


def processes() -> dict[int, tuple[float, str]]:
    """pid -> (CPU seconds so far, command line) of every process readable now."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[int(pid)] = ((int(fields[11]) + int(fields[12])) / TICK, cmd)
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine so far (/proc/stat)."""
    values = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    return (sum(values) - values[3] - values[4]) / TICK, sum(values) / TICK


def kind(cmd: str) -> str:
    return next((k for k in KINDS if k in cmd), cmd[:48] or "(unnamed)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="cnn")
    p.add_argument("--engine", default="ray2", choices=sorted(RAYSIM_ENGINES))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    if args.rounds < 4:
        raise SystemExit("cpu_share.py: --rounds must be at least 4 (rounds 3..R-1 are measured)")
    s = settings(args.workload, SimpleNamespace(rounds=args.rounds, clients=None, cohort=None))
    run_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"cpu-share-{os.getpid()}"
    cli = [*overrides(args.workload, s), *RAYSIM_ENGINES[args.engine], *args.set, f"log.dir={run_dir}",
           "engine.address=local"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "raysim"), "run", *cli], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    marks = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if re.match(r"^round\s+\d+/\d+", line):
            marks.append((time.perf_counter(), processes(), machine_cpu()))
    if proc.wait() != 0 or len(marks) < args.rounds:
        raise SystemExit(f"cpu_share.py: raysim run exited {proc.returncode} after {len(marks)} rounds")
    (t0, before, (busy0, all0)), (t1, after, (busy1, all1)) = marks[1], marks[-2]
    wall, groups = t1 - t0, {}
    for pid, (cpu, cmd) in after.items():
        spent = cpu - before.get(pid, (0.0, ""))[0]
        if spent > 0.005:
            groups[kind(cmd)] = groups.get(kind(cmd), 0.0) + spent
    print(f"{args.workload} on {args.engine}, rounds 3..{args.rounds - 1}: {wall:.2f} s wall; the machine was busy "
          f"{busy1 - busy0:.2f} of {all1 - all0:.2f} CPU seconds")
    for name, spent in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {spent:7.2f} CPU s  {spent / wall * 100:6.1f} % of a core  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
