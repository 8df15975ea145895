"""raysim: a Ray-based parallel simulation engine for federated learning research."""

from raysim.config import ExperimentConfig, load_config
from raysim.errors import RunStopped, UserError

__version__ = "0.1.0"
__all__ = ["ExperimentConfig", "load_config", "run", "RunStopped", "UserError", "__version__"]


def run(cfg: ExperimentConfig, **kwargs):
    """Run one experiment from Python; returns (run_dir, metrics rows, stopped_early). See engine.runner."""
    from raysim.engine.runner import run_experiment

    return run_experiment(cfg, **kwargs)
