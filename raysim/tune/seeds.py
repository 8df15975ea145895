"""``raysim run CONFIG --seeds 0-9``: one config over several seeds, run as a grid sweep over ``seed``."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from raysim.config import load_config
from raysim.errors import UserError
from raysim.tune.results import SweepResult
from raysim.tune.running import run_sweep
from raysim.tune.spec import SweepSpec, check_spec
from raysim.tune.state import spec_from_yaml


MAX_SEEDS = 10_000  # seeds in one set: each is a whole run (a larger set is refused before anything is built)


def parse_seeds(text: str) -> list[int]:
    """``0-9``, ``0,3,5`` or a mix (``0-4,10``) -> sorted distinct seeds; at most ``MAX_SEEDS`` of them, counted
    before any is listed (``0-100000000`` is one line at once, not gigabytes of seeds)."""
    ranges: list[tuple[int, int]] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(part), int(part))
            if b < a:
                raise ValueError
        except ValueError:
            raise UserError(f"--seeds {text!r}: write seeds as 0-9, 0,3,5 or 0-4,10") from None
        ranges.append((a, b))
    count, reach = 0, None  # distinct seeds: the ranges merged, counted without listing them
    for a, b in sorted(ranges):
        start = a if reach is None else max(a, reach + 1)
        count += max(0, b - start + 1)
        reach = b if reach is None else max(reach, b)
    if count > MAX_SEEDS:
        raise UserError(f"--seeds {text[:60]!r}: {count} seeds, and a set runs at most {MAX_SEEDS} (each seed is a "
                        f"whole run); split it into sets of at most {MAX_SEEDS} (0-{MAX_SEEDS - 1}, "
                        f"{MAX_SEEDS}-{2 * MAX_SEEDS - 1}, ...)")
    seeds = {s for a, b in ranges for s in range(a, b + 1)}
    if not seeds or min(seeds) < 0:
        raise UserError(f"--seeds {text!r}: give at least one seed >= 0")
    return sorted(seeds)


def seeds_spec(config: Optional[str | Path], overrides: list[str], seeds: list[int]) -> SweepSpec:
    """One config (None: the defaults) over several seeds, as a grid sweep whose trials are named seed-<n>."""
    if config is not None:
        from raysim.catalog import resolve

        config = resolve(config)  # a file, or a shipped experiment by name
    fixed = [o for o in overrides if not o.startswith("seed=")]
    base_cfg = load_config(config, fixed)
    spec = SweepSpec(base=str(Path(config).resolve()) if config else None, space={"seed": {"grid": list(seeds)}},
                     fixed=fixed, metric="acc_mean", naming="seed", dir=base_cfg.log.dir)
    check_spec(spec)
    return spec


def run_seeds(config: Optional[str | Path], overrides: list[str], seeds: list[int], *,
              resume_dir: Optional[Path] = None,
              quiet: bool = False, out: Callable[[str], None] = print) -> SweepResult:
    """``raysim run CONFIG --seeds 0-9``: each seed's run in PARENT/seed-<n>, in parallel where it fits."""
    if resume_dir is not None:
        spec = spec_from_yaml(Path(resume_dir) / "sweep.yaml")
        return run_sweep(spec, sweep_dir=Path(resume_dir), resume=True, quiet=quiet, out=out)
    spec = seeds_spec(config, overrides, seeds)
    return run_sweep(spec, quiet=quiet, out=out)
