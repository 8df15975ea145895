"""Sweep files: reading, checking and saving the resolved sweep (``sweep.yaml``)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from raysim.config import flatten_dict
from raysim.errors import UserError
from raysim.tune.naming import NAMINGS, TrialNaming, naming

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
SCHEDULERS = ("fifo", "asha", "hyperband", "median")
# each scheduler's keys besides name (ASHA's may stay in a file run with another scheduler: ignored there)
SCHEDULER_KEYS = ("grace_period", "reduction_factor", "min_samples_required")
SEARCHERS = ("random", "optuna")
# what every run's metrics.jsonl holds (numeric), besides algorithm extras such as FAPD's k, UNIDEAL's p and loss_<part>
RUN_METRICS = ("acc_mean", "acc_global", "acc_weighted", "loss", "bytes_up", "bytes_down", "bytes_up_total",
               "bytes_down_total", "wall_s", "wall_s_total", "k", "p")
# top-level keys of a sweep file; an override whose first segment is one of these sets the sweep, not the experiment
SWEEP_KEYS = ("base", "metric", "mode", "num_samples", "scheduler", "search", "max_concurrent", "dir", "fixed",
              "space")


class SweepError(UserError):
    """A sweep file or a sweep override is wrong."""


@dataclass
class SweepSpec:
    """A resolved sweep: which experiment, what to search, how to schedule; saved as ``sweep.yaml``."""

    base: Optional[str]  # experiment config (absolute path); None: the built-in defaults
    space: dict[str, dict[str, list]] = field(default_factory=dict)  # dotted key -> {distribution: args}
    fixed: list[str] = field(default_factory=list)  # dotted overrides applied to every trial
    metric: str = "acc_mean"
    mode: str = "max"
    num_samples: int = 1
    scheduler: dict[str, Any] = field(default_factory=lambda: {"name": "fifo"})
    search: dict[str, Any] = field(default_factory=lambda: {"name": "random"})  # random (and grid) | optuna (TPE)
    max_concurrent: Optional[int] = None
    dir: Optional[str] = None
    naming: str = "trial"  # "trial": trials/<trial_id>; "seed": seed-<n> (raysim run --seeds); see naming.py

    @property
    def names(self) -> TrialNaming:
        """The naming strategy: where trials' run directories sit, their labels, the summary."""
        return naming(self.naming)

    def trials_dir(self, sweep_dir: Path) -> Path:
        """Seeds sit right under their parent (PARENT/seed-3); sweep trials under SWEEP_DIR/trials/."""
        return self.names.trials_dir(sweep_dir)

    def total_trials(self) -> int:
        grids = [len(d["grid"]) for d in self.space.values() if "grid" in d]
        return self.num_samples * math.prod(grids) if grids else self.num_samples


