"""scaffold's config keys (``algorithm.*``), apart from its hooks in ``raysim/algorithms/scaffold.py``: loading a
config (``raysim config show``/``keys``) reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.algorithms.configs.fedopt import FedOptConfig
from raysim.config import ExperimentConfig, require

CONTROLS = (1, 2)


@dataclass
class SCAFFOLDConfig(FedOptConfig):
    name: str = "scaffold"
    server_lr: float = 1.0  # η_g, the global step size
    control: int = 2  # which update of c_i: 2 (option II, from the model's move) or 1 (the full local gradient at x)

    def validate(self) -> None:
        super().validate()
        require(self.control in CONTROLS, "algorithm.control", f"must be 1 or 2 (the paper's options), got "
                f"{self.control!r}")

    def config_warnings(self, cfg: ExperimentConfig) -> list[str]:
        """Option II reads the average corrected gradient off the model's move as if every step were plain SGD."""
        t = cfg.train
        if self.control != 2 or (t.optimizer == "sgd" and t.momentum == 0):
            return []
        how = "train.optimizer=adam" if t.optimizer == "adam" else f"train.momentum={t.momentum}"
        return [f"scaffold's option II sets c_i = c_i - c + (x - y_i)/(K·train.lr), which assumes plain SGD steps; "
                f"with {how} the model moves further than K plain steps would, so the control variates overstate the "
                f"gradient (set train.momentum=0, or algorithm.control=1)"]
