"""The driver's robust round step: the malicious clients' uploads poisoned (``attack.*`` on the upload), then the
robust rule (``aggregator.*``) in place of the mean, and the backdoor's attack success rate.

The rule works on the updates Δ_i = upload_i − global of the floating-point entries, flattened into one float64
row per client in client-id order; the server step then receives global + rule(Δ) where it received the mean
(FedAvg takes it as the model, FedOpt steps towards it). Integer entries (batch norm's ``num_batches_tracked``)
take the plain weighted mean.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

from raysim.algorithms.aggregation import client_weight, flatten, unflatten, weighted_average
from raysim.robust.aggregators import aggregate
from raysim.robust.attacks import ATTACK_STREAM, add_trigger, malicious_clients, poison_updates
from raysim.robust.config import most_tolerated, tolerated

CENTER_KEY = "aggregator_center"  # centered_clip: the previous round's aggregate, kept in the server state
ASR_SAMPLES = 2000  # the backdoor's success rate is measured on at most this many triggered test inputs


class RobustStep:
    """What the driver does differently with ``aggregator.*`` or ``attack.*`` set (see the module docstring)."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        attack = cfg.attack
        self.malicious = set(malicious_clients(cfg.seed, cfg.clients.num, attack.fraction)) if attack.on else set()
        self._reduced_noticed = False
        self._asr_model: Any = None
        self._asr_data: Optional[torch.Tensor] = None

    def check(self, data: Any) -> None:
        """Refuse what the data rules out (a backdoor's target class beyond the data's classes)."""
        from raysim.errors import UserError

        attack = self.cfg.attack
        if attack.backdoor and attack.target >= data.num_classes:
            raise UserError(f"config key 'attack.target': must be a class of the data (0..{data.num_classes - 1}), "
                            f"got {attack.target}")

    @property
    def needs_uploads(self) -> bool:
        """Whether the round's uploads must reach the driver one by one (no sums where the clients trained)."""
        return bool(self.cfg.aggregator.on or self.cfg.attack.on_uploads)

    # ------------------------------------------------------------------ aggregation
    def mean(self, updates: list, server_state: dict, rnd: int, weighting: str) -> dict:
        """The aggregate that replaces the round's mean upload: global + rule(poisoned updates)."""
        from raysim.engine.core import job_seed

        cfg, agg, attack = self.cfg, self.cfg.aggregator, self.cfg.attack
        glob = server_state["model"]
        keys = [k for k, v in updates[0].upload.items() if v.is_floating_point() and k in glob]
        others = [k for k in updates[0].upload if k not in keys]
        layout, g = flatten({k: glob[k] for k in keys})
        rows = torch.stack([flatten({k: u.upload[k] for k in keys})[1] - g for u in updates])
        weights = torch.tensor([client_weight(u.num_samples, weighting) for u in updates], dtype=torch.float64)
        bad = [u.client_id in self.malicious for u in updates]
        if attack.on_uploads and any(bad):
            gens = [torch.Generator().manual_seed(job_seed(cfg.seed, u.client_id, rnd, ATTACK_STREAM)) if b else None
                    for u, b in zip(updates, bad)]
            rows = poison_updates(attack.name, rows, bad, scale=attack.scale, sigma=attack.sigma, z=attack.z,
                                  epsilon=attack.epsilon, boost=attack.boost,
                                  server_lr=float(getattr(cfg.algorithm, "server_lr", 1.0) or 1.0), gens=gens)
        n, f = rows.shape[0], tolerated(cfg)
        most = most_tolerated(agg.name, n)
        if most is not None and f > most:  # fewer updates than a round samples (dropouts, skipped non-finite ones)
            if not self._reduced_noticed:
                print(f"raysim: notice: round {rnd}: {agg.name} got {n} updates, which tolerate at most "
                      f"f={max(most, 0)} (aggregator.f={f}); such rounds use the largest f they allow",
                      file=sys.stderr, flush=True)
                self._reduced_noticed = True
            f = max(most, 0)
        if agg.name in ("krum", "multikrum") and n <= 2 * f + 2 or agg.name == "bulyan" and n <= 4 * f + 3:
            name = "median"  # too few updates for the rule at all, even with f = 0: the median is its limit
        else:
            name = agg.name
        m = None if agg.m is None else min(agg.m, n - f)
        center = server_state.get(CENTER_KEY) if agg.name == "centered_clip" else None
        out = aggregate(name, rows, weights, f=f, m=m, bound=agg.norm_bound, tau=agg.tau, iterations=agg.iterations,
                        center=center)
        if agg.name == "centered_clip":
            server_state[CENTER_KEY] = out.clone()
        model = unflatten(layout, g + out)
        if others:
            model.update(weighted_average([{k: u.upload[k] for k in others} for u in updates],
                                          [client_weight(u.num_samples, weighting) for u in updates]))
        return {k: model[k] for k in updates[0].upload}

    # ------------------------------------------------------------------ the backdoor's success rate
    def attack_success_rate(self, driver: Any) -> Optional[float]:
        """The share of triggered test inputs whose true class is not the target that the global model classifies
        as the target (``attack/asr``); None without a backdoor."""
        attack = self.cfg.attack
        if not attack.backdoor:
            return None
        from raysim.algorithms.base import load_entries
        from raysim.models import build_model

        data = driver.data
        if self._asr_model is None:
            xs = []
            taken = 0
            for cid in range(self.cfg.clients.num):
                if taken >= ASR_SAMPLES:
                    break
                if data.num_test(cid) == 0:
                    continue
                x, y, _ = data.tensors(cid, "test")
                x = x[y != attack.target][:ASR_SAMPLES - taken]
                xs.append(x)
                taken += len(x)
            pooled = torch.cat(xs) if xs else torch.zeros(0)
            self._asr_data = add_trigger(pooled, attack.trigger) if len(pooled) else pooled
            self._asr_model = build_model(self.cfg, self.cfg.model.for_client(0), data.input_shape(0),
                                          data.num_classes, 0, driver.algorithm)
        assert self._asr_data is not None
        if not len(self._asr_data):
            return None
        model = self._asr_model
        load_entries(model, driver.server_state["model"])
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(self._asr_data[b:b + 1024]).argmax(dim=1)
                              for b in range(0, len(self._asr_data), 1024)])
        return float((pred == attack.target).double().mean())