def load_sweep(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SweepSpec:
    """Read a sweep file; ``overrides`` whose first segment is a sweep key set the sweep, the rest the experiment."""
    from raysim.catalog import resolve

    try:
        path = resolve(path, "sweep file")  # a file, or a shipped sweep by name (sweeps/smoke-lr)
    except UserError as exc:
        raise SweepError(str(exc)) from None
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        from raysim.config import yaml_problem

        raise SweepError(f"{path}: not valid YAML ({yaml_problem(exc, path.read_text(errors='replace'))})") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file must be a mapping of keys")
    unknown = sorted(map(str, set(raw) - set(SWEEP_KEYS)))
    if unknown:
        if not all(k.isidentifier() for k in unknown):  # a file that is no sweep file: named, never echoed
            raise SweepError(f"{path}: not a sweep file (a top-level key is not a sweep key name; known: "
                             f"{', '.join(SWEEP_KEYS)})")
        raise SweepError(f"sweep key '{unknown[0]}' is unknown (known: {', '.join(SWEEP_KEYS)})")
    if "base" not in raw:
        raise SweepError(f"{path}: sweep key 'base' (the experiment config to start from) is missing")
    experiment_overrides = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SweepError(f"override '{item}' must look like dotted.key=value")
        head = key.split(".")[0]
        if head in ("space", "fixed", "base"):
            raise SweepError(f"override '{item}': change '{head}' in the sweep file")
        if head in SWEEP_KEYS:
            _set_dotted(raw, key, yaml.safe_load(value))
        else:
            experiment_overrides.append(item)
    base = (path.parent / str(raw["base"])).resolve()
    if not base.is_file():
        raise SweepError(f"sweep key 'base': experiment config not found: {base}")
    space = flatten_space(raw.get("space") or {})
    fixed = [f"{k}={json.dumps(v)}" for k, v in _flatten(raw.get("fixed") or {}, "fixed").items()]
    for item in experiment_overrides:  # a command-line value fixes a searched key
        space.pop(item.partition("=")[0], None)
    scheduler = raw.get("scheduler", "fifo")
    scheduler = {"name": scheduler} if isinstance(scheduler, str) else dict(scheduler)
    search = raw.get("search", "random")
    search = {"name": search} if isinstance(search, str) else dict(search)
    # search.seed=0 alone (on the command line or in the file) seeds the default searcher, as scheduler keys alone
    # keep the default scheduler
    scheduler.setdefault("name", "fifo")
    search.setdefault("name", "random")
    spec = SweepSpec(base=str(base), space=space, fixed=fixed + experiment_overrides,
                     metric=raw.get("metric", "acc_mean"), mode=raw.get("mode", "max"),
                     num_samples=raw.get("num_samples", 1), scheduler=scheduler, search=search,
                     max_concurrent=raw.get("max_concurrent"), dir=raw.get("dir"))
    check_spec(spec)
    return spec


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        node = tree.get(part)
        if not isinstance(node, dict):
            node = {"name": node} if part in ("scheduler", "search") and isinstance(node, str) else {}
            tree[part] = node
        tree = node
    tree[parts[-1]] = value


def _flatten(tree: dict, where: str) -> dict[str, Any]:
    if not isinstance(tree, dict):
        raise SweepError(f"sweep key '{where}' must be a mapping of dotted config keys")
    return flatten_dict(tree)


def flatten_space(tree: dict, prefix: str = "") -> dict[str, dict[str, list]]:
    """``{train: {lr: {loguniform: [a, b]}}}`` or ``{train.lr: {loguniform: [a, b]}}`` -> ``{"train.lr": {...}}``."""
    if not isinstance(tree, dict):
        raise SweepError("sweep key 'space' must map dotted config keys to distributions")
    out: dict[str, dict[str, list]] = {}
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in DISTRIBUTIONS:
            kind, args = next(iter(value.items()))
            _check_distribution(full, kind, args)
            out[full] = {kind: list(args)}
        elif isinstance(value, dict) and value and not (set(value) & set(DISTRIBUTIONS)):
            out.update(flatten_space(value, full + "."))
        else:
            raise SweepError(f"sweep key 'space.{full}': give one distribution, e.g. {{choice: [a, b]}} "
                             f"(one of {', '.join(DISTRIBUTIONS)})")
    return out


def _check_distribution(key: str, kind: str, args: Any) -> None:
    where = f"sweep key 'space.{key}'"
    if not isinstance(args, list) or not args:
        raise SweepError(f"{where}: {kind} needs a non-empty list")
    if kind in ("uniform", "loguniform", "randint"):
        if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
            raise SweepError(f"{where}: {kind} needs [low, high]")
        if not args[0] < args[1]:
            raise SweepError(f"{where}: {kind} needs low < high, got {args}")
        if kind == "loguniform" and args[0] <= 0:
            raise SweepError(f"{where}: loguniform needs low > 0, got {args[0]}")
        if kind == "randint" and not all(isinstance(a, int) for a in args):
            raise SweepError(f"{where}: randint needs integers [low, high) , got {args}")


def check_spec(spec: SweepSpec) -> None:
    if not isinstance(spec.metric, str) or not (spec.metric in RUN_METRICS or spec.metric.startswith("loss_")):
        raise SweepError(f"sweep key 'metric': any numeric metric of metrics.jsonl ({', '.join(RUN_METRICS)}, "
                         f"loss_<part>), got {spec.metric!r}")
    if spec.mode not in ("max", "min"):
        raise SweepError(f"sweep key 'mode': must be max or min, got {spec.mode!r}")
    if not isinstance(spec.num_samples, int) or spec.num_samples < 1:
        raise SweepError(f"sweep key 'num_samples': must be an integer >= 1, got {spec.num_samples!r}")
    if spec.scheduler.get("name") not in SCHEDULERS:
        raise SweepError(f"sweep key 'scheduler.name': must be one of {', '.join(SCHEDULERS)}, "
                         f"got {spec.scheduler.get('name')!r}")
    # a scheduler's keys may stay in a file run with another scheduler (they are ignored there)
    extra = sorted(set(spec.scheduler) - {"name", *SCHEDULER_KEYS})
    if extra:
        raise SweepError(f"sweep key 'scheduler.{extra[0]}' is unknown (known: name, {', '.join(SCHEDULER_KEYS)})")
    for key, low in (("grace_period", 1), ("reduction_factor", 2), ("min_samples_required", 1)):
        value = spec.scheduler.get(key, low)
        if not isinstance(value, int) or value < low:
            raise SweepError(f"sweep key 'scheduler.{key}': must be an integer >= {low}, got {value!r}")
    search = spec.search.get("name") if isinstance(spec.search, dict) else None
    if search not in SEARCHERS:
        raise SweepError(f"sweep key 'search.name': must be one of {', '.join(SEARCHERS)}, got {search!r}")
    extra = sorted(set(spec.search) - {"name", "seed", "startup_trials"})
    if extra:
        raise SweepError(f"sweep key 'search.{extra[0]}' is unknown (known: name, seed, startup_trials)")
    if search == "optuna":
        from raysim.extras import require_extra

        try:
            require_extra("optuna", "search.name")
        except UserError as exc:
            raise SweepError(str(exc).replace("config key", "sweep key", 1)) from None
        grids = [k for k, d in spec.space.items() if "grid" in d]
        if grids:
            raise SweepError(f"sweep key 'space.{grids[0]}': Optuna samples, it does not enumerate grids; use "
                             f"choice instead of grid (or search.name=random)")
    if spec.dir is not None:
        from raysim.validate import path_too_long

        too_long = path_too_long(str(spec.dir))
        if too_long:
            raise SweepError(f"sweep key 'dir': cannot be a directory: {too_long}")
    if spec.max_concurrent is not None and (not isinstance(spec.max_concurrent, int) or spec.max_concurrent < 1):
        raise SweepError(f"sweep key 'max_concurrent': must be an integer >= 1, got {spec.max_concurrent!r}")


def spec_to_yaml(spec: SweepSpec) -> str:
    return yaml.safe_dump(dataclasses.asdict(spec), sort_keys=False)


SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(SweepSpec))


