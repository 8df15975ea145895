"""The experiments shipped with raysim, found by name: ``raysim run smoke``, ``raysim tune sweeps/smoke-lr``.

The configs under ``experiments/`` are package data (``raysim/experiments/`` in a wheel; the source tree's
``experiments/`` in a checkout or an editable install), so every command in the README works from an installed
package, in any directory. A name is the file's path below ``experiments/`` without ``.yaml``
(``unideal/digits-niid1-cpu/unideal``); a file that exists where the user is always wins over a name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from raysim.errors import UserError

SUFFIX = ".yaml"


def experiments_root() -> Optional[Path]:
    """The folder of shipped experiments: inside the installed package, else the source checkout's."""
    package = Path(__file__).resolve().parent
    for folder in (package / "experiments", package.parent / "experiments"):
        if (folder / "smoke.yaml").is_file():
            return folder
    return None


def resolve(config: Union[str, Path], what: str = "config file") -> Path:
    """A path that exists, or a shipped experiment's file by name; else a one-line error that says where to look."""
    path = Path(config).expanduser()
    if path.is_file():
        return path
    root = experiments_root()
    text = str(config)
    if root is not None and not path.is_absolute():
        name = text[len("experiments/"):] if text.startswith("experiments/") else text
        for candidate in (root / name, root / f"{name}{SUFFIX}"):
            if candidate.is_file():
                return candidate
    hint = "; `raysim list experiments` lists the shipped ones by name" if root is not None else ""
    raise UserError(f"{what} not found: {config}{hint}")


def experiment_names(root: Optional[Path] = None) -> list[str]:
    """Every shipped experiment and sweep, as the name ``raysim run`` / ``raysim tune`` accepts."""
    root = root or experiments_root()
    if root is None:
        return []
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob(f"*{SUFFIX}"))


def describe_experiments() -> list[tuple[str, str]]:
    """(name, the first sentence of the file's header comment) for ``raysim list experiments``."""
    root = experiments_root()
    if root is None:
        raise UserError("no shipped experiments found (raysim's package data is missing: reinstall raysim)")
    rows = []
    for name in experiment_names(root):
        header = []
        for line in (root / f"{name}{SUFFIX}").read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("#").strip())
        text = " ".join(h for h in header if h)
        end = text.find(". ")
        text = text[:end + 1] if end >= 0 else text
        rows.append((name, ("[sweep: raysim tune] " if name.startswith("sweeps/") else "") + (text or "-")))
    return rows
