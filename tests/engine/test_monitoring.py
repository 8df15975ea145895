"""What a run shows while and after it runs: progress lines with ETA, HParams, loss parts, the custom-scalars page."""

from __future__ import annotations

import raysim
from raysim.runlog import ProgressLine


def test_progress_line_has_elapsed_and_eta(monkeypatch):
    import time

    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    line = ProgressLine(rounds=10)
    line.start(after_round=2)  # a resumed run: ETA from this invocation's rounds only
    now[0] += 30.0
    m = {"round": 5, "acc_mean": 0.5, "loss": 1.0, "bytes_up": 10, "bytes_down": 10, "wall_s": 10.0, "p": 0.25}
    text = line.format(m)
    assert text.startswith("round  5/10") and "p 0.25" in text
    assert text.endswith("[00:30 elapsed, eta 00:50]")  # 10 s a round, 5 rounds left


def test_every_run_writes_hparams_loss_parts_and_curriculum_layout(unideal_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import metadata as cs_metadata
    from tensorboard.plugins.custom_scalar import layout_pb2

    result = raysim.load_run(unideal_run)
    assert result.metrics["p"].iloc[-1] > 0
    acc = EventAccumulator(str(result.run_dir))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"loss/train", "loss/ce", "loss/clkd", "Curriculum/p", "Curriculum/p_epoch"} <= scalars
    hp = EventAccumulator(str(next(result.run_dir.glob("events.out.tfevents.*.hparams"))))
    hp.Reload()
    assert hp.PluginTagToContent("hparams").keys() == {"_hparams_/session_start_info", "_hparams_/session_end_info"}
    lay = EventAccumulator(str(next(result.run_dir.glob("events.out.tfevents.*.layout"))))
    lay.Reload()
    content = lay.Tensors(cs_metadata.CONFIG_SUMMARY_TAG)[0].tensor_proto.string_val[0]
    layout = layout_pb2.Layout.FromString(content)
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    assert charts["accuracy"] == ["^acc/mean$", "^acc/global$"]
    assert charts["curriculum p per local epoch"] == ["^Curriculum/p_epoch$"]
    assert [c.title for cat in layout.category for c in cat.chart][0] == "curriculum p per local epoch"


def test_live_round_line_shows_clients_done_and_clears():
    import io
    import time

    from raysim.engine.runner import RunControl
    from raysim.runlog import LiveRound

    class FakeDriver:  # an in-process driver in the middle of round 4
        def progress(self):  # (round, jobs done, jobs in this phase, kind), as Driver.progress
            return (4, 7, 20, "train")

    out = io.StringIO()
    live = LiveRound(rounds=10, stream=out, every_s=0.01)
    live.start(RunControl(FakeDriver()))
    deadline = time.monotonic() + 5
    while "7/20" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    live.stop()
    assert "round 4/10: 7/20 clients trained" in out.getvalue()
    assert out.getvalue().endswith("\r\033[K")  # the live line is erased before the next round line
