"""The custom-scalars page each algorithm gets: the charts the algorithm declares (the curriculum) first, then
accuracy, loss, bytes; every chart's regexes anchored, so that each chart holds only the tags it means. The curricula's
tags sort first in TensorBoard's Time Series; a run's HParams never fix TensorBoard's columns."""

from __future__ import annotations

import re

import pytest

from raysim.registry import get_algorithm, names
from raysim.tboard import anchored, layout

BASE = {"accuracy": ["Multiline", ["^acc/mean$", "^acc/global$"]],
        "loss and its parts": ["Multiline", ["^loss/.*$", "^nonprivate/loss.*$"]],
        "bytes per round": ["Multiline", ["^comm/bytes_up$", "^comm/bytes_down$", "^nonprivate/bytes_up$",
                                          "^nonprivate/bytes_down$"]]}
CURRICULA = {"fapd": {"curriculum k": ["Multiline", ["^Curriculum/k$"]]},
             "unideal": {"curriculum p per local epoch": ["Multiline", ["^Curriculum/p_epoch$"]],
                         "curriculum p per round (mean)": ["Multiline", ["^Curriculum/p$"]]}}
# every scalar tag a run writes (raysim.runlog), FAPD's and UNIDEAL's included
TAGS = ["acc/mean", "acc/global", "acc/weighted", "loss/train", "loss/ce", "loss/clkd", "comm/bytes_up",
        "comm/bytes_down", "comm/bytes_up_total", "comm/bytes_down_total", "time/round_s", "time/total_s",
        "Curriculum/k", "Curriculum/p", "Curriculum/p_epoch", "curriculum/k_next", "metrics/vectorize",
        "per_client/acc_0000", "nonprivate/loss", "nonprivate/loss_ce", "nonprivate/bytes_up",
        "nonprivate/bytes_up_total", "nonprivate/unclipped", "privacy/epsilon"]  # with privacy on
MEANT = {"accuracy": {"acc/mean", "acc/global"},
         "loss and its parts": {"loss/train", "loss/ce", "loss/clkd", "nonprivate/loss", "nonprivate/loss_ce"},
         "bytes per round": {"comm/bytes_up", "comm/bytes_down", "nonprivate/bytes_up"},
         "curriculum k": {"Curriculum/k"},
         "curriculum p per local epoch": {"Curriculum/p_epoch"}, "curriculum p per round (mean)": {"Curriculum/p"}}


@pytest.mark.parametrize("algorithm", names("algorithm"))
def test_only_the_curriculum_methods_add_a_chart_and_it_comes_first(algorithm):
    page = layout(get_algorithm(algorithm).tensorboard_charts)["raysim"]
    extra = CURRICULA.get(algorithm, {})
    assert page == {**BASE, **extra}
    assert list(page) == [*extra, "accuracy", "loss and its parts", "bytes per round"]  # the page's order


@pytest.mark.parametrize("algorithm", ["fedavg", "fapd", "unideal"])
def test_each_chart_matches_only_the_tags_it_means(algorithm):
    """TensorBoard searches a chart's regexes in every tag (re.search): bytes per round must not take the _total
    tags, the per-round p not the per-epoch one."""
    for title, (_, regexes) in layout(get_algorithm(algorithm).tensorboard_charts)["raysim"].items():
        assert all(r.startswith("^") and r.endswith("$") for r in regexes), title
        matched = {t for t in TAGS if any(re.search(r, t) for r in regexes)}
        assert matched == MEANT[title], title


def test_a_plugins_unanchored_regex_is_anchored():
    assert anchored("comm/bytes_up") == "^comm/bytes_up$" == anchored("^comm/bytes_up$")
    assert layout({"mine": ["my/tag"]})["raysim"]["mine"] == ["Multiline", ["^my/tag$"]]


def test_the_curricula_tags_sort_before_every_other_group():
    """TensorBoard's Time Series (the page it opens on) lists tag groups in code-point order and expands the first
    two (seen in headless Chromium, benchmarks/RESULTS.md): the curriculum's group must come before acc/."""
    from raysim.runlog import TB_TAGS, tb_tag

    groups = {tb_tag(k).split("/")[0] for k in [*TB_TAGS, "curriculum/k_next", "loss_ce", "vectorize"]}
    assert tb_tag("k") == "Curriculum/k" and tb_tag("p") == "Curriculum/p"
    assert tb_tag("curriculum/stable") == "curriculum/stable"  # FAPD's controller: its own group, further down
    assert sorted(groups)[:2] == ["Curriculum", "acc"]


def test_hparams_hold_no_experiment_so_tensorboard_lists_differing_keys_first(tmp_path):
    """One run's HParams experiment fixed TensorBoard's columns for every run it read (a seed set's 'seed' only,
    so algorithm.name was blank in a comparison); without one, TensorBoard builds them from all the runs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raysim.tboard import saved_hparams, write_hparams

    (tmp_path / "config.yaml").write_text("seed: 3\nalgorithm: {name: fedprox, mu: 0.01}\nlog: {dir: x}\n"
                                          "model: {hidden: [64]}\n")
    hparams = saved_hparams(tmp_path)
    assert hparams == {"seed": 3, "algorithm.name": "fedprox", "algorithm.mu": 0.01, "model.hidden": "[64]"}
    write_hparams(tmp_path, hparams, {"hparams/best_acc_mean": 0.5})
    acc = EventAccumulator(str(next(tmp_path.glob("events.out.tfevents.*.hparams"))))
    acc.Reload()
    assert set(acc.PluginTagToContent("hparams")) == {"_hparams_/session_start_info", "_hparams_/session_end_info"}
    (tmp_path / "config.yaml").write_text("seed: 3\nlog: {tensorboard: false}\n")
    assert saved_hparams(tmp_path) is None  # a run that switched TensorBoard off gets no HParams from its sweep


def test_hparams_are_written_without_torch_as_torch_writes_them(tmp_path):
    """A sweep's own process writes every trial's HParams at its end and has no other use for torch: raysim builds
    the plugin's session summaries with TensorBoard's protocol buffers, byte for byte what torch.utils.tensorboard
    makes (numbers and bools as number_value, strings as string_value), and TensorBoard reads them back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard.summary import hparams

    from raysim.tboard import _session_summaries, write_hparams

    values = {"train.lr": 0.3, "seed": 2, "algorithm.name": "fedavg", "log.tensorboard": True}
    assert [s.SerializeToString() for s in _session_summaries(values)] == \
        [s.SerializeToString() for s in hparams(values, {})[1:]]

    write_hparams(tmp_path, values, {"hparams/best_acc_mean": 0.75})
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("hparams/best_acc_mean")] == [(0, 0.75)]
    assert sorted(events.PluginTagToContent("hparams")) == ["_hparams_/session_end_info",
                                                            "_hparams_/session_start_info"]
