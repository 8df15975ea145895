"""The custom-scalars page each algorithm gets: accuracy, the charts the algorithm declares, loss, bytes; every
chart's regexes anchored, so that each chart holds only the tags it means."""

from __future__ import annotations

import re

import pytest

from raysim.registry import get_algorithm, names
from raysim.tboard import anchored, layout

BASE = {"accuracy": ["Multiline", ["^acc/mean$", "^acc/global$"]],
        "loss and its parts": ["Multiline", ["^loss/.*$"]],
        "bytes per round": ["Multiline", ["^comm/bytes_up$", "^comm/bytes_down$"]]}
CURRICULA = {"fapd": {"curriculum k": ["Multiline", ["^curriculum/k$"]]},
             "unideal": {"curriculum p per local epoch": ["Multiline", ["^curriculum/p_epoch$"]],
                         "curriculum p per round (mean)": ["Multiline", ["^curriculum/p$"]]}}
# every scalar tag a run writes (raysim.runlog), FAPD's and UNIDEAL's included
TAGS = ["acc/mean", "acc/global", "acc/weighted", "loss/train", "loss/ce", "loss/clkd", "comm/bytes_up",
        "comm/bytes_down", "comm/bytes_up_total", "comm/bytes_down_total", "time/round_s", "time/total_s",
        "curriculum/k", "curriculum/p", "curriculum/p_epoch", "metrics/vectorize", "per_client/acc_0000"]
MEANT = {"accuracy": {"acc/mean", "acc/global"}, "loss and its parts": {"loss/train", "loss/ce", "loss/clkd"},
         "bytes per round": {"comm/bytes_up", "comm/bytes_down"}, "curriculum k": {"curriculum/k"},
         "curriculum p per local epoch": {"curriculum/p_epoch"}, "curriculum p per round (mean)": {"curriculum/p"}}


@pytest.mark.parametrize("algorithm", names("algorithm"))
def test_only_the_curriculum_methods_add_a_chart_after_accuracy(algorithm):
    page = layout(get_algorithm(algorithm).tensorboard_charts)["raysim"]
    extra = CURRICULA.get(algorithm, {})
    assert page == {**BASE, **extra}
    assert list(page) == ["accuracy", *extra, "loss and its parts", "bytes per round"]  # the page's order


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
