"""Benchmark-only plugin for benchmarks/profile_round.py: times, in every process that imports it, a training
call's parts (training its clients, summing its groups, and, on a worker, handing the results to Ray), and appends
them to ``$RAYSIM_PROFILE_DIR/<pid>.jsonl``. Imported through a config's ``plugins``, so workers load it too."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import raysim.algorithms.aggregation as aggregation
import raysim.engine.core as core
import raysim.engine.worker as worker

OUT = os.environ.get("RAYSIM_PROFILE_DIR")


def _note(kind: str, **values: float) -> None:
    if OUT:
        with open(Path(OUT) / f"{os.getpid()}.jsonl", "a") as fh:
            fh.write(json.dumps({"kind": kind, "t": time.time(), **values}) + "\n")


_train, _sum, _run = core.ClientJobs.train, aggregation.UploadSum.add_results, worker.ClientWorker.run


def _timed_train(self, *args, **kwargs):
    start = time.perf_counter()
    try:
        return _train(self, *args, **kwargs)
    finally:
        _note("train", s=time.perf_counter() - start)


def _timed_sum(self, results, weighting="samples"):
    start = time.perf_counter()
    try:
        return _sum(self, results, weighting)
    finally:
        _note("sum", s=time.perf_counter() - start)


def _timed_run(self, call, *values):
    start = time.perf_counter()
    out = _run(self, call, *values)
    _note("call", s=time.perf_counter() - start, clients=len(getattr(call, "jobs", [])), start=start)
    return out


if not getattr(core.ClientJobs.train, "_profiled", False):
    _timed_train._profiled = True
    core.ClientJobs.train = _timed_train
    aggregation.UploadSum.add_results = _timed_sum  # what run_call calls
    worker.ClientWorker.run = _timed_run
