"""Data building: seconds to build the Digits domains from scratch and to split 60,000 labels over many clients.

    .venv/bin/python benchmarks/data_build.py [--repeats 3] [--no-wait]

These were wall-clock assertions in the tests (``< 60 s`` for the three domains, ``< 5 s`` for the Dirichlet split);
on a shared machine a time is a measurement, not a pass/fail, so it lives here with the targets beside it.
``dirichlet_60k_1000_clients`` is raysim's own split (now ``data.partition=legacy_dirichlet``);
``flower_dirichlet_60k_100_clients`` is Flower Datasets' DirichletPartitioner (``data.partition=dirichlet``) at
alpha 0.5 over 100 clients, imports included and no cache (its redraws rarely meet 10 samples a client at alpha 0.1
with 1,000 clients), and ``flower_iid_60k_1000_clients`` its IidPartitioner.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import fmt, machine_info, save_json, summary, wait_quiet  # noqa: E402

TARGETS_S = {"digits_three_domains": 60.0, "dirichlet_60k_1000_clients": 5.0,
             "flower_dirichlet_60k_100_clients": None, "flower_iid_60k_1000_clients": None}


def digits_three_domains() -> float:
    """MNIST (the embedded 5k sample), MNIST-M and SynthDigits at full size, with an empty cache."""
    from raysim.config import load_config
    from raysim.data import digits

    with tempfile.TemporaryDirectory() as cache:
        cfg = load_config(None, ["data.name=digits", "data.samples_per_domain=null", f"data.cache_dir={cache}"])
        start = time.perf_counter()
        for name in digits.DOMAINS:
            digits.load_domain(name, cfg)
        return time.perf_counter() - start


def dirichlet_60k_1000_clients() -> float:
    """A Dirichlet(0.1) label split of 60,000 samples in 10 classes over 1,000 clients."""
    import numpy as np

    from raysim.data.partition import dirichlet_partition

    labels = np.random.default_rng(0).integers(0, 10, size=60_000)
    start = time.perf_counter()
    dirichlet_partition(labels, 1000, 0.1, 10, np.random.default_rng(1))
    return time.perf_counter() - start


def _flower(partition: str, clients: int) -> float:
    """A Flower Datasets split of 60,000 labels in a fresh process (its imports counted), with an empty cache."""
    import subprocess

    code = ("import tempfile, time; t = time.perf_counter(); import numpy as np\n"
            "from raysim.config import load_config\nfrom raysim.data.flower import flower_partition\n"
            "labels = np.random.default_rng(0).integers(0, 10, size=60_000)\n"
            "with tempfile.TemporaryDirectory() as cache:\n"
            f"    cfg = load_config(None, ['data.partition={partition}', 'clients.num={clients}', 'data.alpha=0.5', "
            "'data.cache_dir=' + cache])\n"
            f"    flower_partition(labels, {clients}, cfg)\n"
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def flower_dirichlet_60k_100_clients() -> float:
    return _flower("dirichlet", 100)


def flower_iid_60k_1000_clients() -> float:
    return _flower("iid", 1000)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-wait", action="store_true")
    args = p.parse_args(argv)
    result: dict = {"machine": machine_info(), "targets_s": TARGETS_S}
    for bench in (digits_three_domains, dirichlet_60k_1000_clients, flower_dirichlet_60k_100_clients,
                  flower_iid_60k_1000_clients):
        result["load_before_" + bench.__name__] = wait_quiet(enabled=not args.no_wait)
        result[bench.__name__] = [bench() for _ in range(args.repeats)]
    path = save_json("data_build", result)
    print(f"[data_build] results in {path}")
    for name, target in TARGETS_S.items():
        print(f"{name}: {fmt(summary(result[name]), 1, 2)} s" + (f" (target < {target:g} s)" if target else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
