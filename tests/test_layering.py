"""The package's import structure: no import circle, and the engine below the commands, the API and Tune.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` counts, at module level,
inside functions and under ``TYPE_CHECKING`` alike (a function-level import only hides a circle until the function
runs). An import of ``a.b.c`` is an edge to the deepest module of the package that it names; the implicit import
of a module's parent packages is not an edge (it would put every module in a circle with ``raysim/__init__.py``).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path
from typing import Callable

PACKAGE = Path(__file__).resolve().parents[1] / "raysim"
# what raysim.engine.* must never reach, directly or through another module: the layers built on top of it
ABOVE_ENGINE = ("raysim.tune", "raysim.cli", "raysim.api", "raysim.__main__")


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _deepest_module(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name that ``module`` imports anywhere in its source (relative imports made absolute)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # ``from pkg import submodule``
    return names


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {_deepest_module(n, modules) for n in imported_names(module, path) if n.split(".")[0] == "raysim"}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None (depth-first search, in sorted order for a stable answer)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def reachable(graph: dict[str, set[str]], start: str, stop: Callable[[str], bool] = lambda m: False) -> dict[str, str]:
    """Module -> the module it is first imported from (breadth first, so along a shortest chain), for everything
    ``start`` imports directly or indirectly; modules for which ``stop`` is true are reached but not followed."""
    parent = {start: ""}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for nxt in sorted(graph.get(node, ())):
            if nxt not in parent:
                parent[nxt] = node
                if not stop(nxt):
                    todo.append(nxt)
    return parent


def groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of two or more modules that import one another (the strongly connected components)."""
    seen: set[str] = set()
    out = []
    for module in sorted(graph):
        if module in seen:
            continue
        group = {m for m in reachable(graph, module) if module in reachable(graph, m)}
        seen |= group
        if len(group) > 1:
            out.append(group)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle in each group of modules that import one another."""
    return [find_cycle({m: graph[m] & group for m in group}) or [] for group in groups(graph)]


def chain(parent: dict[str, str], end: str) -> str:
    out = [end]
    while parent[out[-1]]:
        out.append(parent[out[-1]])
    return " -> ".join(reversed(out))


def above_engine(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in ABOVE_ENGINE)


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and "raysim.engine.driver" in graph["raysim.engine.runner"]  # the graph is really read
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_engine_imports_nothing_above_it():
    graph = import_graph()
    bad = []
    for module in sorted(m for m in graph if m.startswith("raysim.engine")):
        parent = reachable(graph, module, stop=above_engine)
        bad += [chain(parent, m) for m in sorted(parent) if above_engine(m)]
    assert not bad, "the engine imports a layer above it:\n" + "\n".join(bad)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each top-level package or module of raysim as one node (``raysim.privacy.stage`` and
    ``raysim.privacy.central`` are both ``raysim.privacy``)."""
    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(top(module), set()).update(top(t) for t in targets if top(t) != top(module))
    return out


# one layer in DESIGN.md: FAPD's hooks use the curricula, and the offline teacher trains through central training
SAME_LAYER = ({"raysim.algorithms", "raysim.curriculum"},)


def test_no_package_imports_a_package_that_imports_it_back():
    """Every package stands above what it imports. A torch-free part that the config layer reads (a subsystem's
    config section, the algorithms' capability table) lives below the subsystems, in ``raysim.sections`` and
    ``raysim.capabilities``; kept in the subsystem's folder, it made the config layer import up into ``privacy``,
    ``robust``, ``secagg``, ``system`` and ``compression``, and ``algorithms``, all in one circle."""
    found = [g for g in groups(package_graph(import_graph())) if g not in SAME_LAYER]
    assert not found, "packages that import one another:\n" + "\n".join(", ".join(sorted(g)) for g in found)


# the algorithms and what they build on: they see the engine only through the algorithms' public surface
# (raysim.algorithms.base, aggregation, training, central), never an engine module
BELOW_ENGINE = ("raysim.algorithms", "raysim.curriculum", "raysim.models", "raysim.data")


def _in_engine(module: str) -> bool:
    return module == "raysim.engine" or module.startswith("raysim.engine.")


def test_the_algorithms_import_no_engine_internals():
    graph = import_graph()
    bad = []
    for module in sorted(m for m in graph if any(m == b or m.startswith(b + ".") for b in BELOW_ENGINE)):
        parent = reachable(graph, module, stop=_in_engine)
        bad += [chain(parent, m) for m in sorted(parent) if _in_engine(m)]
    assert not bad, "an algorithm reaches the engine's internals:\n" + "\n".join(bad)


def test_the_checker_sees_circles_and_layers(tmp_path):
    """A circle through a function-level import and a relative import, and an engine module reaching Tune."""
    pkg = tmp_path / "raysim"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "tune").mkdir()
    for init in (pkg / "__init__.py", pkg / "engine" / "__init__.py", pkg / "tune" / "__init__.py"):
        init.write_text("")
    (pkg / "a.py").write_text("from raysim import b\n")
    (pkg / "b.py").write_text("def f():\n    from .engine.driver import run\n")
    (pkg / "engine" / "driver.py").write_text("import raysim.tune.trials\n")
    (pkg / "tune" / "trials.py").write_text("from raysim.a import x\n")
    graph = import_graph(pkg)
    assert graph["raysim.a"] == {"raysim", "raysim.b"} and graph["raysim.b"] == {"raysim.engine.driver"}
    assert find_cycle(graph) == ["raysim.a", "raysim.b", "raysim.engine.driver", "raysim.tune.trials", "raysim.a"]
    assert circles(graph) == [["raysim.a", "raysim.b", "raysim.engine.driver", "raysim.tune.trials", "raysim.a"]]
    parent = reachable(graph, "raysim.engine.driver", stop=above_engine)
    assert [chain(parent, m) for m in sorted(parent) if above_engine(m)] == [
        "raysim.engine.driver -> raysim.tune.trials"]  # reported where it enters Tune, not followed beyond
    (pkg / "tune" / "trials.py").write_text("x = 1\n")
    assert find_cycle(import_graph(pkg)) is None and circles(import_graph(pkg)) == []
