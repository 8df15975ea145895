"""``raysim.robust``'s rules and attacks stay public: every name it exports resolves to a function, docs/robust.md
names each one, and the page's example runs as written."""

import importlib
import pkgutil
import re
from pathlib import Path

import torch

import raysim.robust as robust

DOC = (Path(__file__).resolve().parents[2] / "docs" / "robust.md").read_text()
SECTION = DOC[DOC.index("## The public functions"):DOC.index("\n## ", DOC.index("## The public functions") + 1)]


def test_every_exported_name_is_a_function_the_page_names():
    for module in pkgutil.iter_modules(robust.__path__):  # an imported submodule of the same name would shadow it
        importlib.import_module(f"raysim.robust.{module.name}")
    assert len(robust.__all__) >= 30
    for name in robust.__all__:
        assert callable(getattr(robust, name)), name
        assert re.search(rf"`{name}\b", SECTION), f"docs/robust.md's public functions do not name {name}"


def test_the_page_s_example_runs_and_krum_after_nnm_resists_min_max():
    start = SECTION.index("```python") + len("```python")
    example = SECTION[start:SECTION.index("```", start)]
    scope: dict = {}
    torch.manual_seed(0)
    exec(compile(example, "docs/robust.md", "exec"), scope)  # the page's own code, as a reader would run it
    aggregate, x, f = scope["aggregate"], scope["x"], scope["f"]
    assert aggregate.shape == (x.shape[1],) and torch.isfinite(aggregate).all()
    honest_mean = x[f:].mean(0)
    assert (aggregate - honest_mean).norm() < (scope["bad"] - honest_mean).norm()


def test_an_unknown_name_is_an_attribute_error():
    try:
        robust.no_such_rule  # noqa: B018
    except AttributeError as e:
        assert "no_such_rule" in str(e)
    else:
        raise AssertionError("raysim.robust.no_such_rule resolved")
