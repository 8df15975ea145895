"""The two executors: the same jobs in this process (``engine.backend=inline``) and on Ray actors give the same
numbers, bit for bit, for every built-in algorithm; in-process, a ``breakpoint()`` in a hook stops in the user's
terminal; wrong backends are one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLE_PLUGINS, ROOT, read_rows, refused_config, strip_timing, tiny_overrides
from raysim.config import load_config
from raysim.engine.backend import choose_backend
from raysim.engine.runner import run_experiment
from raysim.registry import builtin_names

# what each built-in algorithm needs on top of the tiny experiment to run small (and exercise its own parts)
ALGORITHM_TINY: dict[str, dict] = {
    "fapd": {"algorithm__teacher__epochs": 3, "algorithm__k0": 2, "algorithm__delta_k": 3},
    "fedbn": {"model__name": "cnn_bn", "model__width": 4},  # batch norm to keep local
    "fedcda": {"algorithm__memory_size": 2, "algorithm__warmup_rounds": 1},
    "fedpcl": {"algorithm__pretrain__epochs": 2, "algorithm__proj_dim": 8, "data__server_holdout": 0.1},
    "fedprox": {"algorithm__mu": 0.1},
    "moon": {"algorithm__out_dim": 16},
}


def _tiny(tmp_path: Path, algorithm: str, backend: str) -> list[dict]:
    extra = {**ALGORITHM_TINY.get(algorithm, {}), "algorithm__name": algorithm, "engine__backend": backend,
             "clients__fraction": 0.75, "data__partition": "dirichlet", "rounds": 2}
    caches = {"fapd": "algorithm__teacher__cache_dir", "fedpcl": "algorithm__pretrain__cache_dir"}
    if algorithm in caches:  # its central training's cache, private to this test (both backends share it)
        extra[caches[algorithm]] = str(tmp_path / "cache")
    cfg = load_config(None, tiny_overrides(tmp_path / backend, **extra))
    run_dir, _, _ = run_experiment(cfg)
    return strip_timing(read_rows(run_dir))


def test_the_tiny_algorithm_table_names_only_built_ins():
    assert set(ALGORITHM_TINY) <= set(builtin_names("algorithm"))


# algorithms whose own test already runs them on two Ray workers, one of them killed mid-job, against one run in this
# process (helpers.killed_worker_matches_inline): a stronger form of the check below, so not repeated here
KILLED_ON_RAY = {"fedavg": "engine/test_faults.py", "moon": "algorithms/test_moon.py",
                 "fedproto": "algorithms/test_fedproto.py", "scaffold": "algorithms/test_scaffold.py",
                 "fedadam": "algorithms/test_fedopt.py", "ditto": "algorithms/test_ditto.py",
                 "feddyn": "algorithms/test_feddyn.py", "fedbn": "algorithms/test_fedbn.py"}


def test_the_algorithms_left_out_below_are_killed_on_ray_against_this_process():
    for algorithm, path in KILLED_ON_RAY.items():
        text = (ROOT / "tests" / path).read_text()
        assert "killed_worker_matches_inline(" in text and (algorithm == "fedavg" or f'"{algorithm}"' in text), path


@pytest.mark.parametrize("algorithm", [a for a in builtin_names("algorithm") if a not in KILLED_ON_RAY])
def test_inline_and_ray_give_identical_metrics(ray_cluster, tmp_path, algorithm):
    """Every other built-in algorithm, one worker on Ray against this process: every metric of every round equal."""
    inline = _tiny(tmp_path, algorithm, "inline")
    on_ray = _tiny(tmp_path, algorithm, "ray")
    assert len(inline) == 2 and inline == on_ray
    assert inline[-1]["acc_mean"] is not None


def test_auto_backend_is_inline_for_one_cpu_worker_without_a_cluster(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no `ray start` cluster recorded here
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # no Ray initialised in this process

    def backend(*overrides: str) -> str:
        return choose_backend(load_config(None, list(overrides)).engine)

    assert backend("engine.num_workers=1") == "inline"
    assert backend("engine.num_workers=1", "engine.address=local") == "inline"
    assert backend("engine.num_workers=2") == "ray"
    assert backend("engine.num_workers=1", "engine.gpus_per_worker=0.5") == "ray"
    assert backend("engine.num_workers=1", "engine.state_memory_gb=1") == "ray"
    assert backend("engine.num_workers=1", "engine.address=auto") == "ray"
    assert backend("engine.num_workers=2", "engine.backend=inline") == "inline"  # asked for: in-process, in turn
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6379")
    assert backend("engine.num_workers=1") == "ray"  # a `ray start` cluster on this machine: join it
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert backend("engine.num_workers=1") == "ray"


def test_unset_workers_are_one_in_process_on_one_machine_and_ray_where_ray_is_wanted(monkeypatch, tmp_path):
    """engine.num_workers left unset: one worker, in this process, on a machine with no Ray cluster or GPU in sight
    (no Ray start for a small run); 2 Ray workers when a cluster is in sight, a GPU share or Ray is asked for. The
    choice and its reason stay with the config for the console line."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "ray", raising=False)

    def engine(*overrides: str):
        return load_config(None, list(overrides)).engine

    alone = engine()
    assert alone.num_workers == 1 and choose_backend(alone) == "inline" and "no Ray cluster" in alone.workers_chosen
    assert engine("engine.backend=ray").num_workers == 2
    assert engine("engine.gpus_per_worker=0.5").num_workers == 2
    assert engine("engine.address=auto").num_workers == 2
    assert engine("engine.num_workers=3").num_workers == 3 and not hasattr(engine("engine.num_workers=3"),
                                                                           "workers_chosen")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert engine().num_workers == 2 and choose_backend(engine()) == "ray"


