"""The ``aggregator`` and ``attack`` config sections: Byzantine-robust aggregation and the attacks it is measured
against (``raysim.robust``).

Off by default (``aggregator.name: mean``, ``attack.name: none``): then no key here changes any number a run
computes. Both sections are checked by :func:`check_robust`, which ``raysim.config`` calls with its ``require``
(this module imports nothing of raysim's config or of torch, so that loading a config stays light).

A robust aggregator replaces the server's mean of a model-averaging method (FedAvg, FedProx, the FedOpt family):
the rule is applied to the clients' updates Δ_i = upload_i − global model, and the server step then takes
global + rule(Δ) where it took the mean. Every rule but ``mean`` and ``norm_bound`` counts each client once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from raysim.validate import is_finite as _finite, is_whole as _whole

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multikrum", "bulyan", "norm_bound", "centered_clip",
               "geomed", "fltrust", "foolsgold")
# the rules a pre-aggregation step (aggregator.nnm, aggregator.bucket) cannot precede, and why
NO_PREAGGREGATION = {
    "mean": "the method's weighted mean, which mixing rows would only reweight",
    "norm_bound": "a weighted mean of each client's own clipped update",
    "fltrust": "scores each client's own update against the server's",
    "foolsgold": "weighs each client by the history of its own updates",
}
ROOT_SPLITS = ("server_holdout",)  # FLTrust's root dataset: the public splits a config may name
# attacks on the data, applied where the malicious client trains
DATA_ATTACKS = ("label_flip", "backdoor", "scaling", "dba")
# attacks on the upload, applied on the driver to the malicious clients' uploads before aggregation
MODEL_ATTACKS = ("sign_flip", "gaussian", "scaling", "alie", "ipm", "minmax", "minsum", "fang_krum", "fang_trim",
                 "mimic")
ATTACKS = ("none", "label_flip", "sign_flip", "gaussian", "scaling", "alie", "ipm", "backdoor", "minmax", "minsum",
           "fang_krum", "fang_trim", "mimic", "dba")
BACKDOOR_ATTACKS = ("backdoor", "scaling", "dba")  # the trigger is planted; the attack success rate is logged
ALIE_Z_RULES = ("baruch", "karimireddy")  # Baruch et al.'s z_max, or the form in Karimireddy et al.'s code
PERTURBATIONS = ("unit_vec", "sign", "std")  # min-max / min-sum's perturbation ∇p (Shejwalkar, Houmansadr 2021)


@dataclass
class AggregatorConfig:
    # mean (the method's own weighted mean) | median | trimmed_mean (Yin et al. 2018) | krum | multikrum (Blanchard
    # et al. 2017) | bulyan (El Mhamdi et al. 2018) | norm_bound (Sun et al. 2019) | centered_clip (Karimireddy et
    # al. 2021) | geomed (RFA, Pillutla et al. 2022) | fltrust (Cao et al. 2021) | foolsgold (Fung et al. 2020);
    # every rule but mean needs each upload on the server (the uploads are not summed where they trained)
    name: str = "mean"
    # Byzantine clients a round the rule tolerates (trimmed_mean trims f on each side; krum, multikrum, bulyan, nnm);
    # null: round(attack.fraction x clients a round) with an attack, else 0
    f: Optional[int] = None
    m: Optional[int] = None  # multikrum: how many of the best-scored updates are averaged (null: n - f)
    norm_bound: float = 5.0  # norm_bound: M, each update's L2 norm is clipped to it before the mean
    tau: float = 10.0  # centered_clip: the clipping radius τ (the authors' code takes it from --clip-tau)
    iterations: int = 3  # centered_clip: clipping iterations L around the moving centre (the authors' code: 3)
    maxiter: int = 4  # geomed: smoothed Weiszfeld iterations at most (the authors' code: 4)
    nu: float = 1e-5  # geomed: the smoothing ν, the least distance a weight divides by (the authors' code: 1e-5)
    # pre-aggregation steps on the rows, after the attacks and before the rule, in this order: nnm, then bucket
    nnm: bool = False  # nearest-neighbour mixing (Allouah et al. 2023): each row the mean of its n - f nearest
    bucket: Optional[int] = None  # bucketing (Karimireddy et al. 2022): means of s random rows each (null: off)
    # fltrust: the public split its root dataset comes from (server_holdout: data.server_holdout's samples)
    root: Optional[str] = None
    root_samples: Optional[int] = 100  # fltrust: root samples drawn from it (Cao et al.: 100; null: all of it)

    @property
    def on(self) -> bool:
        return self.name != "mean"


@dataclass
class AttackConfig:
    # none | label_flip | sign_flip | gaussian | scaling (model replacement of a backdoor) | alie | ipm | backdoor
    # | minmax | minsum (Shejwalkar, Houmansadr 2021) | fang_krum | fang_trim (Fang et al. 2020) | mimic
    # (Karimireddy et al. 2022) | dba (the distributed backdoor, Xie et al. 2020)
    name: str = "none"
    fraction: float = 0.2  # the malicious share of clients.num: a set drawn once from the seed
    scale: float = 1.0  # sign_flip: the malicious update is -scale x its own update
    sigma: float = 200.0  # gaussian: the std of the random update (Blanchard et al. 2017: 200)
    z: Optional[float] = None  # alie: the update is mean - z x std (null: z from n and f by attack.z_rule)
    # alie: baruch (the paper's z_max = Φ^-1((n - s)/n), s = floor(n/2 + 1) - f) | karimireddy (Φ^-1((n - f - s) /
    # (n - f)), as in Karimireddy et al.'s code and FLPoison)
    z_rule: str = "baruch"
    epsilon: float = 0.1  # ipm: the update is -epsilon x the honest mean (Xie et al. 2020: 0.1)
    # scaling: every malicious update boosted by γ (null: each by W / (f w_i η), so that the round's weighted mean
    # lands on the attackers' model: W the round's total weight, w_i the attacker's, f attackers in the round)
    boost: Optional[float] = None
    target: int = 0  # backdoor, scaling: the class a triggered input is taught to be
    poison_share: float = 0.5  # backdoor, scaling: share of a malicious client's samples that get the trigger
    trigger: int = 2  # backdoor, scaling: side of the square pixel pattern in the image's bottom-right corner
    perturbation: str = "unit_vec"  # minmax, minsum: ∇p, unit_vec | sign | std (the authors' code: unit_vec)
    gamma_init: float = 10.0  # minmax, minsum: the first γ of the search (the authors' code: 10)
    mimic_warmup: int = 1  # mimic: rounds that learn the direction before the target is fixed (the authors': 1)
    dba_size: int = 4  # dba: each of the 4 local triggers is a bar of this many pixels (Xie et al., MNIST: 4)
    dba_gap: int = 2  # dba: pixels between the bars, across and down (Xie et al., MNIST: 2)

    @property
    def on(self) -> bool:
        return self.name != "none"

    @property
    def on_data(self) -> bool:
        return self.name in DATA_ATTACKS

    @property
    def on_uploads(self) -> bool:
        return self.name in MODEL_ATTACKS

    @property
    def backdoor(self) -> bool:
        return self.name in BACKDOOR_ATTACKS


def clients_per_round(cfg: Any) -> int:
    """The round's cohort, clients.num x clients.fraction rounded half up, at least 1 (the driver's
    ``cohort_size``, here without torch)."""
    return max(1, int(math.floor(cfg.clients.fraction * cfg.clients.num + 0.5)))


def malicious_count(num: int, fraction: float) -> int:
    """How many of ``num`` clients are malicious: ``fraction`` x ``num`` rounded half up."""
    return int(math.floor(fraction * num + 0.5))


def tolerated(cfg: Any) -> int:
    """``aggregator.f`` as the run uses it: set, or round(attack.fraction x clients a round) with an attack."""
    if cfg.aggregator.f is not None:
        return int(cfg.aggregator.f)
    return malicious_count(clients_per_round(cfg), cfg.attack.fraction) if cfg.attack.on else 0


def most_tolerated(name: str, n: int) -> Optional[int]:
    """The largest f the rule can tolerate with n updates (None: no bound), and the bound's form in ``BOUNDS``."""
    if name in ("krum", "multikrum"):
        return max(-1, (n - 3) // 2)  # n > 2f + 2
    if name == "bulyan":
        return max(-1, (n - 3) // 4)  # n >= 4f + 3
    if name == "trimmed_mean":
        return max(-1, (n - 1) // 2)  # 2f < n
    return None


BOUNDS = {"krum": "n > 2f + 2", "multikrum": "n > 2f + 2", "bulyan": "n >= 4f + 3", "trimmed_mean": "2f < n"}


def rows_after_preaggregation(n: int, bucket: Optional[int]) -> int:
    """How many rows the rule sees: ⌈n / s⌉ after bucketing, else n (nearest-neighbour mixing keeps n)."""
    return -(-n // bucket) if bucket else n


def check_robust(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """Check ``cfg.aggregator`` and ``cfg.attack`` against the whole config; ``require(ok, key, why)`` refuses."""
    agg, attack = cfg.aggregator, cfg.attack
    require(agg.name in AGGREGATORS, "aggregator.name",
            f"must be one of {', '.join(AGGREGATORS)}, got {agg.name!r}")
    require(attack.name in ATTACKS, "attack.name", f"must be one of {', '.join(ATTACKS)}, got {attack.name!r}")
    require(agg.f is None or _whole(agg.f, 0), "aggregator.f",
            f"must be a whole number of clients >= 0 (or null: the attack's share), got {agg.f!r}")
    require(agg.m is None or _whole(agg.m, 1), "aggregator.m",
            f"must be a whole number of updates >= 1 (or null: n - f), got {agg.m!r}")
    require(_finite(agg.norm_bound, 0.0, strict=True), "aggregator.norm_bound",
            f"must be a finite number > 0, got {agg.norm_bound!r}")
    require(_finite(agg.tau, 0.0, strict=True), "aggregator.tau", f"must be a finite number > 0, got {agg.tau!r}")
    require(_whole(agg.iterations, 1), "aggregator.iterations",
            f"must be a whole number >= 1, got {agg.iterations!r}")
    require(_whole(agg.maxiter, 1), "aggregator.maxiter", f"must be a whole number >= 1, got {agg.maxiter!r}")
    require(_finite(agg.nu, 0.0, strict=True), "aggregator.nu", f"must be a finite number > 0, got {agg.nu!r}")
    require(isinstance(agg.nnm, bool), "aggregator.nnm", f"must be true or false, got {agg.nnm!r}")
    require(agg.bucket is None or _whole(agg.bucket, 2), "aggregator.bucket",
            f"must be a whole number of rows a bucket >= 2 (or null: no bucketing), got {agg.bucket!r}")
    require(agg.root is None or agg.root in ROOT_SPLITS, "aggregator.root",
            f"must be a public split, one of {', '.join(ROOT_SPLITS)} (or null), got {agg.root!r}")
    require(agg.root_samples is None or _whole(agg.root_samples, 1), "aggregator.root_samples",
            f"must be a whole number of samples >= 1 (or null: the whole split), got {agg.root_samples!r}")
    require(_finite(attack.fraction, 0.0) and attack.fraction < 1, "attack.fraction",
            f"must be a share in [0, 1), got {attack.fraction!r}")
    for name in ("scale", "sigma"):
        value = getattr(attack, name)
        require(_finite(value, 0.0, strict=True), f"attack.{name}", f"must be a finite number > 0, got {value!r}")
    require(attack.z is None or _finite(attack.z, float("-inf")), "attack.z",
            f"must be a finite number (or null: z from n and f by attack.z_rule), got {attack.z!r}")
    require(attack.z_rule in ALIE_Z_RULES, "attack.z_rule",
            f"must be one of {', '.join(ALIE_Z_RULES)}, got {attack.z_rule!r}")
    require(attack.perturbation in PERTURBATIONS, "attack.perturbation",
            f"must be one of {', '.join(PERTURBATIONS)}, got {attack.perturbation!r}")
    require(_finite(attack.gamma_init, 0.0, strict=True), "attack.gamma_init",
            f"must be a finite number > 0, got {attack.gamma_init!r}")
    require(_whole(attack.mimic_warmup, 1), "attack.mimic_warmup",
            f"must be a whole number of rounds >= 1, got {attack.mimic_warmup!r}")
    require(_whole(attack.dba_size, 1), "attack.dba_size",
            f"must be a whole number of pixels >= 1, got {attack.dba_size!r}")
    require(_whole(attack.dba_gap, 0), "attack.dba_gap",
            f"must be a whole number of pixels >= 0, got {attack.dba_gap!r}")
    require(_finite(attack.epsilon, 0.0, strict=True), "attack.epsilon",
            f"must be a finite number > 0, got {attack.epsilon!r}")
    require(attack.boost is None or _finite(attack.boost, 0.0, strict=True), "attack.boost",
            f"must be a finite number > 0 (or null: W / (f w_i η)), got {attack.boost!r}")
    require(_whole(attack.target, 0), "attack.target", f"must be a class index >= 0, got {attack.target!r}")
    require(_finite(attack.poison_share, 0.0, strict=True) and attack.poison_share <= 1, "attack.poison_share",
            f"must be a share in (0, 1], got {attack.poison_share!r}")
    require(_whole(attack.trigger, 1), "attack.trigger",
            f"must be a whole number of pixels >= 1, got {attack.trigger!r}")
    if not (agg.on or attack.on):
        return
    key = "aggregator.name" if agg.on else "attack.name"
    what = f"aggregator.name={agg.name}" if agg.on else f"attack.name={attack.name}"
    require(str(getattr(cfg.asynchronous, "mode", "off")) in ("off", "False", "false"), key,
            f"{what} works on a synchronous round's uploads; asynchronous.mode={cfg.asynchronous.mode} mixes each "
            f"arrival on its own (set asynchronous.mode=off)")
    from raysim.capabilities import refusal

    name = cfg.algorithm.name
    why = refusal(name, "robust", cfg)
    require(why is None, key, f"{what} replaces the server's model average of a model-averaging method (fedavg, "
            f"fedprox, the FedOpt family), and {name} {why}")
    _check_rule(cfg, require)


def _check_rule(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """The rule against the round's size: its bound on f, its pre-aggregation steps, FLTrust's root dataset."""
    agg, attack = cfg.aggregator, cfg.attack
    for key, on in (("aggregator.nnm", agg.nnm), ("aggregator.bucket", agg.bucket is not None)):
        require(not on or agg.name not in NO_PREAGGREGATION, key,
                f"a pre-aggregation step mixes the clients' updates, and aggregator.name={agg.name} "
                f"{NO_PREAGGREGATION.get(agg.name, '')} (use a rule that counts each client once: median, "
                f"trimmed_mean, krum, multikrum, bulyan, centered_clip, geomed)")
    if agg.name == "fltrust":
        require(agg.root is not None, "aggregator.root",
                f"fltrust trains the server's own update on a root dataset from a public split: name it "
                f"(aggregator.root={ROOT_SPLITS[0]}, with data.server_holdout > 0)")
        require(cfg.data.server_holdout > 0, "data.server_holdout",
                "fltrust's root dataset (aggregator.root=server_holdout) is the server's holdout, which is 0 here: "
                "set data.server_holdout (e.g. 0.1)")
    if not agg.on:
        return
    n, f = clients_per_round(cfg), tolerated(cfg)
    rows = rows_after_preaggregation(n, agg.bucket)
    most = most_tolerated(agg.name, rows)
    after = f" after aggregator.bucket={agg.bucket}" if agg.bucket else ""
    unbucketed = most_tolerated(agg.name, n)
    key = "aggregator.bucket" if agg.bucket and (unbucketed is None or f <= unbucketed) else "aggregator.f"
    require(most is None or f <= most, key,
            f"{agg.name} with n={rows} {'buckets' if agg.bucket else 'clients'} a round{after} tolerates at most "
            f"f={most} Byzantine clients ({BOUNDS.get(agg.name, '')}), got f={f}"
            + ("" if agg.f is not None else f" (from attack.fraction={attack.fraction:g})"))
    if agg.nnm:
        require(f < n, "aggregator.f", f"nearest-neighbour mixing averages each update's n - f nearest, so it needs "
                f"f < n (n={n} clients a round), got f={f}")
    if agg.name == "multikrum" and agg.m is not None:
        require(agg.m <= rows - f, "aggregator.m", f"multikrum averages at most n - f = {rows - f} updates "
                f"(n={rows} {'buckets' if agg.bucket else 'clients'} a round, f={f}), got {agg.m}")


def robust_notices(cfg: Any) -> list[str]:
    """The one-line notice that a setting turns the sums where the clients trained off (engine.partial_sums)."""
    if cfg.aggregator.on:
        why = f"aggregator.name={cfg.aggregator.name} needs every upload"
    elif cfg.attack.on_uploads:
        why = f"attack.name={cfg.attack.name} changes the malicious clients' uploads on the server"
    else:
        return []
    return [f"{why}: the round's uploads travel to the server one by one, not summed where the clients trained "
            f"(engine.partial_sums does not apply)"]
