"""A local Ray with two fake GPUs (``ray.init(num_gpus=2)``) and ``CUDA_VISIBLE_DEVICES`` set before it starts, on
a machine where CUDA is unusable; run by tests/engine/test_gpu.py in a process of its own (it needs its own Ray, not
the suite's). Writes its findings as JSON:

- a FAPD run (central training) on CPU workers while this driver process believes CUDA is available and fails on
  any CUDA initialisation: it must complete, with the central job in a worker's process;
- a run whose workers hold 0.5 GPU each: the CLI's one line (the node and CUDA's own cause);
- five workers at 0.4 GPU on the two GPUs: refused before any worker starts, in one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ["rounds=1", "clients.num=4", "data.name=sklearn_digits", "data.partition=iid", "model.name=mlp",
       "model.hidden=[32]", "model.feature_dim=16", "train.batch_size=32", "engine.num_workers=1",
       "log.tensorboard=false", "log.progress=false"]


def cli(args: list[str]) -> tuple[int, str]:
    from raysim.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", *args])
    return code, err.getvalue()


def main(out: Path) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"  # before Ray starts: every process it starts inherits it
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "plugins"), str(ROOT)])
    sys.path.insert(0, str(ROOT / "tests" / "plugins"))
    import torch

    from raysim.config import load_config
    from raysim.engine.resources import init_local_ray
    from raysim.engine.runner import run_experiment

    init_local_ray(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level=logging.WARNING)
    found: dict = {"driver_pid": os.getpid(), "driver_cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    tmp = Path(tempfile.mkdtemp())

    # the driver sees CUDA, and any use of it raises: central training must go to a worker
    def no_cuda(*args, **kwargs):
        raise AssertionError("the driver process initialised CUDA")

    saved = torch.cuda.is_available, torch.cuda._lazy_init, torch.cuda.init
    torch.cuda.is_available, torch.cuda._lazy_init, torch.cuda.init = (lambda: True), no_cuda, no_cuda
    seen: dict = {}
    cfg = load_config(None, RUN + ["plugins=[central_probe]", "algorithm.name=central_probe",
                                   "algorithm.teacher.epochs=1", f"algorithm.teacher.cache_dir={tmp / 'cache'}",
                                   f"log.dir={tmp / 'central'}"])
    try:
        _, rows, _ = run_experiment(cfg, on_start=lambda info: seen.update(workers=info["control"].worker_info()))
        found["central"] = {"rows": rows, "workers": seen["workers"]}
    finally:
        torch.cuda.is_available, torch.cuda._lazy_init, torch.cuda.init = saved

    code, err = cli(RUN + [f"log.dir={tmp / 'share'}", "engine.gpus_per_worker=0.5"])
    found["share"] = {"code": code, "err": err, "run_dir_left": (tmp / "share").exists()}

    code, err = cli(RUN + [f"log.dir={tmp / 'pack'}", "engine.num_workers=5", "engine.gpus_per_worker=0.4",
                           "engine.cpus_per_worker=0.25"])
    found["pack"] = {"code": code, "err": err}
    out.write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
