"""Which of a private run's metrics are released and which are diagnostics (docs/reference.md, *Differential
privacy*, *What the metrics release*).

Under ``privacy.enabled`` or ``privacy.dpsgd``, every logged value is either released (a function of the noised
aggregate, of the mechanism's public parameters or of public data) or a non-private diagnostic, logged under
``nonprivate/`` in ``metrics.jsonl`` and TensorBoard. The diagnostics computed from un-noised client data:

- the clients' training loss and its parts (``loss``, ``loss_<part>``): each client's own samples, un-noised;
- which clients' non-finite updates were dropped (``skipped``, with ``engine.on_nonfinite=skip``), and so the
  bytes that reached the server (``bytes_up``, ``bytes_up_total``), which count the uploads;
- under Poisson sampling (``privacy.sampling=poisson``), the round's cohort: its size (``clients``) and the bytes
  that follow it (``bytes_up``, ``bytes_down`` and their totals): the accountant's amplification by sampling
  assumes that who took part stays secret;
- the exact share of unclipped clients (``nonprivate/unclipped``, logged there by the stage itself; the noised
  estimate that adaptive clipping uses is released as ``privacy/unclipped``);
- an algorithm's own metrics that its config names (``AlgorithmConfig.nonprivate_metrics``: FAPD's offline
  teacher's accuracy on the clients' samples).

The accuracies (``acc_*``, ``client_metrics.jsonl``, the backdoor's ``attack/asr``) keep their names: they measure
the released model on held-out test samples that no step of training, of the mechanism or (``privacy_refusal``) of
the server reads; like the test accuracy a DP paper reports, they are the experimenter's measurement, outside the
guarantee, and a deployment would have to make its federated evaluation private on its own.
"""

from __future__ import annotations

from typing import Any

PREFIX = "nonprivate/"
# under Poisson sampling: the cohort's size and what follows it
COHORT_KEYS = ("clients", "bytes_up", "bytes_down", "bytes_up_total", "bytes_down_total")


def nonprivate_keys(cfg: Any, metrics: dict) -> list[str]:
    """The keys of ``metrics`` computed from un-noised client data (see the module docstring)."""
    keys = [k for k in metrics if k == "loss" or k.startswith("loss_")]
    keys += list(cfg.algorithm.nonprivate_metrics(cfg))
    if cfg.engine.on_nonfinite == "skip":
        keys += ["skipped", "bytes_up", "bytes_up_total"]
    if cfg.privacy.enabled and cfg.privacy.sampling == "poisson":
        keys += list(COHORT_KEYS)
    return [k for k in dict.fromkeys(keys) if k in metrics]


def label(cfg: Any, metrics: dict) -> None:
    """Move the round's diagnostics under ``nonprivate/`` in place (a stage's ``label_metrics``)."""
    for key in nonprivate_keys(cfg, metrics):
        metrics[PREFIX + key] = metrics.pop(key)
