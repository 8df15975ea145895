"""raysim: a Ray-based parallel simulation engine for federated learning research.

The Python API mirrors the commands::

    import raysim
    result = raysim.run("experiments/smoke.yaml", "rounds=3", "train.lr=0.1", progress=True)
    result.run_dir, result.metrics, result.config     # Path, pandas.DataFrame (one row per round), config

Ray starts on the first call and stays up for the next ones (a notebook pays its start once).
"""

import sys
import types
from typing import Any

from raysim.api import RunResult, TuneResult, load_run, report, run, tune, warm_workers
from raysim.config import ExperimentConfig, load_config
from raysim.errors import RunStopped, UserError
from raysim.registry import register_algorithm, register_dataset, register_model

__version__ = "0.2.0"
__all__ = ["Algorithm", "ExperimentConfig", "RunResult", "RunStopped", "TuneResult", "UserError", "__version__",
           "load_config", "load_run", "register_algorithm", "register_dataset", "register_model", "report", "run",
           "tune", "warm_workers"]


class _Package(types.ModuleType):
    """``raysim.tune`` and ``raysim.report`` are the verbs, though the packages ``raysim/tune/`` and
    ``raysim/report/`` share their names: importing either (``from raysim.tune import ...``, which ``raysim.tune(...)``
    itself does) would make Python bind the package over the verb, and a notebook's second ``raysim.tune(...)``
    would call a module. The packages stay importable by name (``sys.modules``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("tune", "report") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    # Algorithm's module imports torch (~1 s); loaded on first use so that `import raysim` stays light
    if name == "Algorithm":
        from raysim.algorithms.base import Algorithm

        return Algorithm
    raise AttributeError(f"module 'raysim' has no attribute {name!r}")
