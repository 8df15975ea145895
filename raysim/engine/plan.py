"""One plan: a round's training as calls, by a pure function of the round's clients and the engine's settings.

The plan fixes everything that can change a number, from the config alone: the sum groups (``engine.sum_group``,
:func:`raysim.algorithms.aggregation.fixed_groups`) and the cohorts (``engine.vectorize``), both in client-id
order, never from the workers or from timing. What it takes from measurement (how many short clients share a call,
``engine.clients_per_call=auto``) only changes how the same work is cut into calls, never the work:

- the units are the sum groups (or, when the uploads travel per client, the clients one by one);
- with cohorts, consecutive whole units fill a call of at most the cohort size, trained as one stacked computation
  (:func:`raysim.engine.cohort.train_cohort`); each of its groups is still summed on its own;
- without, consecutive whole units fill a call of about :func:`clients_per_call` clients, trained one at a time.

The executors only dispatch the calls; which worker takes which call changes no number (each call's sums are
whole groups, and the driver adds the groups in group order).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from raysim.algorithms.aggregation import fixed_groups, sum_results
from raysim.engine.jobs import EvalCall, EvalJob, TrainCall, TrainJob

AUTO_GROUPS = 32  # engine.sum_group=auto: the round's clients in at most this many groups
TARGET_CALL_S = 0.02  # clients_per_call=auto: a call carries about this much measured client time
MAX_CLIENTS_PER_CALL = 64


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def cohort_size(num: int, fraction: float) -> int:
    """How many clients a round samples: ``clients.fraction`` of ``clients.num``, rounded half up, at least one."""
    return max(1, round_half_up(fraction * num))


def group_size(setting: str, num_clients: int) -> int:
    """Clients per group (``engine.sum_group``: auto or a number) when ``num_clients`` clients train in a round."""
    if setting == "auto":
        return max(1, math.ceil(num_clients / AUTO_GROUPS))
    return max(1, int(setting))


def clients_per_call(setting: str, client_s: Optional[float], clients: int, slots: int) -> int:
    """How many clients one call takes: ``engine.clients_per_call``, or with ``auto`` enough to make a call
    ~TARGET_CALL_S of measured work (``client_s``: the mean time of one client's update, None before any was
    measured: 1), never more than an even share of the round over the workers' ``slots`` (so no worker idles
    while another holds a long call)."""
    if setting != "auto":
        return max(1, int(setting))
    if client_s is None:
        return 1
    wanted = math.ceil(TARGET_CALL_S / max(client_s, 1e-4))
    share = math.ceil(clients / max(slots, 1))
    return max(1, min(wanted, share, MAX_CLIENTS_PER_CALL))


def _pack(units: list[list[int]], limit: int) -> list[list[list[int]]]:
    """Consecutive whole units, as many as fit ``limit`` clients (at least one a call)."""
    calls: list[list[list[int]]] = []
    size = 0
    for unit in units:
        if calls and size + len(unit) <= limit:
            calls[-1].append(unit)
            size += len(unit)
        else:
            calls.append([unit])
            size = len(unit)
    return calls


def plan_round(jobs: Sequence[TrainJob], states: Sequence[Any], *, sum_group: int, cohort: int, per_call: int,
               weighting: str = "samples", workers: int = 1) -> list[TrainCall]:
    """The round's training calls, for ``jobs`` in client-id order with their state handles: ``sum_group`` > 0 sums
    uploads in fixed groups of that many clients (0: every upload travels); ``cohort`` > 1 stacks up to that many
    clients a call (whole groups); otherwise calls of about ``per_call`` clients (whole groups).

    ``workers``: with more than one worker and one group a call, the last ``workers`` groups train one client a
    call (``part_of`` their group), so that the workers end a round within one client of each other, not within
    one group; the driver sums such a group from its uploads with the workers' own :func:`sum_results`, so where a
    group is summed changes no number (only the cut depends on the worker count)."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].client_id)
    position = {jobs[i].client_id: i for i in order}
    clients = [jobs[i].client_id for i in order]
    units = fixed_groups(clients, sum_group) if sum_group > 0 else [[c] for c in clients]
    stacked = cohort > 1 and all(j.max_samples is None for j in jobs)  # a step budget trains one client at a time
    packs = _pack(units, cohort if stacked else per_call)
    split = workers > 1 and sum_group > 1 and not stacked and per_call == 1
    split_from = len(packs) - workers if split else len(packs)
    calls = []
    for index, packed in enumerate(packs):
        members = [position[c] for unit in packed for c in unit]
        if index >= split_from:
            calls += [TrainCall(jobs=[jobs[i]], states=[states[i]], weighting=weighting, part_of=index)
                      for i in members]
            continue
        calls.append(TrainCall(jobs=[jobs[i] for i in members], states=[states[i] for i in members],
                               stacked=stacked, groups=tuple(len(u) for u in packed) if sum_group > 0 else (),
                               weighting=weighting))
    return calls


def round_sums(calls: Sequence[TrainCall], results: Sequence[Any]) -> list[Any]:
    """The round's group sums in group order from its calls' results (``CallResult``s, in call order): those the
    workers took, and each split group's (``part_of``) from its uploads, summed here by :func:`sum_results`, in id
    order, as its worker would have."""
    sums: list[Any] = []
    parts: dict[tuple[int, int], tuple[str, list[Any]]] = {}  # (round, group) -> (weighting, its clients' results)
    for call, result in zip(calls, results):
        if call.part_of is None:
            sums.extend(result.sums)
            continue
        key = (call.round, call.part_of)
        if key not in parts:
            parts[key] = (call.weighting, [])
            sums.append(key)  # its place in group order, filled below
        parts[key][1].extend(result.results)
    return [sum_results(sorted(parts[s][1], key=lambda r: r.client_id), parts[s][0]) if isinstance(s, tuple) else s
            for s in sums]


def plan_evaluation(clients: Sequence[int], rnd: int, shared_ref: Any, own: dict[int, Any],
                    state_of: Callable[[int], Any], slots: int) -> list[EvalCall]:
    """The evaluation of ``clients`` as calls: consecutive chunks, one per worker slot at most (each client's
    accuracy is its own, so the cut changes no number)."""
    n_chunks = max(1, min(len(clients), slots))
    chunks = [list(map(int, c)) for c in np.array_split(np.array(clients, dtype=np.int64), n_chunks) if len(c)]
    jobs = [EvalJob(client_ids=chunk, round=rnd, payload_ref=shared_ref,
                    own_payload_refs=[own.get(c) for c in chunk] if own else None) for chunk in chunks]
    return [EvalCall(job, [state_of(c) for c in job.client_ids]) for job in jobs]


def plan_server_test(client_id: int, rows: int, chunk: int, workers: int, rnd: int, payload: Any) -> list[EvalCall]:
    """The server's test split (``rows`` rows of the pseudo-client ``client_id``) as one call per worker, each of
    whole blocks of ``chunk`` rows (``eval.chunk``): a prediction is computed in the same block whatever the
    split, and the correct counts are integers, so their sum is the same however many calls there are."""
    blocks = -(-rows // chunk)
    parts = max(1, min(blocks, workers))
    return [EvalCall(EvalJob(client_ids=[client_id], round=rnd, payload_ref=payload,
                             rows=(chunk * (blocks * i // parts), min(rows, chunk * (blocks * (i + 1) // parts)))),
                     [None]) for i in range(parts)]
