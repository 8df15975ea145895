"""Attacks as a stage of the round (``raysim.stages``): ``attack.*`` by a seeded set of malicious clients.

- Attacks on the data (label flipping, the backdoor's trigger, and the backdoor that ``scaling`` boosts) change what
  a malicious client trains on, where it trains: the stage's client part poisons its split before its setup
  (:func:`raysim.robust.attacks.poison_train_data`), the poisoned rows drawn from (seed, client) alone.
- Attacks on the uploads change the malicious clients' updates on the server, on the round's rows before the rule
  reads them (:meth:`AttackStage.transform_rows`, :func:`raysim.robust.attacks.poison_updates`): the attackers
  collude and know the honest updates (ALIE, IPM need their statistics), as the field's threat model has them.
- The backdoor's success rate (``attack/asr``) is an evaluation of the global model on triggered test inputs, run
  through the executor like any other (:class:`BackdoorSuccess`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from raysim.robust.attacks import add_trigger, malicious_clients, poison_train_data, poison_updates
from raysim.seeds import ATTACK_STREAM, job_seed
from raysim.stages import ClientPart, RoundContext, Stage, StageEvaluation, StageSetup

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

ASR_SAMPLES = 2000  # the backdoor's success rate is measured on at most this many triggered test inputs


class _PoisonPart(ClientPart):
    """A malicious client's training data under ``attack.name``; the poisoned rows are drawn from (seed, client)
    alone, the same in every round."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg

    def setup(self, ctx: Any) -> None:
        attack = self.cfg.attack
        assert ctx.train_data is not None
        x, y, idx = ctx.train_data
        gen = torch.Generator().manual_seed(job_seed(self.cfg.seed, ctx.client_id, 0, ATTACK_STREAM))
        x, y = poison_train_data(attack.name, x, y, ctx.num_classes, target=attack.target, share=attack.poison_share,
                                 trigger=attack.trigger, gen=gen)
        ctx.train_data = (x, y, idx)


@dataclass
class BackdoorSuccess:
    """The share of triggered test inputs whose true class is not the target that the global model classifies as the
    target: the first ``ASR_SAMPLES`` such inputs of the clients' test splits, in client order, with the trigger."""

    target: int
    trigger: int
    clients: int

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
        return add_trigger(pooled, self.trigger) if len(pooled) else pooled

    def score(self, predictions: torch.Tensor) -> Optional[float]:
        return float((predictions == self.target).double().mean())


class AttackStage(Stage):
    """``attack.*`` (see the module docstring); the malicious set is a function of (seed, clients.num,
    attack.fraction) alone, the same on any number of workers and after a resume."""

    name = "attack"

    def __init__(self, cfg: ExperimentConfig):
        super().__init__(cfg)
        self.malicious = frozenset(malicious_clients(cfg.seed, cfg.clients.num, cfg.attack.fraction))

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

    def client_part(self, job: Any, params: Any) -> Optional[ClientPart]:
        return _PoisonPart(self.cfg) if self.cfg.attack.on_data and job.client_id in self.malicious else None

    def transform_rows(self, rows: Any, ctx: RoundContext) -> None:
        """The malicious clients' rows, poisoned as ``attack.name`` makes them (their own draws from (seed, client,
        round))."""
        cfg, attack = self.cfg, self.cfg.attack
        bad = [c in self.malicious for c in rows.clients]
        if not (attack.on_uploads and any(bad)):
            return
        gens = [torch.Generator().manual_seed(job_seed(cfg.seed, c, ctx.round, ATTACK_STREAM)) if b else None
                for c, b in zip(rows.clients, bad)]
        rows.rows = poison_updates(attack.name, rows.rows, bad, scale=attack.scale, sigma=attack.sigma, z=attack.z,
                                   epsilon=attack.epsilon, boost=attack.boost,
                                   server_lr=float(getattr(cfg.algorithm, "server_lr", 1.0) or 1.0), gens=gens)

    def evaluations(self, rnd: int) -> list[StageEvaluation]:
        attack = self.cfg.attack
        if not attack.backdoor:
            return []
        success = BackdoorSuccess(attack.target, attack.trigger, self.cfg.clients.num)
        return [StageEvaluation("attack/asr", success.inputs, success.score)]


def attack_stage(cfg: ExperimentConfig) -> Optional[Stage]:
    return AttackStage(cfg) if cfg.attack.on else None
