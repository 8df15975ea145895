"""Local training: every client trains only on its own data and nothing crosses the network (the baseline)."""

from raysim.algorithms.base import Algorithm
from raysim.registry import register_algorithm


@register_algorithm("local")
class Local(Algorithm):
    """No communication: every client trains alone (the baseline)."""

    shared = "none"
    vectorizable = True  # FedAvg's hooks: engine.vectorize can stack its clients
