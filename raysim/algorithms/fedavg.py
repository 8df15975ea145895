"""FedAvg (McMahan et al., 2017): the whole model is averaged, weighted by training-sample counts."""

from raysim.algorithms.base import Algorithm
from raysim.registry import register_algorithm


@register_algorithm("fedavg")
class FedAvg(Algorithm):
    """Federated averaging of the whole model, weighted by client sample counts."""

    shared = "all"
    vectorizable = True  # FedAvg's hooks: engine.vectorize can stack its clients
