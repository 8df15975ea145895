"""Attacks as a stage of the round (``raysim.stages``): ``attack.*`` by a seeded set of malicious clients.

- Attacks on the data (label flipping, the backdoor's trigger, the backdoor that ``scaling`` boosts, and the
  distributed backdoor, whose malicious clients each plant one part of the trigger) change what a malicious client
  trains on, where it trains: the stage's client part poisons its split before its setup
  (:func:`raysim.robust.attacks.poison_train_data`), the poisoned rows drawn from (seed, client) alone.
- Attacks on the uploads change the malicious clients' updates on the server, on the round's rows before the rule
  reads them (:meth:`AttackStage.transform_rows`, :func:`raysim.robust.attacks.poison_updates`): the attackers
  collude and know the honest updates (ALIE, IPM, min-max, min-sum, Fang et al.'s and mimic need them), as the
  field's threat model has them. Mimic's learnt direction and target are the stage's checkpoint state.
- The backdoor's success rate (``attack/asr``) is an evaluation of the global model on triggered test inputs (the
  distributed backdoor's: the global trigger, every part at once), run through the executor like any other
  (:class:`BackdoorSuccess`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from raysim.robust.attacks import (DBA_PARTS, add_bars, add_trigger, dba_bars, malicious_clients, mimic_direction,
                                   mimic_target, poison_train_data, poison_updates)
from raysim.seeds import ATTACK_STREAM, MIMIC_STREAM, job_seed
from raysim.stages import ClientPart, RoundContext, Stage, StageEvaluation, StageSetup

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

ASR_SAMPLES = 2000  # the backdoor's success rate is measured on at most this many triggered test inputs


class _PoisonPart(ClientPart):
    """A malicious client's training data under ``attack.name``; the poisoned rows are drawn from (seed, client)
    alone, the same in every round."""

    def __init__(self, cfg: ExperimentConfig, part: Optional[int] = None):
        self.cfg = cfg
        self.part = part  # dba: which local trigger this client plants

    def setup(self, ctx: Any) -> None:
        attack = self.cfg.attack
        assert ctx.train_data is not None
        x, y, idx = ctx.train_data
        gen = torch.Generator().manual_seed(job_seed(self.cfg.seed, ctx.client_id, 0, ATTACK_STREAM))
        bars = None if self.part is None else [dba_bars(attack.dba_size, attack.dba_gap)[self.part]]
        x, y = poison_train_data(attack.name, x, y, ctx.num_classes, target=attack.target, share=attack.poison_share,
                                 trigger=attack.trigger, gen=gen, bars=bars, bar_size=attack.dba_size)
        ctx.train_data = (x, y, idx)


@dataclass
class BackdoorSuccess:
    """The share of triggered test inputs whose true class is not the target that the global model classifies as the
    target: the first ``ASR_SAMPLES`` such inputs of the clients' test splits, in client order, with the trigger."""

    target: int
    trigger: int
    clients: int
    dba: Optional[tuple[int, int]] = None  # the distributed backdoor's (bar size, gap): its global trigger

    def inputs(self, data: Any) -> torch.Tensor:
        xs, taken = [], 0
        for cid in range(self.clients):
            if taken >= ASR_SAMPLES:
                break
            if data.num_test(cid) == 0:
                continue
            x, y, _ = data.tensors(cid, "test")
            x = x[y != self.target][:ASR_SAMPLES - taken]
            xs.append(x)
            taken += len(x)
        pooled = torch.cat(xs) if xs else torch.zeros(0)
        if not len(pooled):
            return pooled
        if self.dba is not None:
            return add_bars(pooled, dba_bars(*self.dba), self.dba[0])
        return add_trigger(pooled, self.trigger)

    def score(self, predictions: torch.Tensor) -> Optional[float]:
        return float((predictions == self.target).double().mean())


