"""Wall time of the quick commands (`raysim config show`, `config keys`, `list`, `--help`) and of `raysim run`'s config
errors (a bad value, an unknown key, an unknown algorithm: exit 2 before anything slow), and whether they import torch.

    .venv/bin/python benchmarks/cli_latency.py [--repeats 5] [--source DIR] [--only errors|quick]

Each command runs as a fresh ``python -m raysim.cli ...`` subprocess (what a user's shell pays: the interpreter's
start included); the figure is the median (min-max) of the repeats, with the median CPU time (user + system) beside
it: on a loaded machine the wall time waits for a core, the CPU time much less. One more run with ``-X importtime``
says which heavy packages it imported. ``--source`` times another checkout
(its folder goes first on PYTHONPATH), for a before/after pair with the same interpreter.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["config", "show"], ["config", "show", "smoke", "algorithm.name=unideal"], ["config", "keys"],
            ["config", "keys", "--algorithm", "fapd"], ["list"], ["--help"])
# `raysim run` with a config error: each must fail (exit 2) before the engine, which imports torch, is imported
ERRORS = (["run", "smoke", "rounds=abc"], ["run", "smoke", "trian.lr=0.1"], ["run", "smoke", "algorithm.name=fedavgg"],
          # refusals that depend on an algorithm's declarations (answered from raysim.capabilities)
          ["run", "smoke", "algorithm.name=fedbn", "asynchronous.mode=fedbuff"],
          ["run", "smoke", "algorithm.name=fedcda", "privacy.enabled=true", "privacy.noise_multiplier=1"])
HEAVY = ("torch", "ray", "torchvision")  # what a command that only reads configs should never import


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(args: list[str], source: Path, repeats: int,
                 expect: int = 0) -> tuple[list[float], list[float], set[str]]:
    """Wall and CPU seconds per run of ``raysim ARGS``, and the heavy top-level packages it imported; each run must
    exit with ``expect``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    times, cpu, heavy = [], [], set()
    for i in range(repeats + 1):
        flags = ["-X", "importtime"] if i == repeats else []  # the last run only: importtime costs time itself
        t0, c0 = time.perf_counter(), _children_cpu()
        proc = subprocess.run([sys.executable, *flags, "-m", "raysim.cli", *args], cwd=source, env=env,
                              capture_output=True, text=True)  # cwd: `-m` puts it first on sys.path
        if not flags:
            times.append(time.perf_counter() - t0)
            cpu.append(_children_cpu() - c0)
        if proc.returncode != expect:
            raise RuntimeError(f"raysim {' '.join(args)} exited {proc.returncode}, not {expect}: {proc.stderr[-500:]}")
        for line in proc.stderr.splitlines() if flags else ():  # "import time: self | cumulative | <indent>module"
            if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() in HEAVY:
                heavy.add(line.rsplit("|", 1)[-1].strip())
    return times, cpu, heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout to time (default: this one)")
    parser.add_argument("--only", choices=("quick", "errors"), help="only the quick commands, or only the errors")
    args = parser.parse_args()
    print(f"source {args.source.resolve()}, {args.repeats} runs each, load average {os.getloadavg()[0]:.1f}")
    todo = ([(c, 0) for c in COMMANDS] if args.only != "errors" else []) + \
        ([(c, 2) for c in ERRORS] if args.only != "quick" else [])
    for command, expect in todo:
        times, cpu, heavy = time_command(command, args.source.resolve(), args.repeats, expect)
        print(f"raysim {' '.join(command):<45} {statistics.median(times):6.2f} s ({min(times):.2f}-{max(times):.2f}), "
              f"CPU {statistics.median(cpu):.2f} s  imports: {', '.join(sorted(heavy)) or 'no torch, no ray'}"
              f"{'  (exit 2)' if expect else ''}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
