"""The host side of a run: what ``--resume`` records and when it has nothing to do (in-process runs, no Ray)."""

from __future__ import annotations

import pytest

import raysim
from conftest import read_rows, tiny_overrides
from raysim.cli import main
from raysim.config import load_config
from raysim.engine import runner


def _hparams(run_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    (path,) = run_dir.glob("events.out.tfevents.*.hparams")
    acc = EventAccumulator(str(path))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: v.number_value if v.HasField("number_value") else v.string_value for k, v in info.hparams.items()}


@pytest.fixture
def three_rounds(tmp_path):
    """A finished three-round run, made in this process."""
    return raysim.run(None, *tiny_overrides(tmp_path, rounds=3, engine__backend="inline")).run_dir


def test_resume_with_more_rounds_records_them_everywhere(three_rounds, capsys):
    """`--resume R rounds=5` on a 3-round run ran 5 rounds but left config.yaml (and so the report's labels,
    load_run's 5/3, TensorBoard's HParams) at 3."""
    assert _hparams(three_rounds)["rounds"] == 3
    assert main(["run", "--resume", str(three_rounds), "rounds=5", "--quiet"]) == 0
    saved = load_config(three_rounds / "config.yaml")
    assert saved.rounds == 5 and saved.log.dir == str(three_rounds)
    assert [r["round"] for r in read_rows(three_rounds)] == [1, 2, 3, 4, 5]
    assert _hparams(three_rounds)["rounds"] == 5
    assert len(list(three_rounds.glob("events.out.tfevents.*.layout"))) == 1
    assert repr(raysim.load_run(three_rounds)).startswith(f"RunResult(run_dir={str(three_rounds)!r}, rounds=5/5")


def test_resuming_a_finished_run_says_so_without_starting_anything(three_rounds, capsys, monkeypatch):
    """`--resume` of a finished run started Ray (21 s), reprinted the summary and never said it was complete."""
    before = (three_rounds / "config.yaml").read_text()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run must not start Ray or a driver")

    monkeypatch.setattr(runner, "run_experiment", refuse)
    monkeypatch.setattr(raysim.api, "_ensure_ray", refuse)
    capsys.readouterr()
    assert main(["run", "--resume", str(three_rounds)]) == 0
    out, err = capsys.readouterr()
    assert "best acc_mean" in out  # the summary, as after a run
    assert err.strip() == (f"raysim: {three_rounds} is already complete (3 rounds run, rounds=3); nothing to run. "
                           f"To continue it, add rounds=N with N > 3: raysim run --resume {three_rounds} rounds=6")
    assert (three_rounds / "config.yaml").read_text() == before
    with pytest.warns(UserWarning, match="already complete"):
        result = raysim.run(None, resume=three_rounds)
    assert len(result.metrics) == 3
