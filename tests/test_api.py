"""The Python API as a notebook uses it, and ``python -m raysim``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import raysim
from conftest import EXAMPLE_PLUGINS, ROOT, TINY, strip_timing, tiny_overrides


def _env() -> dict:
    """This checkout only: not the plugin folders the test session's Ray puts on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_python_m_raysim_version():
    out = subprocess.run([sys.executable, "-m", "raysim", "--version"], capture_output=True, text=True, env=_env(),
                         cwd=ROOT, check=True, timeout=60)
    assert out.stdout.strip() == f"raysim {raysim.__version__}"
    # the venv's console script, beside its python (the algorithms' bad-config checks call the CLI in-process)
    script = str(Path(sys.executable).with_name("raysim"))
    out = subprocess.run([script, "--version"], capture_output=True, text=True, env=_env(), cwd=ROOT, check=True,
                         timeout=60)
    assert out.stdout.strip() == f"raysim {raysim.__version__}"


def test_public_names_importable():
    from raysim import Algorithm, register_algorithm, register_dataset, register_model  # noqa: F401

    assert Algorithm.__name__ == "Algorithm" and callable(raysim.run) and callable(raysim.load_run)


@pytest.mark.slow
def test_notebook_runs_join_a_cluster_that_gets_their_plugins_and_share_one_session(tmp_path):
    """A fresh process (a notebook kernel) with a Ray cluster running beside it (a head of its own processes, as
    `ray start --head` makes). The first run joins it through raysim's own start-up (engine.address), on Ray; its
    plugin model is importable only from the notebook's sys.path, so the cluster's workers get it only through the
    runtime environment raysim joins with. The second run reuses the session; Ray stays up."""
    import tempfile

    code = textwrap.dedent(f"""
        import json, sys, ray, raysim
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 2}})
        sys.path.insert(0, {str(EXAMPLE_PLUGINS)!r})
        tiny = {TINY!r}
        tiny["plugins"] = ["resmlp"]
        tiny["engine"] = {{"num_workers": 1, "backend": "ray"}}  # one worker would run in-process by default
        tiny["model"] = {{"name": "resmlp", "feature_dim": 16, "resmlp": {{"width": 16, "blocks": 1}}}}
        tiny["engine"]["backend"] = "ray"
        a = raysim.run(tiny, "rounds=1", "log.dir={tmp_path / 'a'}", f"engine.address={{cluster.address}}",
                       progress=True)
        node = ray.get_runtime_context().get_node_id()
        b = raysim.run(a.config, "log.dir={tmp_path / 'b'}", "train.lr=0.05")
        print(json.dumps({{"joined": node == cluster.head_node.node_id, "up": ray.is_initialized(),
                          "same": ray.get_runtime_context().get_node_id() == node,
                          "a": [str(a.run_dir), list(a.metrics["round"]), a.config.rounds],
                          "b": [str(b.run_dir), b.config.train.lr, len(b.metrics)]}}))
        ray.shutdown()
        cluster.shutdown()
    """)
    # the cluster's files (and the address record `ray start` leaves) away from /tmp/ray, where other runs look
    env = {**_env(), "RAY_TMPDIR": tempfile.mkdtemp(prefix="rj", dir="/tmp")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    got = json.loads(lines[-1])
    assert got["joined"] and got["same"] and got["up"]
    assert got["a"] == [str(tmp_path / "a"), [1], 1]
    assert got["b"] == [str(tmp_path / "b"), 0.05, 1]
    # progress=True: tqdm's bar on stderr (rounds done of rounds, the latest acc_mean), not a hand-drawn line
    assert "1/1" in out.stderr and "round" in out.stderr and "acc_mean=" in out.stderr


def test_run_returns_metrics_frame_and_load_run_reads_it_back(tmp_path):
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    result = raysim.run(None, *tiny_overrides(tmp_path))
    assert result.run_dir == tmp_path / "run" and not result.stopped
    assert list(result.metrics["round"]) == [1, 2]
    assert {"acc_mean", "loss", "bytes_up", "wall_s"} <= set(result.metrics.columns)
    # the frame holds what the run computed: the rows the same config gives in memory (metrics are deterministic)
    _, rows, _ = run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "again"))))
    frame = [{k: v for k, v in r.items() if not k.startswith("wall_s") and v == v}  # v == v: drop NaN cells
             for r in result.metrics.to_dict("records")]
    assert frame == strip_timing(rows)
    again = raysim.load_run(result.run_dir)
    assert again.config == result.config and again.config.log.dir == str(tmp_path / "run")
    assert again.metrics.equals(result.metrics)
    assert "rounds=2/2" in repr(again)


def test_run_resumes_an_interrupted_run(tmp_path):
    """``raysim.run(None, resume=RUN_DIR)``: the run's own config, continued to the metrics of an undisturbed run."""
    from raysim.config import load_config
    from raysim.engine.runner import run_experiment

    whole = raysim.run(None, *tiny_overrides(tmp_path, log__dir=str(tmp_path / "whole"), rounds=3))

    class Crash(Exception):
        pass

    def crash_after_two(metrics: dict) -> None:
        if metrics["round"] == 2:
            raise Crash()

    with pytest.raises(Crash):
        run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), rounds=3)),
                       on_round=crash_after_two)
    assert raysim.load_run(tmp_path / "part").stopped
    resumed = raysim.run(None, resume=tmp_path / "part")
    assert resumed.run_dir == tmp_path / "part" and resumed.config.rounds == 3 and not resumed.stopped
    assert list(resumed.metrics["round"]) == [1, 2, 3]
    drop = [c for c in whole.metrics.columns if c.startswith("wall_s")]
    assert resumed.metrics.drop(columns=drop).equals(whole.metrics.drop(columns=drop))


def test_bad_config_raises_user_error(tmp_path):
    with pytest.raises(raysim.UserError, match="train.nope"):
        raysim.run({"train": {"nope": 1}})
    with pytest.raises(raysim.UserError, match="no config.yaml"):
        raysim.load_run(tmp_path)


def test_run_progress_bar_in_terminals_and_notebooks_only(tmp_path, capsys, monkeypatch):
    """progress=None: a tqdm bar where someone watches (a notebook kernel, a terminal), nothing in a log file;
    progress=True: always. Never the hand-drawn round lines."""
    raysim.run(None, *tiny_overrides(tmp_path / "a", engine__backend="inline", rounds=2))
    out, err = capsys.readouterr()
    assert "2/2" not in err and "round 1/2" not in out  # stderr is captured, not a terminal: no bar
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # as inside a Jupyter kernel
    result = raysim.run(None, *tiny_overrides(tmp_path / "b", engine__backend="inline", rounds=2))
    out, err = capsys.readouterr()
    assert "2/2" in err and "acc_mean=" in err and f"run directory {result.run_dir}" in out + err
    assert "round 1/2" not in out


def test_the_verbs_stay_verbs_after_their_modules_are_imported():
    """`raysim.tune(...)` imports raysim.tune (the package) and `raysim.report(...)` raysim.report (the module): Python
    bound each over the verb, so a notebook's second call hit "'module' object is not callable"."""
    import importlib

    importlib.import_module("raysim.tune.spec")
    importlib.import_module("raysim.report")
    from raysim.tune import load_sweep  # the submodules are still importable

    assert raysim.tune.__module__ == raysim.report.__module__ == "raysim.api" and callable(load_sweep)