def test_bad_backends_are_one_line(tmp_path):
    refused_config("engine.backend", *tiny_overrides(tmp_path), "engine.backend=rayy")
    line = refused_config("engine.backend", *tiny_overrides(tmp_path), "engine.backend=inline",
                          "engine.address=10.0.0.1:6379")
    assert "cannot use the cluster" in line
    refused_config("engine.backend", *tiny_overrides(tmp_path), "engine.backend=inline", "engine.state_memory_gb=1")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_inline_with_several_workers_runs_in_this_process_with_the_same_numbers(tmp_path):
    """engine.num_workers does not change an in-process run: the jobs run one after another, with the numbers of
    a one-worker run."""
    one = load_config(None, tiny_overrides(tmp_path / "one", engine__backend="inline"))
    three = load_config(None, tiny_overrides(tmp_path / "three", engine__backend="inline", engine__num_workers=3))
    assert strip_timing(run_experiment(one)[1]) == strip_timing(run_experiment(three)[1])


def test_a_hook_breakpoint_stops_in_the_users_terminal(tmp_path):
    """``breakpoint()`` in a plugin's hook, run in-process: pdb reads the user's commands from stdin, sees the
    hook's own frame (its ``ctx``), and the run goes on to the end when told to continue."""
    plugin = tmp_path / "stopping.py"
    plugin.write_text(
        "from raysim import Algorithm, register_algorithm\n\n"
        "@register_algorithm('stopping')\n"
        "class Stopping(Algorithm):\n"
        "    def client_loss(self, model, x, y, ctx):\n"
        "        if ctx.client_id == 2 and ctx.round == 2 and 'stopped' not in ctx.scratch:\n"
        "            ctx.scratch['stopped'] = True\n"
        "            breakpoint()\n"
        "        return super().client_loss(model, x, y, ctx)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLE_PLUGINS)]),
           "PYTHONBREAKPOINT": "pdb.set_trace"}
    env.pop("RAY_ADDRESS", None)
    args = [sys.executable, "-m", "raysim", "run", *tiny_overrides(tmp_path), "plugins=[stopping]",
            "algorithm.name=stopping", "engine.backend=inline", "--quiet"]
    done = subprocess.run(args, input="p ('seen', ctx.client_id, ctx.round, len(y))\nw\nc\n", text=True,
                          capture_output=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "(Pdb)" in done.stdout
    assert "('seen', 2, 2, " in done.stdout  # the hook's own frame: its ctx and batch
    assert "stopping.py" in done.stdout and "client_loss" in done.stdout  # `w`: the user's frame on the stack
    assert len(read_rows(tmp_path / "run")) == 2  # continued: the run finished


class _AliasingUpload:
    """An algorithm whose client_upload hands out the worker model's own tensors (detached, not copied)."""

    @staticmethod
    def client_upload(model, ctx):
        return {k: v.detach() for k, v in model.state_dict().items()}


def test_an_in_process_call_copies_an_upload_only_where_something_else_may_hold_it(tmp_path):
    """The base client_upload's clones leave an in-process call as they are (a second copy of each held upload was
    FedBuff's largest cost beside training); an upload an algorithm builds itself is copied, so the next job's
    reset of the worker's model changes nothing the driver holds."""
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.engine.executor import InlineExecutor
    from raysim.engine.jobs import TrainCall, TrainJob
    from raysim.registry import get_algorithm

    cfg = load_config(None, tiny_overrides(tmp_path, clients__num=4))
    data = build_federated_data(cfg)
    for algorithm_type, private in ((get_algorithm("fedavg"), True),
                                    (type("Aliasing", (_AliasingUpload, get_algorithm("fedavg")), {}), False)):
        executor = InlineExecutor(cfg)
        executor.jobs = ClientJobs(cfg, data, algorithm=algorithm_type(cfg))
        alg = executor.jobs.algorithm
        model = executor.jobs.model(0)
        payload = executor.put(alg.server_payload(alg.init_server_state(model.state_dict()), 1))
        call = TrainCall(jobs=[TrainJob(client_id=c, round=1, payload_ref=payload) for c in (0, 1)], states=[None] * 2)
        told: list[tuple[int, object]] = []
        (result, _), = executor.run([call], lambda index, value, told=told: told.append((index, value)))
        assert told == [(0, result)]  # on_result: each call as it ends
        first = result.results[0]
        assert first.private is private
        kept = {k: v.clone() for k, v in first.upload.items()}
        worker_model = executor.jobs.model(0)  # the next job's reset, in place
        live = {p.untyped_storage().data_ptr() for p in worker_model.state_dict().values()}
        assert not live & {t.untyped_storage().data_ptr() for t in first.upload.values()}
        assert all(torch.equal(first.upload[k], kept[k]) for k in kept)
        assert not all(torch.equal(first.upload[k], v) for k, v in worker_model.state_dict().items())
