"""One plan: a round's training as calls, by a pure function of the round's clients and the engine's settings.

The plan fixes everything that can change a number, from the config alone: the sum groups (``engine.sum_group``,
:func:`raysim.algorithms.aggregation.fixed_groups`) and the stacks (``engine.vectorize``), both in client-id
order, never from the workers or from timing. What it takes from measurement (how many short clients share a call,
``engine.clients_per_call=auto``) only changes how the same work is cut into calls, never the work:

- the units are the sum groups (or, when the uploads travel per client, the clients one by one);
- with stacks, consecutive whole units fill a call of at most the stack size (a group larger than a stack is a
  call of its own), trained in stacked computations of at most the stack size
  (:func:`raysim.engine.stack.train_stack`); each of its groups is still summed on its own;
- without, consecutive whole units fill a call of about :func:`clients_per_call` clients, trained one at a time.

The executors only dispatch the calls; which worker takes which call changes no number (each call's sums are
whole groups, and the driver adds the groups in group order as their calls come in: :class:`RoundSum`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from raysim.algorithms.aggregation import UploadSum, fixed_groups
from raysim.engine.jobs import EvalCall, EvalJob, TrainCall, TrainJob

TARGET_CALL_S = 0.02  # clients_per_call=auto: a call carries about this much measured client time
MAX_CLIENTS_PER_CALL = 64


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def cohort_size(num: int, fraction: float) -> int:
    """How many clients a round samples: ``clients.fraction`` of ``clients.num``, rounded half up, at least one."""
    return max(1, round_half_up(fraction * num))


def group_size(setting: str, num_clients: int) -> int:
    """Clients per group (``engine.sum_group``: auto or a number) when ``num_clients`` clients train in a round.

    ``auto``: about √(2n) groups. Each group's sum crosses to the driver as one float64 buffer (8 bytes a
    parameter) and the plan's last groups train a client a call (4 bytes a parameter each, for an even tail), so
    the bytes a round moves, about 8·(G − W) + 4·W·n/G parameters' worth for G groups on W workers, are least near
    G = √(W·n/2). The workers may not choose a number, so G is the one for four workers: for 10-1,000 clients it
    moves at most 1.5× the fewest bytes at 2-16 workers, where "at most 32 groups" moved up to 2.5×
    (tests/engine/test_plan.py). It depends on n alone, so it changes no number between executors
    (benchmarks/RESULTS.md: the CNN's rounds on two workers)."""
    if setting == "auto":
        groups = max(1, math.ceil(math.sqrt(2 * num_clients)))
        return max(1, math.ceil(num_clients / groups))
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


def plan_round(jobs: Sequence[TrainJob], states: Sequence[Any], *, sum_group: int, stack: int, per_call: int,
               weighting: str = "samples", workers: int = 1) -> list[TrainCall]:
    """The round's training calls, for ``jobs`` in client-id order with their state handles: ``sum_group`` > 0 sums
    uploads in fixed groups of that many clients (0: every upload travels); ``stack`` > 1 stacks up to that many
    clients a call (whole groups); otherwise calls of about ``per_call`` clients (whole groups).

    ``workers``: with more than one worker and one group a call, the last ``workers`` groups train one client a
    call (``part_of`` their group), so that the workers end a round within one client of each other, not within
    one group; the driver sums such a group from its uploads as a worker's ``UploadSum.add_results`` does
    (:class:`RoundSum`), so where a group is summed changes no number (only the cut depends on the worker count)."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].client_id)
    position = {jobs[i].client_id: i for i in order}
    clients = [jobs[i].client_id for i in order]
    units = fixed_groups(clients, sum_group) if sum_group > 0 else [[c] for c in clients]
    stacked = stack > 1 and not any(j.alone for j in jobs)  # a stage that needs the one-client loop (a step budget)
    packs = _pack(units, stack if stacked else per_call)
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
                               stacked=stacked, stack=stack if stacked else 0,
                               groups=tuple(len(u) for u in packed) if sum_group > 0 else (), weighting=weighting))
    return calls


class RoundSum:
    """The round's one sum, built while its calls run: results arrive in any order, and each call's is folded in
    call order (the plan's calls are in group order) as soon as every call before it has been, so the driver's
    additions overlap the workers' training instead of following the round's last call.

    A whole group's sum (taken where it trained) is merged; a split group's uploads (``part_of``: a client a call,
    in id order) are added into that group's own sum, which is merged once the group's last call is in. These are
    the operations, in the order, of summing every group and then adding the groups in group order
    (``UploadSum.merge`` in group order), so the bits are the same whoever finished first."""

    def __init__(self, calls: Sequence[TrainCall]):
        self._calls = calls
        self._waiting: dict[int, Any] = {}  # call index -> its CallResult, until every call before it is folded
        self._next = 0
        self._total = UploadSum()
        self._part: Optional[tuple[tuple[int, int], UploadSum]] = None  # the split group being summed

    def add(self, index: int, result: Any) -> None:
        """Call ``index``'s result (a ``CallResult``) is in."""
        self._waiting[index] = result
        while self._next in self._waiting:
            self._fold(self._calls[self._next], self._waiting.pop(self._next))
            self._next += 1

    def _fold(self, call: TrainCall, result: Any) -> None:
        group = None if call.part_of is None else (call.round, call.part_of)
        if self._part is not None and self._part[0] != group:
            self._total.merge(self._part[1])
            self._part = None
        if group is None:
            for total in result.sums:
                self._total.merge(total)
            return
        if self._part is None:
            self._part = (group, UploadSum())
        self._part[1].add_results(sorted(result.results, key=lambda r: r.client_id), call.weighting)

    def total(self) -> UploadSum:
        """The sum, once every call's result is in."""
        if self._next != len(self._calls):
            raise RuntimeError(f"the round's sum has {self._next} of {len(self._calls)} calls' results")
        if self._part is not None:
            self._total.merge(self._part[1])
            self._part = None
        return self._total


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
