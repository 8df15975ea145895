"""Differential privacy: DP-FedAvg's clipping and noise (:mod:`raysim.privacy.central`), its accountant
(:mod:`raysim.privacy.accounting`, dp-accounting) and DP-SGD on clients (:mod:`raysim.privacy.dpsgd`), in the round as
stages (:mod:`raysim.privacy.stage`). The config section (:mod:`raysim.sections.privacy`) imports none of them."""
