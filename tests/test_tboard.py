"""The custom-scalars page each algorithm gets: accuracy, the charts the algorithm declares, loss, bytes."""

from __future__ import annotations

import pytest

from raysim.registry import get_algorithm, names
from raysim.tboard import layout

BASE = {"accuracy": ["Multiline", ["acc/mean", "acc/global"]],
        "loss and its parts": ["Multiline", [r"loss/.*"]],
        "bytes per round": ["Multiline", ["comm/bytes_up", "comm/bytes_down"]]}


@pytest.mark.parametrize("algorithm", names("algorithm"))
def test_only_the_curriculum_methods_add_a_chart_after_accuracy(algorithm):
    page = layout(get_algorithm(algorithm).tensorboard_charts)["raysim"]
    extra = {"fapd": {"curriculum k": ["Multiline", ["curriculum/k"]]},
             "unideal": {"curriculum p": ["Multiline", ["curriculum/p"]]}}.get(algorithm, {})
    assert page == {**BASE, **extra}
    assert list(page) == ["accuracy", *extra, "loss and its parts", "bytes per round"]  # the page's order
