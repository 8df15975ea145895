"""One check of a loaded config against this machine, before anything slow starts (Ray, the data, torch's models).

``raysim run`` and ``raysim run --seeds`` call :func:`check` once the config has loaded (which already refused any
unknown key or bad value, and a plugin that does not import): the GPUs and CPUs a local Ray would be asked for, and
the files under ``data.root`` that the dataset reads. Every problem found goes into one message, with one line of
overrides that makes the command run here, so that a user fixes them all at once instead of meeting them one per
attempt. The engine keeps its own checks (against a real cluster's resources, the data's exact layout); this only
brings the common ones forward.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from raysim.catalog import LOCAL_DATASETS
from raysim.errors import UserError

# what the dataset's reader looks for first under data.root (raysim.data.images; the others read files at the root
# or in a folder named after them, checked by their readers)
_EXPECTED = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "tinyimagenet": "tiny-imagenet-200"}
DATA_ROOT_FIX = "data.root=/path/to/datasets"


def _local_gpus() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no usable torch CUDA: no GPU to offer
        return 0


def problems(cfg: Any, cpus: Optional[int] = None, gpus: Optional[int] = None,
             data: bool = True) -> list[tuple[str, str, str]]:
    """(key, what is wrong, the override that fixes it) for each problem; ``cpus`` / ``gpus``: this machine's
    (default: counted); ``data``: check ``data.root`` too (not on a resume, which cannot change it)."""
    from raysim.engine.backend import starts_local_ray

    out: list[tuple[str, str, str]] = []
    engine = cfg.engine
    if starts_local_ray(engine):
        cpus = (os.cpu_count() or 1) if cpus is None else cpus
        workers = engine.num_workers
        if engine.gpus_per_worker > 0:
            gpus = _local_gpus() if gpus is None else gpus
            if gpus == 0:
                out.append(("engine.gpus_per_worker", f"asks for {engine.gpus_per_worker:g} GPU per worker, but this "
                            f"machine has no GPU", "engine.gpus_per_worker=0"))
            else:
                per_gpu = math.floor(1 / engine.gpus_per_worker + 1e-9) if engine.gpus_per_worker < 1 else None
                fit = gpus * per_gpu if per_gpu else math.floor(gpus / engine.gpus_per_worker + 1e-9)
                if fit < workers:
                    out.append(("engine.num_workers", f"{workers} workers x {engine.gpus_per_worker:g} GPU do not "
                                f"fit on this machine's {gpus} GPU", f"engine.num_workers={max(1, fit)}"))
                    workers = max(1, fit)
        need = engine.num_workers * engine.cpus_per_worker + engine.driver_cpus
        if need > cpus + 1e-9:
            fit = max(1, math.floor((cpus - engine.driver_cpus) / engine.cpus_per_worker + 1e-9))
            driver = f" (+{engine.driver_cpus:g} for the driver)" if engine.driver_cpus else ""
            out.append(("engine.num_workers", f"{engine.num_workers} workers x {engine.cpus_per_worker:g} CPU"
                        f"{driver} = {need:g} CPU, but this machine has {cpus}",
                        f"engine.num_workers={min(fit, workers)}"))
    name = str(cfg.data.name)
    if data and name in LOCAL_DATASETS:
        root = cfg.data.root
        if not root:
            out.append(("data.root", f"{name} is read from local files, and data.root is not set", DATA_ROOT_FIX))
        elif not Path(root).expanduser().is_dir():
            holds = f"{_EXPECTED[name]}/" if name in _EXPECTED else name
            out.append(("data.root", f"{root} is not a directory (it should hold {holds})", DATA_ROOT_FIX))
        elif name in _EXPECTED and not (Path(root).expanduser() / _EXPECTED[name]).is_dir():
            out.append(("data.root", f"{root} has no {_EXPECTED[name]}/ ({name}, extracted)", DATA_ROOT_FIX))
    return out


def check(cfg: Any, command: Sequence[str] = (), data: bool = True) -> None:
    """Raise one UserError naming every problem of :func:`problems`, and ``command`` with the overrides that fix
    them, ready to paste; nothing when there is none."""
    found = problems(cfg, data=data)
    if not found:
        return
    fixes = list(dict.fromkeys(fix for _, _, fix in found))
    keys = {fix.split("=", 1)[0] for fix in fixes}
    kept = [part for part in command if part.split("=", 1)[0] not in keys]  # a fix replaces the user's own value
    paste = " ".join([*kept, *fixes])
    if len(found) == 1:  # one line, as every other refusal
        key, what, _ = found[0]
        raise UserError(f"config key '{key}': {what}; to run here: {paste}")
    lines = [f"{len(found)} problems before anything starts:"]
    lines += [f"  config key '{key}': {what}" for key, what, _ in found]
    lines.append(f"  to run here: {paste}")
    raise UserError("\n".join(lines))


# keys that decide which other keys exist (algorithm.mu only with algorithm.name=fedprox, a plugin's sections)
_SELECTORS = ("algorithm.name=", "model.name=", "data.name=", "plugins=")


def load_checked(config: Any, overrides: Sequence[str], **kwargs: Any) -> Any:
    """``load_config(config, overrides)``; when it refuses, every override that is wrong is named in one message
    (each tried with the overrides that choose the algorithm, model, dataset and plugins), not only the first."""
    from raysim.config import load_config

    try:
        return load_config(config, list(overrides), **kwargs)
    except UserError as first:
        def refusal(items: list[str]) -> Optional[str]:
            try:
                load_config(config, items, warn=False)
            except UserError as exc:
                return str(exc)
            return None

        selectors = [o for o in overrides if o.startswith(_SELECTORS)]
        errors = [e for e in (refusal([o]) for o in selectors) if e]
        good = [o for o in selectors if refusal([o]) is None]
        errors += [e for e in (refusal([*good, o]) for o in overrides if o not in selectors) if e]
        errors = list(dict.fromkeys(errors))
        if len(errors) < 2:
            raise
        raise UserError("\n".join([f"{len(errors)} problems in the overrides:", *(f"  {e}" for e in errors)])) \
            from first
