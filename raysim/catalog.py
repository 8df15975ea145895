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


# built-in datasets read from local files under data.root (the others are embedded, generated or scikit-learn's)
LOCAL_DATASETS = ("adult", "cifar10", "cifar100", "femnist", "hcc", "ilpd", "shakespeare", "tinyimagenet")
TAG_CPU, TAG_ROOT, TAG_GPU = "embedded data, CPU", "needs data.root", "needs a GPU"
_ABBREVIATIONS = ("al", "e.g", "i.e", "cf", "vs", "fig", "eq", "eqs", "sec", "no", "approx", "etc")


def is_base(name: str) -> bool:
    """A file that only holds what its siblings share (``.../base``): extended, not run."""
    return name.rsplit("/", 1)[-1] == "base"


def _merged(path: Path, cache: dict) -> dict:
    """The file's keys merged over those of the files it extends (plain YAML, no validation: fast)."""
    import yaml

    path = path.resolve()
    if path not in cache:
        cache[path] = {}  # a cycle reads as empty
        try:
            # libyaml's loader where PyYAML has it: `raysim list` reads every shipped file (~240)
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            raw = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
        except (OSError, yaml.YAMLError):
            raw = {}
        raw = raw if isinstance(raw, dict) else {}
        parent = raw.pop("extends", None)
        cache[path] = _deep_merge(_merged(path.parent / str(parent), cache), raw) if parent else raw
    return cache[path]


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def experiment_tags(raw: dict) -> list[str]:
    """What running the experiment needs: a dataset under ``data.root``, a GPU; else it runs here as it is."""
    data, engine = raw.get("data") or {}, raw.get("engine") or {}
    tags = []
    if str(data.get("name", "sklearn_digits")) in LOCAL_DATASETS:
        tags.append(TAG_ROOT)
    try:
        gpus = float(engine.get("gpus_per_worker") or 0)
    except (TypeError, ValueError):
        gpus = 0.0
    if gpus > 0:
        tags.append(TAG_GPU)
    return tags or [TAG_CPU]


def first_sentence(text: str) -> str:
    """The text up to its first full stop that ends a sentence: not inside parentheses, not after an
    abbreviation ("Liu et al. 2023" stays whole); the whole text when there is none."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "." and depth <= 0 and (i + 1 == len(text) or text[i + 1] == " "):
            word = text[:i].rsplit(" ", 1)[-1].lstrip("(").lower()
            if word not in _ABBREVIATIONS and not (len(word) == 1 and word.isalpha()):
                return text[:i + 1]
    return text


def describe_experiments(pattern: Optional[str] = None, *, bases: bool = False) -> list[tuple[str, str]]:
    """(name, tags and the first sentence of the file's header comment) for ``raysim list experiments``: only the
    names that contain ``pattern`` (a substring, or a glob such as ``fapd/*moon*``); base files left out."""
    root = experiments_root()
    if root is None:
        raise UserError("no shipped experiments found (raysim's package data is missing: reinstall raysim)")
    rows, cache = [], {}
    for name in experiment_names(root):
        if (is_base(name) and not bases) or not matches(name, pattern):
            continue
        path = root / f"{name}{SUFFIX}"
        header = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("#").strip())
        text = first_sentence(" ".join(h for h in header if h))
        tags = "sweep: raysim tune" if name.startswith("sweeps/") else ", ".join(experiment_tags(_merged(path, cache)))
        rows.append((name, f"[{tags}] {text or '-'}"))
    return rows


def matches(name: str, pattern: Optional[str]) -> bool:
    """``pattern`` in ``name`` (case-insensitive), or, with a glob character, ``name`` matching that glob."""
    if not pattern:
        return True
    import fnmatch as fn

    if any(c in pattern for c in "*?["):
        return fn.fnmatch(name, pattern) or fn.fnmatch(name, f"*{pattern}*")
    return pattern.lower() in name.lower()
