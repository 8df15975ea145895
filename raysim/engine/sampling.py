"""Who takes part in a round, as pure functions of (seed, round): the sampled clients, the fixed evaluation clients,
and the memory check that refuses a cohort the driver cannot hold. Nothing here keeps state, so a resume needs no
saved RNG."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from raysim.engine.plan import cohort_size

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


def sample_clients(seed: int, round: int, num: int, fraction: float) -> list[int]:
    """The round's clients, a pure function of (seed, round): resuming needs no saved RNG state.

    numpy's ``Generator.choice(num, m, replace=False)`` draws by Floyd's algorithm (memory in ``m``) unless
    ``num > 10_000`` and ``m > num // 50``, where it shuffles the tail of ``arange(num)`` (8 bytes a client of the
    population). The draw is the same as ever; the whole population (``m == num``) needs no draw, since its sorted
    sample is every client; the sort is numpy's, not Python's over a list of ints."""
    return draw_clients(seed, round, num, cohort_size(num, fraction))


def draw_clients(seed: int, round: int, num: int, m: int) -> list[int]:
    """``m`` of ``num`` clients, sorted, a pure function of (seed, round): :func:`sample_clients`'s draw for a
    given count (a round with over-selection, ``system.over_selection``, draws more)."""
    if m >= num:
        return list(range(num))
    rng = np.random.default_rng([seed, round, 104729])
    return np.sort(rng.choice(num, size=m, replace=False)).tolist()


COHORT_BYTES_PER_CLIENT = 1024  # a floor for the driver's bookkeeping per sampled or evaluated client (its job,
# result and state entries; ~0.3 KiB for the job and state entries alone, measured), uploads not counted


def _available_memory() -> Optional[int]:
    """Bytes of memory available to start new work (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_cohort_fits(cfg: ExperimentConfig, available: Optional[int] = None) -> None:
    """Refuse, before anything starts, a round whose stack cannot fit in memory: the driver holds a job, a result
    and state entries per sampled client (and per evaluated client), and sampling more than 1/50 of a population
    past 10,000 clients takes 8 bytes per client of the population (see :func:`sample_clients`)."""
    from raysim.errors import UserError

    num, m = cfg.clients.num, cohort_size(cfg.clients.num, cfg.clients.fraction)
    evaluated = fixed_eval_count(num, cfg.eval.clients)
    need = (m + evaluated) * COHORT_BYTES_PER_CLIENT + (8 * num if num > 10_000 and num // 50 < m < num else 0)
    available = _available_memory() if available is None else available
    if available is None or need <= available:
        return
    gib = 1024 ** 3
    fits = max(1, available // (2 * COHORT_BYTES_PER_CLIENT))
    raise UserError(f"config key 'clients.fraction': clients.num={num} x clients.fraction={cfg.clients.fraction:g} "
                    f"samples {m} clients a round{f' and eval.clients evaluates {evaluated}' if evaluated else ''}: "
                    f"the driver needs at least {need / gib:.1f} GiB for that cohort, more than the "
                    f"{available / gib:.1f} GiB of memory available; sample at most about {fits} clients a round "
                    f"(clients.fraction={fits / num:.2g})")


AUTO_EVAL_ALL_MAX = 10_000  # eval.clients=auto evaluates every client of a federation up to this size,
AUTO_EVAL_CLIENTS = 1_000  # and a fixed seeded set of this many clients in a larger one


def fixed_eval_count(num: int, setting: str) -> int:
    """How many fixed clients ``eval.clients`` evaluates (0: the round's sampled clients)."""
    if setting == "sampled":
        return 0
    if setting == "auto":
        setting = "all" if num <= AUTO_EVAL_ALL_MAX else str(AUTO_EVAL_CLIENTS)
    return num if setting == "all" else min(int(setting), num)


def fixed_eval_clients(seed: int, num: int, setting: str) -> Optional[list[int]]:
    """The fixed clients that ``eval.clients`` evaluates (None: the round's sampled clients), drawn once from the
    seed, so that the driver's evaluation bookkeeping grows with the evaluated clients, not with ``clients.num``."""
    if setting == "sampled":
        return None
    size = fixed_eval_count(num, setting)
    if size == num:
        return list(range(num))
    rng = np.random.default_rng([seed, 15485863])
    return sorted(int(c) for c in rng.choice(num, size=size, replace=False))
