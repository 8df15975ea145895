"""Each client's systems side, computed on demand: nothing is stored per client (a million clients cost what ten
do), except what the user's own files list (``system.csv``, an availability trace).

Every random draw is a counter-based hash: a uniform in (0, 1) from (seed, stream, client[, round or time slot]) by
splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014), in numpy's
unsigned 64-bit arithmetic (or, for one client, the same arithmetic on Python ints: :func:`uniform`), so one client or
a million at once give the same numbers, in any order.

- traits: lognormal (a median and a spread), device tiers with shares, or a CSV row;
- availability ``onoff``: the two-state Markov process (on -> off at rate 1/mean_on, off -> on at 1/mean_off),
  sampled exactly by uniformisation: at the events of a Poisson process of rate q = 1/mean_on + 1/mean_off the state
  is redrawn, on with probability mean_on / (mean_on + mean_off) whatever it was, so the state at time t is the one
  drawn at the last event before t. The events of each time slot of length 1/q come from the slot's own hash; the
  state at t needs only the slots back to the last event (1.6 on average). The start is the stationary law;
- availability ``diurnal``: on for ``on_share`` of every period, at a phase drawn per client (a time zone);
- availability ``trace``: intervals from a CSV or FedScale's client-behaviour trace, which repeats every
  ``finish_time`` as FedScale's ``ClientMetadata.is_active`` does (github.com/SymbioticLab/FedScale,
  fedscale/cloud/internal/client_metadata.py);
- dropout: a Bernoulli per (client, round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from raysim.seeds import derive_seed
from raysim.sections.system import SystemConfig
from raysim.system.files import _client_id, _fail, _number, _read_pickle_or_json, _read_rows

# stream tags: each kind of draw has its own
SPEED, DOWN, UP, LATENCY, TIER, ONOFF_COUNT, ONOFF_AT, ONOFF_STATE, PHASE, DROPOUT, SAMPLING, JOB_DRAW = range(1, 13)
Z90 = 1.2815515655446004  # the standard normal's 90th percentile: spread = exp(2 * Z90 * sigma)
MAX_EVENTS = 16  # onoff: events per slot kept (a slot holds more with probability < 1e-14)
CHUNK = 1 << 16  # clients per vectorised batch where a whole population is scanned
DRAW_CANDIDATES, DRAW_BATCH = 512, 64  # draw_client: candidates before the population is scanned; per vectorised batch

_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def uniforms(key: int, *counters: np.ndarray | int) -> np.ndarray:
    """Uniforms in (0, 1), one per element of the broadcast ``counters``, a pure function of (key, counters)."""
    parts = np.broadcast_arrays(*[np.asarray(c, dtype=np.int64) for c in counters])
    with np.errstate(over="ignore"):
        h = np.full(parts[0].shape, np.uint64(key), dtype=np.uint64)
        for part in parts:
            h = _mix(h ^ _mix(part.astype(np.uint64) + _GOLDEN))
    return ((h >> _S11).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


_MASK, _IM1, _IM2, _IGOLDEN = (1 << 64) - 1, int(_M1), int(_M2), int(_GOLDEN)


def _mix_int(z: int) -> int:
    """:func:`_mix` on one Python int (the same wrapping 64-bit arithmetic)."""
    z = ((z ^ (z >> 30)) * _IM1) & _MASK
    z = ((z ^ (z >> 27)) * _IM2) & _MASK
    return z ^ (z >> 31)


def hash_int(key: int, *counters: int) -> int:
    """The 64-bit hash behind :func:`uniform`, folded over the counters: ``hash_int(hash_int(k, a), b)`` is
    ``hash_int(k, a, b)``, so a prefix shared by many draws is hashed once."""
    h = key
    for c in counters:
        h = _mix_int(h ^ _mix_int(((c & _MASK) + _IGOLDEN) & _MASK))
    return h


def uniform(key: int, *counters: int) -> float:
    """``uniforms(key, *counters)`` for scalar counters, in plain Python ints: the same number, bit for bit (the
    event queue draws one client at a time, where numpy's per-call cost would dominate)."""
    return (float(hash_int(key, *counters) >> 11) + 0.5) * (1.0 / (1 << 53))


def stream_key(seed: int, stream: int) -> int:
    return derive_seed(seed, 36, stream, bits=64)


def lognormal_sigma(spread: float) -> float:
    """The log-scale standard deviation whose 90th / 10th percentile ratio is ``spread``."""
    return math.log(spread) / (2.0 * Z90)


TRAITS_KEPT = 1 << 16  # clients whose traits SystemModel.traits keeps at most


@dataclass(frozen=True)
class ClientTraits:
    speed: float  # samples trained per second
    down: float  # download bandwidth, bytes per second
    up: float  # upload bandwidth, bytes per second
    latency: float  # seconds a job spends before any byte moves


def job_duration(traits: ClientTraits, bytes_down: float, bytes_up: float, samples_times_epochs: float) -> float:
    """latency + bytes_down / down + samples x epochs / speed + bytes_up / up (simulated seconds)."""
    return (traits.latency + bytes_down / traits.down + samples_times_epochs / traits.speed
            + bytes_up / traits.up)


class SystemModel:
    """The systems side of ``num_clients`` clients under ``cfg`` (a :class:`SystemConfig`) and ``seed``: traits,
    availability, dropout and job durations, each computed when asked."""

    def __init__(self, cfg: SystemConfig, seed: int, num_clients: int):
        self.cfg, self.seed, self.num_clients = cfg, int(seed), int(num_clients)
        self._keys = {s: stream_key(self.seed, s) for s in range(1, JOB_DRAW + 1)}
        self._table: Optional[np.ndarray] = None  # traits=csv: (num_clients, 4) speed, down, up, latency
        self._trace: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = None
        if cfg.traits == "tiers":
            shares = np.array([t.share for t in cfg.tiers], dtype=np.float64)
            self._tier_edges = np.cumsum(shares) / shares.sum()
            self._tier_values = np.array([[t.speed, t.down, t.up, t.latency] for t in cfg.tiers], dtype=np.float64)
        if cfg.traits == "csv":
            self._table = self._read_traits(str(cfg.csv))
        if cfg.traits == "fedscale":
            from raysim.system.capacity import read_capacity

            self._table = read_capacity(str(cfg.capacity), self.num_clients)
        if cfg.traits == "lognormal":  # per trait: its stream's key, log-scale sigma and median (one client's draw)
            traits = (cfg.speed, cfg.down, cfg.up, cfg.latency)
            self._lognormal_keys = [self._keys[s] for s in (SPEED, DOWN, UP, LATENCY)]
            self._sigmas = np.array([lognormal_sigma(float(t.spread)) for t in traits])
            self._medians = np.array([float(t.median) for t in traits])
            self._all_spread = bool((self._sigmas > 0).all())  # no trait fixed at its median: z as drawn
        if cfg.availability.mode == "trace":
            self._trace = self._read_trace(str(cfg.availability.trace))
        self._traits_seen: dict[int, ClientTraits] = {}  # the event queue prices the same clients again and again
        # speed in FLOP/s: each client's model's training FLOPs per sample (one number, or one per client), set on the
        # driver before round 1 (raysim.system.flops); None: speeds are in samples per second
        self.sample_cost: Optional[float | np.ndarray] = None
        self._flops = cfg.speed_unit == "flops"

    # ------------------------------------------------------------------ files
    def _read_traits(self, path: str) -> np.ndarray:
        key, header = "system.csv", ("client_id", "speed", "down", "up", "latency")
        table = np.full((self.num_clients, 4), np.nan)
        for line, row in enumerate(_read_rows(key, path, header), start=2):
            cid = _client_id(key, path, line, row[0], self.num_clients)
            if not np.isnan(table[cid, 0]):
                raise _fail(key, path, f"line {line}: client {cid} is listed twice")
            values = [_number(key, path, line, name, text) for name, text in zip(header[1:], row[1:])]
            for name, value in zip(header[1:], values):
                if value < 0 or (value == 0 and name != "latency"):
                    raise _fail(key, path, f"line {line}: {name} must be {'>= 0' if name == 'latency' else '> 0'}, "
                                           f"got {value:g}")
            table[cid] = values
        missing = np.flatnonzero(np.isnan(table[:, 0]))
        if len(missing):
            raise _fail(key, path, f"lists {self.num_clients - len(missing)} of the {self.num_clients} clients "
                                   f"(client {int(missing[0])} is missing); it must list every client once")
        return table

    def _read_trace(self, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(client, start, end, period) per interval, sorted by client: a client is available at t when
        start <= t mod period <= end for one of its rows."""
        key = "system.availability.trace"
        rows: list[tuple[int, float, float, float]] = []
        if path.lower().endswith(".csv"):
            period = float(self.cfg.availability.period_s)
            for line, row in enumerate(_read_rows(key, path, ("client_id", "start_s", "end_s")), start=2):
                cid = _client_id(key, path, line, row[0], self.num_clients)
                start, end = (_number(key, path, line, n, t) for n, t in zip(("start_s", "end_s"), row[1:]))
                if not 0 <= start <= end <= period:
                    raise _fail(key, path, f"line {line}: an interval needs 0 <= start_s <= end_s <= "
                                           f"system.availability.period_s ({period:g}), got {start:g}, {end:g}")
                rows.append((cid, start, end, period))
        else:
            for cid, entry in self._fedscale_trace(key, path).items():
                rows.extend((cid, s, e, p) for s, e, p in entry)
        if not rows:
            raise _fail(key, path, "holds no availability interval")
        rows.sort()
        arr = np.array(rows, dtype=np.float64)
        return arr[:, 0].astype(np.int64), arr[:, 1], arr[:, 2], arr[:, 3]

    def _fedscale_trace(self, key: str, path: str) -> dict[int, list[tuple[float, float, float]]]:
        """FedScale's client-behaviour trace (its docs/Device Trace File Formats: ``{client_id: {'active': [INT],
        'inactive': [INT], 'finish_time': INT, ...}}``), as a pickle or as JSON."""
        raw = _read_pickle_or_json(key, path, "a trace (a CSV client_id,start_s,end_s, or FedScale's layout as .pkl "
                                               "or .json)")
        if not isinstance(raw, dict):
            raise _fail(key, path, "must map client ids to {active, inactive, finish_time} (FedScale's layout)")
        out: dict[int, list[tuple[float, float, float]]] = {}
        for client, entry in raw.items():
            cid = _client_id(key, path, 0, int(client) if str(client).lstrip("-").isdigit() else client,
                             self.num_clients)
            try:
                active = [float(v) for v in entry["active"]]
                inactive = [float(v) for v in entry["inactive"]]
                period = float(entry["finish_time"])
            except (KeyError, TypeError, ValueError):
                raise _fail(key, path, f"client {cid}'s entry needs active and inactive lists and a finish_time "
                                       f"(FedScale's layout)") from None
            if len(active) != len(inactive) or not math.isfinite(period) or period <= 0 \
                    or any(not (math.isfinite(a) and math.isfinite(b) and a <= b) for a, b in zip(active, inactive)):
                raise _fail(key, path, f"client {cid}'s entry needs as many active as inactive times, each "
                                       f"active <= inactive, and a finish_time > 0")
            out[cid] = [(a, b, period) for a, b in zip(active, inactive)]
        return out

    # ------------------------------------------------------------------ traits
    def traits_many(self, clients: np.ndarray) -> np.ndarray:
        """(len(clients), 4): speed, down, up, latency of each client, vectorised."""
        clients = np.asarray(clients, dtype=np.int64)
        if self._table is not None:
            return self._table[clients]
        if self.cfg.traits == "tiers":
            tier = np.searchsorted(self._tier_edges, uniforms(self._keys[TIER], clients), side="right")
            return self._tier_values[np.minimum(tier, len(self._tier_values) - 1)]
        from scipy.special import ndtri

        out = np.empty((len(clients), 4), dtype=np.float64)
        for col, (stream, trait) in enumerate(((SPEED, self.cfg.speed), (DOWN, self.cfg.down), (UP, self.cfg.up),
                                               (LATENCY, self.cfg.latency))):
            sigma = lognormal_sigma(float(trait.spread))
            z = ndtri(uniforms(self._keys[stream], clients)) if sigma > 0 else 0.0
            with np.errstate(over="ignore"):  # an absurd spread: inf, refused by clock.check_job_times
                out[:, col] = float(trait.median) * np.exp(sigma * z)
        return out

    def traits(self, client_id: int) -> ClientTraits:
        """One client's traits: :meth:`traits_many`'s numbers, with lognormal traits drawn by :func:`uniform` (the
        same elementwise operations on the client's four draws at once). Kept once drawn, for up to
        ``TRAITS_KEPT`` clients (then all are forgotten and kept afresh): the event queue prices a client at every
        job it starts, and a client's traits are a pure function of (seed, client), so a kept one is the same
        number; the bound keeps a million-client run's memory flat."""
        kept = self._traits_seen.get(client_id)
        if kept is not None:
            return kept
        if len(self._traits_seen) >= TRAITS_KEPT:
            self._traits_seen.clear()
        traits = self._traits_seen[client_id] = self._draw_traits(client_id)
        return traits

    def _draw_traits(self, client_id: int) -> ClientTraits:
        if self.cfg.traits != "lognormal":
            speed, down, up, latency = self.traits_many(np.array([client_id]))[0]
            return ClientTraits(float(speed), float(down), float(up), float(latency))
        from scipy.special import ndtri

        z = ndtri(np.array([uniform(key, client_id) for key in self._lognormal_keys]))
        if not self._all_spread:
            z = np.where(self._sigmas > 0, z, 0.0)
        speed, down, up, latency = (self._medians * np.exp(self._sigmas * z)).tolist()
        return ClientTraits(speed, down, up, latency)

    def work(self, clients: np.ndarray | int, samples: np.ndarray | float) -> np.ndarray | float:
        """``samples`` (x epochs) of ``clients`` in the unit of ``system.speed``: as they are (samples/s), or times
        each client's model's training FLOPs per sample (FLOP/s)."""
        if not self._flops:
            return samples
        cost = self.sample_cost
        if cost is None:
            raise RuntimeError("system.speed_unit=flops: the model's FLOPs per sample were not measured")
        return samples * (cost if np.ndim(cost) == 0 else np.asarray(cost)[clients])

    def duration(self, client_id: int, bytes_down: float, bytes_up: float, samples_times_epochs: float) -> float:
        """Simulated seconds of one job: latency + bytes_down / down + samples x epochs / speed + bytes_up / up."""
        return job_duration(self.traits(client_id), bytes_down, bytes_up,
                            float(self.work(client_id, samples_times_epochs)))

    def samples_within(self, client_id: int, bytes_down: float, bytes_up: float, seconds: float) -> int:
        """How many samples the client trains in a job that must end within ``seconds`` (0: not even the
        transfers fit): floor((seconds - latency - bytes_down / down - bytes_up / up) x speed) (over the FLOPs a
        sample costs, with speed in FLOP/s)."""
        t = self.traits(client_id)
        left = seconds - t.latency - bytes_down / t.down - bytes_up / t.up
        per_sample = float(self.work(client_id, 1.0))
        return max(0, int(math.floor(left * t.speed / per_sample if self._flops else left * t.speed))) \
            if left > 0 else 0

    # ------------------------------------------------------------------ availability and dropout
    def available_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        """Whether each of ``clients`` is available at simulated time ``t`` (seconds >= 0), vectorised."""
        clients = np.asarray(clients, dtype=np.int64)
        av = self.cfg.availability
        if av.mode == "always":
            return np.ones(len(clients), dtype=bool)
        if av.mode == "diurnal":
            period = float(av.period_s)
            phase = uniforms(self._keys[PHASE], clients) * period
            return np.mod(t + phase, period) < float(av.on_share) * period
        if av.mode == "onoff":
            return self._onoff(clients, float(t))
        assert self._trace is not None
        owner, start, end, period = self._trace
        lo, hi = np.searchsorted(owner, clients, side="left"), np.searchsorted(owner, clients, side="right")
        out = np.zeros(len(clients), dtype=bool)
        for i in np.flatnonzero(hi > lo):
            rows = slice(lo[i], hi[i])
            at = np.mod(t, period[rows])
            out[i] = bool(np.any((start[rows] <= at) & (at <= end[rows])))
        return out

    def available(self, client_id: int, t_seconds: float) -> bool:
        """One client's :meth:`available_many`; ``always`` and ``diurnal`` in scalar arithmetic (the same IEEE
        operations: for t, phase >= 0 Python's float % and numpy's mod are both fmod)."""
        av = self.cfg.availability
        if av.mode == "always":
            return True
        if av.mode == "diurnal":
            period = float(av.period_s)
            return (t_seconds + uniform(self._keys[PHASE], client_id) * period) % period < float(av.on_share) * period
        return bool(self.available_many(np.array([client_id]), t_seconds)[0])

    def available_all(self, t: float) -> np.ndarray:
        """Every client available at ``t``, in id order: the population scanned in chunks of CHUNK."""
        return np.concatenate([np.flatnonzero(self.available_many(np.arange(a, min(a + CHUNK, self.num_clients)), t))
                               + a for a in range(0, self.num_clients, CHUNK)])

    def draw_client(self, draw: tuple[int, ...], t: float, skip: set | dict) -> Optional[int]:
        """A client uniformly among those available at ``t`` and not in ``skip``, or None when none is; a pure
        function of (seed, ``draw``, t, skip). Candidate i is floor(u_i x num_clients), u_i = ``uniform`` of (the
        JOB_DRAW key, *draw, i): the first available one is taken, checked one at a time where that is cheap
        (``always``, ``diurnal``: most draws take the first candidate, at a few microseconds), else in vectorised
        batches; after DRAW_CANDIDATES, the population is scanned and one of the eligible drawn by u_DRAW_CANDIDATES.
        (A counter hash, not a seeded generator per draw: constructing one cost ~25 us, a job's whole draw now.)"""
        prefix, num = hash_int(self._keys[JOB_DRAW], *draw), self.num_clients
        if self.cfg.availability.mode in ("always", "diurnal"):
            for i in range(DRAW_CANDIDATES):
                cid = min(int(uniform(prefix, i) * num), num - 1)
                if cid not in skip and self.available(cid, t):
                    return cid
        else:
            for a in range(0, DRAW_CANDIDATES, DRAW_BATCH):
                batch = np.minimum((uniforms(prefix, np.arange(a, a + DRAW_BATCH)) * num).astype(np.int64), num - 1)
                for cid, ok in zip(batch.tolist(), self.available_many(batch, t).tolist()):
                    if ok and cid not in skip:
                        return cid
        eligible = [c for c in self.available_all(t).tolist() if c not in skip]
        if not eligible:
            return None
        return eligible[min(int(uniform(prefix, DRAW_CANDIDATES) * len(eligible)), len(eligible) - 1)]

    def _onoff(self, clients: np.ndarray, t: float) -> np.ndarray:
        """The on/off process by uniformisation (module docstring): slot by slot back from t's slot, the state drawn
        at the last event before t; before time 0, the stationary state."""
        av = self.cfg.availability
        on, off = float(av.mean_on_s), float(av.mean_off_s)
        rate = 1.0 / on + 1.0 / off
        p_on, width = on / (on + off), 1.0 / rate
        slot = np.full(len(clients), int(math.floor(t / width)), dtype=np.int64)
        cutoff = np.full(len(clients), t / width - math.floor(t / width))  # events before this point of the slot
        state = np.zeros(len(clients), dtype=bool)
        todo = np.arange(len(clients))
        poisson_cdf = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(MAX_EVENTS + 1)])
        j = np.arange(MAX_EVENTS)
        while len(todo):
            c, s = clients[todo], slot[todo]
            before_start = s < 0
            if before_start.any():
                idx = todo[before_start]
                state[idx] = uniforms(self._keys[ONOFF_STATE], clients[idx], -1, -1) < p_on
            live = ~before_start
            todo, c, s = todo[live], c[live], s[live]
            if not len(todo):
                break
            count = np.minimum(np.searchsorted(poisson_cdf, uniforms(self._keys[ONOFF_COUNT], c, s),
                                               side="right"), MAX_EVENTS)
            at = uniforms(self._keys[ONOFF_AT], c[:, None], s[:, None], j[None, :])
            usable = (j[None, :] < count[:, None]) & (at < cutoff[todo][:, None])
            last = np.where(usable, at, -1.0).argmax(axis=1)
            found = usable[np.arange(len(todo)), last]
            idx = todo[found]
            state[idx] = uniforms(self._keys[ONOFF_STATE], c[found], s[found], last[found]) < p_on
            todo = todo[~found]
            slot[todo] -= 1
            cutoff[todo] = 1.0
        return state

    def available_share(self) -> float:
        """The mean over clients of the share of time each is available: on_share (diurnal), the on-state's
        stationary probability (onoff), the share of its period a trace's intervals cover (0 for a client the trace
        does not list, or whose intervals have no length or fall outside its period)."""
        av = self.cfg.availability
        if av.mode == "always":
            return 1.0
        if av.mode == "diurnal":
            return float(av.on_share)
        if av.mode == "onoff":
            return float(av.mean_on_s) / (float(av.mean_on_s) + float(av.mean_off_s))
        assert self._trace is not None
        covered: dict[int, list[tuple[float, float, float]]] = {}
        for cid, start, end, period in zip(*(a.tolist() for a in self._trace)):
            covered.setdefault(cid, []).append((max(start, 0.0), min(end, period), period))
        share = 0.0
        for spans in covered.values():  # the union of each client's intervals within [0, period]
            reach, length = -math.inf, 0.0
            for start, end, _ in sorted(spans):
                if end > max(start, reach):
                    length += end - max(start, reach)
                reach = max(reach, end)
            share += length / spans[0][2]
        return share / self.num_clients

    def dropped(self, client_id: int, round: int) -> bool:
        """Whether the client, having started ``round``, never reports (probability ``system.dropout``)."""
        p = float(self.cfg.dropout)
        return p > 0 and uniform(self._keys[DROPOUT], client_id, round) < p

    def sample_available(self, round: int, t: float, count: int) -> list[int]:
        """``count`` clients drawn uniformly without replacement among those available at ``t`` (all of them when
        fewer are), sorted; a pure function of (seed, round, t). Candidates come from a seeded stream in batches
        and are kept in draw order while available; a population that yields too few this way is scanned."""
        if self.cfg.availability.mode == "always":
            raise ValueError("sample_available is for an availability process; always-available rounds sample as "
                             "the driver always has")
        rng = np.random.default_rng([self.seed, round, 104729, SAMPLING])
        chosen: dict[int, None] = {}
        drawn = 0
        while len(chosen) < count and drawn < 4 * self.num_clients:
            batch = rng.integers(0, self.num_clients, size=max(64, 4 * (count - len(chosen))))
            drawn += len(batch)
            for cid, ok in zip(batch.tolist(), self.available_many(batch, t).tolist()):
                if ok and cid not in chosen:
                    chosen[cid] = None
                    if len(chosen) == count:
                        break
        if len(chosen) < count:  # few available: the whole population, in chunks
            pool = self.available_all(t)
            if len(pool) <= count:
                return pool.tolist()
            return np.sort(rng.choice(pool, size=count, replace=False)).tolist()
        return sorted(chosen)

    def fastest(self, samples: np.ndarray, bytes_down: float, bytes_up: float, *,
                slowest: bool = False) -> tuple[float, int]:
        """(the shortest job any client can do, that client), or the longest with ``slowest``: ``samples[c]``
        samples x epochs for client c."""
        best, who, sign = math.inf, -1, -1.0 if slowest else 1.0
        for a in range(0, self.num_clients, CHUNK):
            ids = np.arange(a, min(a + CHUNK, self.num_clients))
            tr = self.traits_many(ids)
            with np.errstate(over="ignore", divide="ignore"):
                d = sign * (tr[:, 3] + bytes_down / tr[:, 1] + self.work(ids, samples[ids]) / tr[:, 0]
                            + bytes_up / tr[:, 2])
            i = int(np.argmin(d))
            if d[i] < best or who < 0:
                best, who = float(d[i]), int(ids[i])
        return sign * best, who
