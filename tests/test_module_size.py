"""No module of the package is over 500 lines: a module that grows past it has more than one job, and is split
along its jobs (the limit the project holds itself to; see docs/hooks.md)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "raysim"
LIMIT = 500


def long_modules(root: Path = PACKAGE, limit: int = LIMIT) -> dict[str, int]:
    """Each module over ``limit`` lines, with its line count."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out[str(path.relative_to(root.parent))] = lines
    return out


def test_no_module_is_over_500_lines():
    assert len(list(PACKAGE.rglob("*.py"))) > 50  # the package is really read
    assert not long_modules(), f"modules over {LIMIT} lines (split them along their jobs): {long_modules()}"


def test_the_check_sees_a_long_module(tmp_path):
    (tmp_path / "raysim").mkdir()
    (tmp_path / "raysim" / "short.py").write_text("x = 1\n" * 500)
    (tmp_path / "raysim" / "long.py").write_text("x = 1\n" * 501)
    assert long_modules(tmp_path / "raysim") == {"raysim/long.py": 501}
