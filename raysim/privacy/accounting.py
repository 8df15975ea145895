"""DP-FedAvg's accountant, with dp-accounting (imported only when privacy is on).

One round is one subsampled Gaussian mechanism of noise multiplier z (σ_Δ and the count's σ_b combined, see
:mod:`raysim.privacy.central`), composed over the rounds:

- ``privacy.sampling=fixed`` (the default, what raysim does without privacy: ``clients.fraction x clients.num``
  clients drawn without replacement): ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))`` under RDP
  with replace-one neighbours (Wang, Balle and Kasiviswanathan 2019, Theorem 27). Replacing one client's data
  moves the clipped sum by up to 2S (add/remove moves it by S), hence z / 2: the noise over the sensitivity.
- ``privacy.sampling=poisson``: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add/remove-one neighbours,
  with RDP or PLD (``privacy.accountant``).

δ is ``privacy.delta``, else 0.01 / N (:func:`raysim.sections.privacy.central_delta`). z is fixed for a whole run,
resumes included: the checkpoint keeps it, so the accountant's history is (z, the rounds run).
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import numpy as np

from raysim.errors import UserError
from raysim.sections.privacy import MAX_NOISE, central_delta, clients_per_round
from raysim.runlog import quiet_logger

# calibration first searches z over the RDP orders up to this one (the cheap ones: the fixed-size bound of an
# order α costs O(α²) Python steps in dp-accounting, ~0.2 s for α = 256), then checks at the z it found that no
# order above it gives a smaller ε (else it searches again over more orders): the same z as a search over them all
CHEAP_ORDER = 12


def _quiet() -> contextlib.AbstractContextManager:
    """dp-accounting's RDP warns through absl's logger for every fractional order whose series does not converge at
    a large sampling rate, and leaves that order out (a looser, still valid bound): one such line per order, per
    call, would flood a run's stderr."""
    return quiet_logger("absl")


def delta_of(cfg: Any) -> float:
    """δ of the guarantee: privacy.delta, else 0.01 / clients.num."""
    return central_delta(cfg)


def round_event(cfg: Any, z: float) -> Any:
    """One round's DpEvent for the combined noise multiplier ``z``."""
    import dp_accounting as dpa

    if cfg.privacy.sampling == "poisson":
        return dpa.PoissonSampledDpEvent(float(cfg.clients.fraction), dpa.GaussianDpEvent(z))
    return dpa.SampledWithoutReplacementDpEvent(cfg.clients.num, clients_per_round(cfg), dpa.GaussianDpEvent(z / 2))


def relation_name(cfg: Any) -> str:
    """The neighbouring relation the logged ε is for (docs/reference.md, *Differential privacy*)."""
    return "add/remove-one user" if cfg.privacy.sampling == "poisson" else "replace-one user"


def fresh_accountant(cfg: Any, orders: Optional[list[float]] = None) -> Any:
    """An empty accountant of the run's kind; ``orders``: the RDP orders (None: dp-accounting's defaults)."""
    import dp_accounting as dpa
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    if cfg.privacy.accountant == "pld":
        return PLDAccountant()
    relation = (dpa.NeighboringRelation.ADD_OR_REMOVE_ONE if cfg.privacy.sampling == "poisson"
                else dpa.NeighboringRelation.REPLACE_ONE)
    return RdpAccountant(orders=orders, neighboring_relation=relation)


def epsilon(cfg: Any, z: float, rounds: int) -> float:
    """ε at δ after ``rounds`` rounds of noise multiplier ``z``."""
    if rounds <= 0:
        return 0.0
    import dp_accounting as dpa

    with _quiet():
        return float(fresh_accountant(cfg).compose(dpa.SelfComposedDpEvent(round_event(cfg, z), rounds))
                     .get_epsilon(delta_of(cfg)))


def one_round_rdp(cfg: Any, z: float, orders: Optional[list[float]] = None) -> tuple[np.ndarray, np.ndarray]:
    """(the RDP orders, one round's RDP at each) for noise multiplier ``z``: r rounds are r times it (RDP composes
    by addition, as ``RdpAccountant.compose`` of a ``SelfComposedDpEvent`` computes it)."""
    with _quiet():
        one = fresh_accountant(cfg, orders).compose(round_event(cfg, z))
    return np.asarray(one._orders), np.asarray(one._rdp)


def calibrate(cfg: Any) -> float:
    """The smallest noise multiplier z whose ε after ``rounds`` rounds is privacy.target_epsilon at δ
    (dp-accounting's mechanism_calibration); an unreachable target is one line."""
    return calibrated(cfg)[0]


