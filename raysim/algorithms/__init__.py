"""Federated algorithms as small sets of hooks; see ``base.Algorithm``.

The hooks' names are loaded on first use (``base`` imports torch): the algorithms' config keys under
``raysim.algorithms.configs`` load without it, for ``raysim config show`` and every config check.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysim.algorithms.aggregation import Uploads
    from raysim.algorithms.base import (Algorithm, ClientContext, ClientUpdate, ServerContext, split_state,
                                        weighted_average)

__all__ = ["Algorithm", "ClientContext", "ClientUpdate", "ServerContext", "Uploads", "split_state",
           "weighted_average"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from raysim.algorithms import aggregation, base

        return getattr(base if hasattr(base, name) else aggregation, name)
    raise AttributeError(f"module 'raysim.algorithms' has no attribute {name!r}")
