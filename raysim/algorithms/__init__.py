"""Federated algorithms as small sets of hooks; see ``base.Algorithm``."""

from raysim.algorithms.base import (Algorithm, ClientContext, ClientUpdate, ServerContext, average_updates,
                                    split_state, weighted_average)

__all__ = ["Algorithm", "ClientContext", "ClientUpdate", "ServerContext", "average_updates", "split_state",
           "weighted_average"]
