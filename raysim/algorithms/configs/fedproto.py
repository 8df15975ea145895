"""fedproto's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/fedproto.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.config import AlgorithmConfig, is_finite, require


PREDICTS = ("classifier", "prototype")


AGGREGATIONS = ("count_weighted", "mean")


@dataclass
class FedProtoConfig(AlgorithmConfig):
    name: str = "fedproto"
    ld: float = 1.0  # λ, weight of the prototype regulariser (authors' lib/options.py: --ld default 1)
    predict: str = "classifier"  # classifier (own head) | prototype (nearest global prototype, the paper's inference)
    # count_weighted: C̄^j = Σ_i n_ij C_i^j / Σ_i n_ij | mean: each client holding class j weighs 1 (the authors'
    # lib/utils.py proto_aggregation)
    aggregation: str = "count_weighted"

    def validate(self) -> None:
        require(is_finite(self.ld, 0), "algorithm.ld", f"must be a finite number >= 0, got {self.ld}")
        require(self.predict in PREDICTS, "algorithm.predict",
                f"must be one of {', '.join(PREDICTS)}, got {self.predict!r}")
        require(self.aggregation in AGGREGATIONS, "algorithm.aggregation",
                f"must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}")
