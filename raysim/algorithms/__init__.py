"""Federated algorithms as small sets of hooks; see ``base.Algorithm``."""

from raysim.algorithms.base import Algorithm, ClientContext, weighted_average

__all__ = ["Algorithm", "ClientContext", "weighted_average"]