def spec_from_dict(raw: Any, where: str) -> SweepSpec:
    """A sweep that raysim recorded (``sweep.yaml``, the sweep state), checked as a sweep file is checked before
    anything of it is used: a damaged or edited record is one line naming ``where`` and the key."""
    def refuse(why: str) -> SweepError:
        return SweepError(f"{where}: {why}; restore it, or start the sweep again in another directory")

    if not isinstance(raw, dict):
        raise refuse("not a recorded sweep (a mapping of sweep keys)")
    unknown = sorted(str(k) for k in set(raw) - set(SPEC_FIELDS))
    if unknown:
        raise refuse(f"sweep key '{unknown[0]}' is unknown")
    kinds = {"base": (str, type(None)), "space": dict, "fixed": list, "metric": str, "mode": str, "num_samples": int,
             "scheduler": dict, "search": dict, "max_concurrent": (int, type(None)), "dir": (str, type(None)),
             "naming": str}
    for key, kind in kinds.items():
        if key in raw and (not isinstance(raw[key], kind) or isinstance(raw[key], bool)):
            raise refuse(f"sweep key '{key}' holds {type(raw[key]).__name__} {raw[key]!r}")
    if "base" not in raw:
        raise refuse("sweep key 'base' is missing")
    if not all(isinstance(item, str) and "=" in item for item in raw.get("fixed", [])):
        raise refuse("sweep key 'fixed' must list dotted.key=value overrides")
    if raw.get("naming", "trial") not in NAMINGS:
        raise refuse(f"sweep key 'naming' must be one of {', '.join(NAMINGS)}, got {raw['naming']!r}")
    try:
        if flatten_space(raw.get("space", {})) != raw.get("space", {}):
            raise SweepError("sweep key 'space' must map dotted config keys to one distribution each")
        spec = SweepSpec(**raw)
        check_spec(spec)
    except SweepError as exc:
        raise refuse(str(exc)) from None
    return spec



def default_sweep_dir(spec: SweepSpec) -> Path:
    stem = Path(spec.base).stem if spec.base else "defaults"
    return Path("runs") / f"{stem}-{spec.names.dir_kind}-{time.strftime('%Y%m%d-%H%M%S')}"
