"""Optional packages (``pip install 'raysim[EXTRA]'``): asking for a feature whose extra is not installed is a
one-line error that names the extra, raised before any work starts."""

from __future__ import annotations

import importlib.util

from raysim.errors import UserError

# extra -> (the module it brings, what it is for); the README's "Installing" lists the same
EXTRAS = {
    "optuna": ("optuna", "search.name=optuna (Optuna's TPE)"),
    "mlflow": ("mlflow", "log.mlflow (MLflow tracking)"),
    "wandb": ("wandb", "log.wandb (Weights & Biases)"),
    "privacy": ("dp_accounting", "differential privacy (dp-accounting's accountants)"),
}
# keys whose extra brings a second module of its own: key -> (module, what it is for)
MODULE_FOR_KEY = {"privacy.dpsgd": ("opacus", "DP-SGD's accountant (Opacus)")}


def require_extra(extra: str, key: str) -> None:
    """Refuse ``key`` in one line when the module of ``extra`` is not installed."""
    module, what = MODULE_FOR_KEY.get(key, EXTRAS[extra])
    if importlib.util.find_spec(module) is None:
        raise UserError(f"config key '{key}': {what} needs the optional package {module!r}, which is not "
                        f"installed: pip install 'raysim[{extra}]'")