def calibrated(cfg: Any) -> tuple[float, Optional[tuple[np.ndarray, np.ndarray]]]:
    """(:func:`calibrate`'s z, one round's RDP at z for :class:`RoundAccountant`, or None with PLD).

    With RDP, dp-accounting's search runs over the orders up to :data:`CHEAP_ORDER` first; one evaluation over
    every order at the z found then shows whether the order that gives the smallest ε is among them. If it is,
    no other order could allow a smaller z (each order's ε falls as z grows), so z is the search over every order's
    (within its tolerance); if not, the search runs again up to twice that order. On the shipped config this takes
    one full evaluation instead of a dozen (benchmarks/calibration.py)."""
    import dp_accounting as dpa
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS, compute_epsilon

    target, rounds, delta = float(cfg.privacy.target_epsilon), int(cfg.rounds), delta_of(cfg)
    every = [float(o) for o in DEFAULT_RDP_ORDERS]
    limit = CHEAP_ORDER if cfg.privacy.accountant == "rdp" else float("inf")
    while True:
        orders = [o for o in every if o <= limit] if cfg.privacy.accountant == "rdp" else None

        def accountant(orders: Optional[list[float]] = orders) -> Any:
            return fresh_accountant(cfg, orders)

        def rounds_event(x: float) -> Any:
            return dpa.SelfComposedDpEvent(round_event(cfg, x), rounds)

        with _quiet():
            reachable = accountant().compose(rounds_event(MAX_NOISE)).get_epsilon(delta) <= target
        if not reachable and orders is not None and len(orders) < len(every):
            limit = float("inf")  # fewer orders give a larger ε: ask all of them before refusing
            continue
        if not reachable:
            spent = epsilon(cfg, MAX_NOISE, rounds)
            raise UserError(f"config key 'privacy.target_epsilon': ε={target:g} at δ={delta:.3g} over {rounds} "
                            f"rounds is unreachable: even noise multiplier {MAX_NOISE:g} spends ε={spent:.3g}; raise "
                            f"the target, run fewer rounds or sample fewer clients")
        with _quiet():
            z = float(dpa.calibrate_dp_mechanism(accountant, rounds_event, target, delta,
                                                 dpa.ExplicitBracketInterval(1e-3, MAX_NOISE), tol=1e-4))
        if orders is None:  # PLD: the search above is dp-accounting's own, over its whole distribution
            while epsilon(cfg, z, rounds) > target:  # never spend more than the target
                z *= 1.0 + 1e-6
            return z, None
        all_orders, rdp = one_round_rdp(cfg, z)
        spent, best = compute_epsilon(all_orders, rounds * rdp, delta)
        if best <= limit and spent <= target:
            return z, (all_orders, rdp)
        limit = max(2.0 * float(best), 2.0 * limit)


class RoundAccountant:
    """ε after each round. RDP composes linearly (``RdpAccountant.compose`` adds count x one event's RDP), so one
    round's RDP is computed once and ε after r rounds is dp-accounting's ``compute_epsilon`` of r times it: the
    same number as composing r rounds afresh, at a fraction of the cost (sampling without replacement takes ~0.5 s
    an event here). PLD composes incrementally, and afresh after a resume."""

    def __init__(self, cfg: Any, z: float, rdp: Optional[tuple[np.ndarray, np.ndarray]] = None):
        self.cfg, self.z = cfg, float(z)
        self.delta = delta_of(cfg)
        self._event = round_event(cfg, z)
        self._accountant = fresh_accountant(cfg)
        self._rounds = 0
        self._rdp_one: Any = None
        if cfg.privacy.accountant == "rdp":
            self._orders, self._rdp_one = rdp if rdp is not None else one_round_rdp(cfg, self.z)

    def after(self, rounds: int) -> float:
        """ε at δ once ``rounds`` rounds have run."""
        import dp_accounting as dpa
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        if rounds <= 0:
            return 0.0
        if self._rdp_one is not None:
            return float(compute_epsilon(self._orders, rounds * self._rdp_one, self.delta)[0])
        if rounds < self._rounds:
            self._accountant, self._rounds = fresh_accountant(self.cfg), 0
        if rounds > self._rounds:
            with _quiet():
                self._accountant.compose(dpa.SelfComposedDpEvent(self._event, rounds - self._rounds))
            self._rounds = rounds
        return float(self._accountant.get_epsilon(self.delta))
