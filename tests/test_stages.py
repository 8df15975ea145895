"""The stage protocol (raysim.stages): a stage from outside raysim (tests/plugins/stage_probe.py) takes part in the
round at its declared points, on both executors, through a resume, with no change to the driver, the client-job
core or any algorithm."""

from __future__ import annotations

import pytest
import torch

from conftest import crash_after, killed_worker_matches_inline, read_rows, strip_timing, tiny_overrides
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.stages import build_stages


def test_the_probe_stages_client_part_by_hand():
    """upload ← download + λ·(upload − download), λ = 1/2: w 3 from 1 becomes 2; the change's norm, |3 − 1| = 2, is
    reported; an entry the download lacks, or an integer one, goes as it is."""
    from stage_probe import _Shrink

    part = _Shrink(0.5)
    part.restore(None)
    out = part.upload({"w": torch.tensor([3.0]), "n": torch.tensor(4), "own": torch.tensor([9.0])},
                      {"model": {"w": torch.tensor([1.0]), "n": torch.tensor(1)}})
    assert out["w"].tolist() == [2.0] and int(out["n"]) == 4 and out["own"].tolist() == [9.0]
    assert part.report(0) == {"norm": 2.0, "jobs": 1} and int(part.keep()) == 1 and part.upload_bytes(10) == 5


def test_a_plugin_stage_runs_only_where_the_config_names_it(tmp_path):
    import stage_probe  # noqa: F401 - registered now, for the rest of this process

    plain = load_config(None, tiny_overrides(tmp_path))
    probed = load_config(None, tiny_overrides(tmp_path, plugins="[stage_probe]"))
    assert "shrink" not in build_stages(plain).by_name and "shrink" in build_stages(probed).by_name
    assert [s.name for s in build_stages(probed)][0] == "schedule"  # the schedule first, plugins after the built-ins


def test_a_plugin_stage_logs_keeps_its_state_through_a_resume_and_shrinks_the_server_step(tmp_path):
    extra = dict(plugins="[stage_probe]", rounds=3, clients__num=4)
    full, rows, _ = run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "full"),
                                                                    **extra)))
    assert [r["probe/reports"] for r in rows] == [4, 8, 12] and all(r["probe/change_norm"] > 0 for r in rows)
    assert [r["probe/most_jobs"] for r in rows] == [1, 2, 3]  # each client's count, kept in the state store
    plain, plain_rows, _ = run_experiment(load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "plain"),
                                                                           rounds=3, clients__num=4)))
    assert rows[0]["loss"] == plain_rows[0]["loss"]  # round 1 trains from the same model; the server step differs
    assert rows[1]["loss"] != plain_rows[1]["loss"]
    assert [2 * r["bytes_up"] for r in rows] == [r["bytes_up"] for r in plain_rows]  # the part's wire bytes
    cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "resumed"), **extra))
    crash_after(cfg, 2)
    resumed, _, _ = run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(resumed)) == strip_timing(read_rows(full))


@pytest.mark.slow
def test_a_plugin_stage_gives_the_same_numbers_on_two_ray_workers_one_killed(ray_cluster, tmp_path):
    """The stage's client part runs where each client trains, before the partial sums, on any process."""
    rows = killed_worker_matches_inline(tmp_path, plugins="[stage_probe]")
    assert all("probe/change_norm" in r for r in rows)
