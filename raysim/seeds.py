"""Seeds, in one torch-free place: every random draw of a run comes from (seed, client, round, stream tags) alone,
so a job gives the same numbers on any worker, in any order, after a resume.

The stream tags separate kinds of draws of the same (client, round); each subsystem's tag is named beside its code
and listed here so that none is given twice by accident (4 is shared, as it always was, by the asynchronous jobs'
tag and the attacks' own draws, which never meet in one run's job: attacks run in synchronous rounds only).
"""

from __future__ import annotations

import numpy as np

EVAL_STREAM, SERVER_STREAM, AUGMENT_STREAM = 1, 2, 3  # the client-job core: evaluation, server training, augmentation
ASYNC_STREAM = 4  # an asynchronous job, with its sequence number (raysim.engine.asynchronous)
ATTACK_STREAM = 4  # an attack's own draws: Gaussian updates, the poisoned rows (raysim.robust)
PRIVACY_STREAM = 37  # DP-FedAvg's noise on the round's sum (raysim.privacy.central)
DPSGD_STREAM = 38  # DP-SGD's noise on each step (raysim.privacy.dpsgd)
MIMIC_STREAM = 39  # the mimic attack's first random direction (raysim.robust.attack_stage)
BUCKET_STREAM = 40  # bucketing's shuffle of a round's updates (raysim.robust.rule_stage)
FLTRUST_STREAM = 41  # FLTrust: the root samples' draw and the server's own training each round (raysim.robust)
AUDIT_STREAM = 42  # the privacy audit's canaries: their directions and who joins a round (raysim.privacy.audit)
# issue 53's tags, numbered after it so that the tags other work adds next (43, 44, ...) cannot meet them
COMPRESS_STREAM = 531  # a compressed upload's draws: QSGD's rounding, random-k's coordinates (raysim.compression)
COMPRESS_DOWN_STREAM = 532  # a compressed download's draws, one per round (client 0) (raysim.compression)
SECAGG_STREAM = 533  # secure aggregation's simulated keys: pair and self mask seeds, the SecAgg+ graph (raysim.secagg)


def job_seed(seed: int, client_id: int, round: int, *stream: int) -> int:
    """Every (client, round) job draws its randomness from this seed alone, whichever worker runs it; a ``stream``
    tag separates the draws of evaluation, server-side training, noise and attacks from those of training."""
    return int(np.random.SeedSequence([seed, client_id, round, *stream]).generate_state(1)[0])


def derive_seed(*parts: int, bits: int = 32) -> int:
    """A ``bits``-bit (32 or 64) seed drawn from ``parts`` alone, by the same SeedSequence recipe as ``job_seed``:
    the seeds that are not a (client, round) job's (a model's initial weights, the system model's streams, a central
    training's) derive here, so no module keeps its own copy of the recipe."""
    dtype = np.uint64 if bits == 64 else np.uint32
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=dtype)[0])
