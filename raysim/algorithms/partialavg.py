"""PartialAvg (UNIDEAL's ablation): only the classification head is averaged; each client keeps its backbone.

At the start of a round a client's head is replaced by the global head, so heads of any backbone (and of any input
shape) can be averaged as long as ``model.feature_dim`` matches.
"""

from raysim.algorithms.aggregation import Uploads
from raysim.algorithms.base import Algorithm
from raysim.registry import register_algorithm


@register_algorithm("partialavg")
class PartialAvg(Algorithm):
    """Averages only the classification heads; each client keeps its own backbone."""

    shared = "head"
    vectorizable = True  # FedAvg's hooks: engine.vectorize can stack its clients
    uploads = Uploads.model()  # the head it downloaded, averaged
