"""Whether a client stays available for a whole job, and whether any client can ever report.

With ``system.availability.whole_job``, a client must be available over its job's whole span, from the start of its
download to the end of its upload: one whose availability ends first leaves mid-job and never reports, as in
FedScale's simulator, which drops a client that is no longer active when its job would complete
(github.com/SymbioticLab/FedScale, fedscale/cloud/aggregation/aggregator.py, ``tictak_client_tasks``), here checked
over the whole span rather than at its end. The span is checked in the same arithmetic as
:meth:`raysim.system.model.SystemModel.available_many`, mode by mode:

- ``always``: every client stays;
- ``diurnal``: on while (t + phase) mod period < on_share x period, so a client on at t0 stays until t1 when its
  position in the day at t0 plus (t1 - t0) is still below on_share x period (on_share 1: always on);
- ``trace``: the stretch of the client's intervals that holds t0 mod period, joined across touching intervals and
  across the period's end (an interval ending at the period and one starting at 0);
- ``onoff``: the two-state process's own events (the uniformisation of ``raysim.system.model``): the client stays
  when no event in [t0, t1) redraws its state off.

:func:`check_reachable` refuses, before round 1, a configuration in which no client can ever report: each client's
fastest job (its samples, the model's bytes each way) against the round's deadline or report timeout, and, with
``whole_job``, against the longest stretch its availability ever gives it (one line, exit 2).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from raysim.config import ConfigError
from raysim.system.model import CHUNK, MAX_EVENTS, ONOFF_AT, ONOFF_COUNT, ONOFF_STATE, PHASE, SystemModel, uniforms

ONOFF_NEVER = 1e-6  # an on/off client that would finish a job with a smaller chance never does (see longest_stretch)
_POISSON_CDF = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(MAX_EVENTS + 1)])


def stays_available(model: SystemModel, clients: np.ndarray, t0: float, t1: np.ndarray | float) -> np.ndarray:
    """Whether each of ``clients`` is available at every time in [t0, t1] (``t1``: one end per client, >= t0)."""
    clients = np.asarray(clients, dtype=np.int64)
    ends = np.broadcast_to(np.asarray(t1, dtype=np.float64), clients.shape)
    mode = model.cfg.availability.mode
    if mode == "always":
        return np.ones(len(clients), dtype=bool)
    ok = model.available_many(clients, t0)
    if mode == "diurnal":
        av = model.cfg.availability
        period, on = float(av.period_s), float(av.on_share) * float(av.period_s)
        if av.on_share >= 1:
            return ok
        position = np.mod(t0 + uniforms(model._keys[PHASE], clients) * period, period)
        return ok & (position + (ends - t0) < on)
    if mode == "trace":
        return ok & (np.array([_trace_reach(model, int(c), t0) for c in clients], dtype=np.float64) >= ends)
    return ok & _onoff_stays(model, clients, t0, ends)


def _trace_reach(model: SystemModel, client: int, t0: float) -> float:
    """The last time of the trace stretch that holds ``t0`` (inf: the client's intervals cover every time; -inf: it
    is not available at ``t0``)."""
    assert model._trace is not None
    owner, start, end, period = model._trace
    lo, hi = np.searchsorted(owner, client, side="left"), np.searchsorted(owner, client, side="right")
    if hi == lo:
        return -math.inf
    rows = sorted(zip(start[lo:hi].tolist(), end[lo:hi].tolist()))
    p = float(period[lo])
    at = float(np.mod(t0, p))
    base = t0 - at
    reach = max((e for s, e in rows if s <= at <= e), default=None)
    if reach is None:
        return -math.inf
    for _ in range(2):  # the stretch may run over the period's end once; twice round: it never ends
        grown = True
        while grown:
            grown = False
            for s, e in rows:
                if s <= reach < e:
                    reach, grown = e, True
        if reach < p or not any(s <= 0.0 for s, _ in rows):
            return base + reach
        base, reach = base + p, max(e for s, e in rows if s <= 0.0)
    return math.inf


def _onoff_stays(model: SystemModel, clients: np.ndarray, t0: float, ends: np.ndarray) -> np.ndarray:
    """No event of the on/off process in [t0, t1) draws the client off (its state at t0 aside): slot by slot, the
    events :meth:`SystemModel._onoff` draws (an event at e sets the state of every time after e)."""
    av = model.cfg.availability
    on, off = float(av.mean_on_s), float(av.mean_off_s)
    p_on, width = on / (on + off), 1.0 / (1.0 / on + 1.0 / off)
    first = int(math.floor(t0 / width))
    start_cut = t0 / width - first  # events at or after this point of the first slot are in the span
    last = np.floor(ends / width).astype(np.int64)
    end_cut = ends / width - last  # events before this point of a client's last slot are in the span
    stays: np.ndarray = np.ones(len(clients), dtype=bool)
    j = np.arange(MAX_EVENTS)
    slot = first
    todo = np.flatnonzero(last >= slot)
    while len(todo):
        c = clients[todo]
        count = np.minimum(np.searchsorted(_POISSON_CDF, uniforms(model._keys[ONOFF_COUNT], c, slot),
                                           side="right"), MAX_EVENTS)
        at = uniforms(model._keys[ONOFF_AT], c[:, None], slot, j[None, :])
        low = start_cut if slot == first else 0.0
        high = np.where(last[todo] == slot, end_cut[todo], 1.0)
        inside = (j[None, :] < count[:, None]) & (at >= low) & (at < high[:, None])
        drawn_off = uniforms(model._keys[ONOFF_STATE], c[:, None], slot, j[None, :]) >= p_on
        stays[todo[(inside & drawn_off).any(axis=1)]] = False
        slot += 1
        todo = todo[stays[todo] & (last[todo] >= slot)]
    return stays


def longest_stretch(model: SystemModel, clients: np.ndarray) -> np.ndarray:
    """The longest time each client's availability ever lasts without a break (inf: unbounded). The on/off
    process's stretches are exponential with mean ``mean_on_s``, so unbounded, but a job of d seconds outlasts its
    client's with probability exp(-d / mean_on_s): the stretch given is the one a job outlasts with probability
    ``ONOFF_NEVER`` (a run in which every job would fail more surely than that is treated as one that never
    reports)."""
    av = model.cfg.availability
    if av.mode == "diurnal" and av.on_share < 1:
        return np.full(len(clients), float(av.on_share) * float(av.period_s))
    if av.mode == "onoff":
        return np.full(len(clients), float(av.mean_on_s) * math.log(1.0 / ONOFF_NEVER))
    if av.mode != "trace":
        return np.full(len(clients), math.inf)
    assert model._trace is not None
    owner, start, _, _ = model._trace
    out = np.full(len(clients), -math.inf)
    for i, c in enumerate(np.asarray(clients).tolist()):
        lo, hi = np.searchsorted(owner, c, side="left"), np.searchsorted(owner, c, side="right")
        for s in start[lo:hi].tolist():  # every stretch begins where one of its intervals does
            reach = _trace_reach(model, c, s)
            out[i] = max(out[i], reach - s)
    return out


def check_reachable(model: SystemModel, samples: np.ndarray, bytes_each_way: int, limit_s: Optional[float],
                    limit_key: str, what: str) -> None:
    """Refuse a run in which no client can ever report: ``samples[c]`` is client c's work in samples x epochs (its
    smallest possible job), ``limit_s`` the longest a job may take to count (a deadline, a report timeout; None: no
    limit), named ``limit_key``; ``what`` names the job in the message. With ``whole_job``, a client's job must also
    fit within the longest stretch its availability gives it."""
    whole = bool(model.cfg.availability.whole_job)
    if limit_s is None and not whole:
        return
    strict = model.cfg.availability.mode == "diurnal"  # on while position < on_share x period: strictly inside
    best, who, best_fit, stretch_max = math.inf, -1, math.inf, -math.inf
    for a in range(0, model.num_clients, CHUNK):
        ids = np.arange(a, min(a + CHUNK, model.num_clients))
        tr = model.traits_many(ids)
        d = tr[:, 3] + bytes_each_way / tr[:, 1] + model.work(ids, samples[ids]) / tr[:, 0] + bytes_each_way / tr[:, 2]
        i = int(np.argmin(d))
        if d[i] < best:
            best, who = float(d[i]), int(ids[i])
        ok = d <= limit_s if limit_s is not None else np.ones(len(ids), dtype=bool)
        if whole:
            stretch = longest_stretch(model, ids)
            stretch_max = max(stretch_max, float(stretch.max()))
            ok &= d < stretch if strict else d <= stretch
            if ok.any():
                return
            best_fit = min(best_fit, float(d.min()))
        elif ok.any():
            return
    if limit_s is not None and best > limit_s:
        raise ConfigError(f"config key '{limit_key}': no client can meet a {limit_s:g} s {_LIMITS[limit_key]}: the "
                          f"fastest possible client time for {what} is {best:.4g} s (client {who}, {bytes_each_way} "
                          f"bytes each way); raise {limit_key} to at least {math.ceil(best * 1000) / 1000:g}")
    av = model.cfg.availability
    how = (f"on/off stretches last system.availability.mean_on_s={float(av.mean_on_s):g} s on average, so a client "
           f"stays for its job with probability exp(-{best_fit:.4g} / {float(av.mean_on_s):g}) < {ONOFF_NEVER:g}"
           if av.mode == "onoff" else f"the longest any client is available without a break is {stretch_max:.4g} s")
    raise ConfigError(f"config key 'system.availability.whole_job': no client stays available long enough to "
                      f"finish {what}, which takes at least {best_fit:.4g} s (with {bytes_each_way} bytes each "
                      f"way): {how}")


_LIMITS = {"system.deadline_s": "deadline", "system.report_timeout_s": "report timeout"}


# why an asynchronous job never reports (``raysim.engine.events.Flight.dropped``; 0: it reports)
DROPPED, LEFT, LATE = 1, 2, 3


def job_fate(model: SystemModel, client: int, seq: int, start: float, duration: float,
             timeout_s: Optional[float]) -> tuple[float, int]:
    """(when the asynchronous server frees job ``seq``'s slot, why the job never reports: 0 (it reports), DROPPED
    (``system.dropout``), LEFT (its client left mid-job, ``whole_job``) or LATE (it would report after
    ``system.report_timeout_s``)). A job that reports frees its slot when it finishes; one that never does, at the
    report timeout when there is one (the server cannot tell), else when it would have finished (the oracle)."""
    finish = start + duration
    if model.dropped(client, seq):
        why = DROPPED
    elif model.cfg.availability.whole_job and not stays_available(model, np.array([client]), start, finish)[0]:
        why = LEFT
    elif timeout_s is not None and duration > timeout_s:
        why = LATE
    else:
        return finish, 0
    return (start + timeout_s if timeout_s is not None else finish), why