class AttackStage(Stage):
    """``attack.*`` (see the module docstring); the malicious set is a function of (seed, clients.num,
    attack.fraction) alone, the same on any number of workers and after a resume."""

    name = "attack"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self.malicious = frozenset(malicious_clients(cfg.seed, cfg.clients.num, cfg.attack.fraction))
        # mimic: rounds seen, the running honest mean μ, the direction z, the client copied (Karimireddy et al.)
        self.mimic: dict[str, Any] = {"t": 0, "mu": None, "z": None, "target": None}

    @property
    def needs_every_upload(self) -> bool:  # type: ignore[override]
        return bool(self.cfg.attack.on_uploads)

    def check(self, setup: StageSetup) -> None:
        """Refuse what the data rules out (a backdoor's target class beyond the data's classes)."""
        from raysim.errors import UserError

        attack = self.cfg.attack
        if attack.backdoor and attack.target >= setup.data.num_classes:
            raise UserError(f"config key 'attack.target': must be a class of the data (0..{setup.data.num_classes - 1})"
                            f", got {attack.target}")
        if attack.name == "dba":
            shapes = setup.data.input_shapes()
            high = 1 + (1 + attack.dba_gap)  # the rows the two bars down take
            wide = 2 * attack.dba_size + attack.dba_gap
            fits = all(len(s) == 3 and s[1] >= high and s[2] >= wide for s in shapes)
            if not fits:
                raise UserError(f"config key 'attack.dba_size': dba's global trigger (two bars of {attack.dba_size} "
                                f"pixels across, {attack.dba_gap} apart, and two rows {attack.dba_gap} apart) needs "
                                f"images of at least {high}x{wide}, and the data's inputs are "
                                f"{', '.join(str(list(s)) for s in sorted(shapes))}")

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        if not (self.cfg.attack.on_data and job.client_id in self.malicious):
            return None
        part = sorted(self.malicious).index(job.client_id) % DBA_PARTS if self.cfg.attack.name == "dba" else None
        return _PoisonPart(self.cfg, part)

    def transform_rows(self, rows: Any, ctx: RoundContext) -> None:
        """The malicious clients' rows, poisoned as ``attack.name`` makes them (their own draws from (seed, client,
        round))."""
        cfg, attack = self.cfg, self.cfg.attack
        bad = [c in self.malicious for c in rows.clients]
        if not (attack.on_uploads and any(bad)):
            return
        gens = [torch.Generator().manual_seed(job_seed(cfg.seed, c, ctx.round, ATTACK_STREAM)) if b else None
                for c, b in zip(rows.clients, bad)]
        copied = self._mimic(rows.rows, [c for c, b in zip(rows.clients, bad) if not b], bad) \
            if attack.name == "mimic" else None
        rows.rows = poison_updates(attack.name, rows.rows, bad, scale=attack.scale, sigma=attack.sigma, z=attack.z,
                                   z_rule=attack.z_rule, epsilon=attack.epsilon, boost=attack.boost,
                                   server_lr=float(getattr(cfg.algorithm, "server_lr", 1.0) or 1.0),
                                   weights=rows.weights, perturbation=attack.perturbation,
                                   gamma_init=attack.gamma_init, mimic=copied, gens=gens)

    def _mimic(self, x: torch.Tensor, honest_ids: list[int], bad: list[bool]) -> Optional[int]:
        """Which honest row the attackers copy this round: during the first ``attack.mimic_warmup`` rounds with
        attackers, the direction z is learnt and the target re-chosen each round (argmax ⟨h, z⟩); then the target is
        fixed (the authors' code). With clients sampled, a fixed target that is not in the round is replaced by
        this round's argmax (their workers all take part every round)."""
        if not honest_ids:
            return None
        honest = x[[i for i, b in enumerate(bad) if not b]]
        state = self.mimic
        if state["t"] < self.cfg.attack.mimic_warmup:
            z = state["z"]
            if z is None:  # their first z is a seeded standard normal draw
                gen = torch.Generator().manual_seed(job_seed(self.cfg.seed, 0, 0, MIMIC_STREAM))
                z = torch.randn(x.shape[1], generator=gen, dtype=torch.float64)
            state["mu"], state["z"] = mimic_direction(honest, state["mu"], z, state["t"])
            state["target"] = honest_ids[mimic_target(honest, state["z"])]
        elif state["target"] not in honest_ids:
            state["target"] = honest_ids[mimic_target(honest, state["z"])]
        state["t"] += 1
        return honest_ids.index(state["target"])

    def state(self) -> dict:
        if self.cfg.attack.name != "mimic":
            return {}
        return {"attack_mimic": dict(self.mimic)}

    def load(self, ckpt: dict) -> None:
        if self.cfg.attack.name == "mimic" and "attack_mimic" in ckpt:
            saved = ckpt["attack_mimic"]
            self.mimic = {"t": int(saved["t"]), "mu": saved["mu"], "z": saved["z"],
                          "target": None if saved["target"] is None else int(saved["target"])}

    def evaluations(self, rnd: int) -> list[StageEvaluation]:
        attack = self.cfg.attack
        if not attack.backdoor:
            return []
        dba = (attack.dba_size, attack.dba_gap) if attack.name == "dba" else None
        success = BackdoorSuccess(attack.target, attack.trigger, self.cfg.clients.num, dba)
        return [StageEvaluation("attack/asr", success.inputs, success.score)]


def attack_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return AttackStage(cfg) if cfg.attack.on else None
