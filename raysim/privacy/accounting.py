"""DP-FedAvg's accountant, with dp-accounting (imported only when privacy is on).

One round is one subsampled Gaussian mechanism of noise multiplier z (σ_Δ and the count's σ_b combined, see
:mod:`raysim.privacy.central`), composed over the rounds:

- ``privacy.sampling=fixed`` (the default, what raysim does without privacy: ``clients.fraction x clients.num``
  clients drawn without replacement): ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))`` under RDP
  with replace-one neighbours (Wang, Balle and Kasiviswanathan 2019, Theorem 27). Replacing one client's data
  moves the clipped sum by up to 2S (add/remove moves it by S), hence z / 2: the noise over the sensitivity.
- ``privacy.sampling=poisson``: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add/remove-one neighbours,
  with RDP or PLD (``privacy.accountant``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from raysim.errors import UserError
from raysim.runlog import quiet_logger
from raysim.privacy.config import MAX_NOISE, clients_per_round


def _quiet() -> contextlib.AbstractContextManager:
    """dp-accounting's RDP warns through absl's logger for every fractional order whose series does not converge at
    a large sampling rate, and leaves that order out (a looser, still valid bound): one such line per order, per
    call, would flood a run's stderr."""
    return quiet_logger("absl")


def delta_of(cfg: Any) -> float:
    """δ of the guarantee: privacy.delta, else 1 / clients.num."""
    return float(cfg.privacy.delta) if cfg.privacy.delta is not None else 1.0 / cfg.clients.num


def round_event(cfg: Any, z: float) -> Any:
    """One round's DpEvent for the combined noise multiplier ``z``."""
    import dp_accounting as dpa

    if cfg.privacy.sampling == "poisson":
        return dpa.PoissonSampledDpEvent(float(cfg.clients.fraction), dpa.GaussianDpEvent(z))
    return dpa.SampledWithoutReplacementDpEvent(cfg.clients.num, clients_per_round(cfg), dpa.GaussianDpEvent(z / 2))


def fresh_accountant(cfg: Any) -> Any:
    import dp_accounting as dpa
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    if cfg.privacy.accountant == "pld":
        return PLDAccountant()
    relation = (dpa.NeighboringRelation.ADD_OR_REMOVE_ONE if cfg.privacy.sampling == "poisson"
                else dpa.NeighboringRelation.REPLACE_ONE)
    return RdpAccountant(neighboring_relation=relation)


def epsilon(cfg: Any, z: float, rounds: int) -> float:
    """ε at δ after ``rounds`` rounds of noise multiplier ``z``."""
    if rounds <= 0:
        return 0.0
    import dp_accounting as dpa

    with _quiet():
        return float(fresh_accountant(cfg).compose(dpa.SelfComposedDpEvent(round_event(cfg, z), rounds))
                     .get_epsilon(delta_of(cfg)))


def calibrate(cfg: Any) -> float:
    """The smallest noise multiplier z whose ε after ``rounds`` rounds is privacy.target_epsilon at δ
    (dp-accounting's mechanism_calibration); an unreachable target is one line."""
    import dp_accounting as dpa

    target, rounds, delta = float(cfg.privacy.target_epsilon), int(cfg.rounds), delta_of(cfg)
    if epsilon(cfg, MAX_NOISE, rounds) > target:
        raise UserError(f"config key 'privacy.target_epsilon': ε={target:g} at δ={delta:.3g} over {rounds} rounds is "
                        f"unreachable: even noise multiplier {MAX_NOISE:g} spends ε="
                        f"{epsilon(cfg, MAX_NOISE, rounds):.3g}; raise the target, run fewer rounds or sample fewer "
                        f"clients")
    with _quiet():
        z = dpa.calibrate_dp_mechanism(lambda: fresh_accountant(cfg),
                                       lambda x: dpa.SelfComposedDpEvent(round_event(cfg, x), rounds),
                                       target, delta, dpa.ExplicitBracketInterval(1e-3, MAX_NOISE), tol=1e-4)
    while epsilon(cfg, z, rounds) > target:  # Brent's root may sit a hair below: never spend more than the target
        z *= 1.0 + 1e-6
    return float(z)


class RoundAccountant:
    """ε after each round. RDP composes linearly (``RdpAccountant.compose`` adds count x one event's RDP), so one
    round's RDP is computed once and ε after r rounds is dp-accounting's ``compute_epsilon`` of r times it: the
    same number as composing r rounds afresh, at a fraction of the cost (sampling without replacement takes ~0.5 s
    an event here). PLD composes incrementally, and afresh after a resume."""

    def __init__(self, cfg: Any, z: float):
        self.cfg, self.z = cfg, float(z)
        self.delta = delta_of(cfg)
        self._event = round_event(cfg, z)
        self._accountant = fresh_accountant(cfg)
        self._rounds = 0
        self._rdp_one: Any = None
        if cfg.privacy.accountant == "rdp":
            with _quiet():
                one = fresh_accountant(cfg).compose(self._event)
            self._orders, self._rdp_one = one._orders, one._rdp

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
