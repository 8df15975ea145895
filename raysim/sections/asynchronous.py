"""The ``asynchronous`` config section: FedAsync and FedBuff in simulated time (``raysim.engine.asynchronous``).

Off by default (``asynchronous.mode: off``): then no key here changes any number a run computes. The section is
checked by :func:`check_asynchronous`, which ``raysim.config`` calls with its ``require`` (this module imports
nothing of raysim's config, so the two stay free of an import circle).

Defaults are the papers': FedAsync (Xie, Koyejo, Gupta, arXiv:1903.03934) mixes with α = 0.6 and the polynomial
staleness function s(t − τ) = (t − τ + 1)^−a with a = 0.5 (its experiments' FedAsync+Poly; FedAsync+Hinge uses
a = 10, b = 4); FedBuff (Nguyen et al., AISTATS 2022, arXiv:2106.06639) steps every K = 10 arrivals with server
learning rate η_g = 1 and scales each update by 1/√(1 + staleness).

Checked (2026-12-02) against the papers' definitions and FedBuff's reference implementation, Meta's FLSim
(github.com/facebookresearch/FLSim at 7311f2d):

- FedAsync's s(t − τ): constant 1, polynomial (t − τ + 1)^−a, hinge 1 for t − τ ≤ b else 1/(a(t − τ − b) + 1),
  as in the paper's adaptive α_t = α·s(t − τ). The defaults α = 0.6, a = 0.5 (polynomial), a = 10, b = 4 (hinge)
  are the values recalled from its experiments; no text of the paper's experiment section was at hand offline to
  check them line by line, so they are left as they were.
- FedBuff's staleness scaling: FLSim's ``PolynomialStalenessWeight`` is 1/(1 + staleness)^exponent
  (flsim/utils/async_trainer/async_staleness_weights.py), and its FedBuff tests use exponent 0.5 with
  ``avg_staleness=0`` (flsim/trainers/tests/test_async_trainer_weights.py): 1/√(1 + staleness), as here. FLSim's
  default ``avg_staleness=1`` divides every weight by 1/√2, a constant factor on the server learning rate.
- FedBuff's K: 10 in FLSim's example (examples/configs/sent140_fedbuff_config.json, ``buffer_size: 10``).
- FedBuff's step: the paper's Algorithm 1 divides the buffered sum by K before the server step, as
  :func:`raysim.engine.asynchronous.buffered_target` does; FLSim's ``FedBuffAggregator``
  (flsim/optimizers/async_aggregators.py) steps along the weighted *sum* (``ReductionType.WEIGHTED_SUM``), which is
  the paper's step with η_g scaled by K. FLSim's example tunes η_g (0.7, with server momentum 0.9); the paper tunes
  it per task, so η_g = 1 (the buffered mean applied as it is) stays the default here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from raysim.validate import is_finite as _finite

MODES = ("off", "fedasync", "fedbuff")
STALENESS = ("constant", "polynomial", "hinge")
DEFAULT_A = {"constant": 0.0, "polynomial": 0.5, "hinge": 10.0}  # FedAsync's experiments: Poly a=0.5, Hinge a=10


@dataclass
class AsynchronousConfig:
    # off (synchronous rounds) | fedasync (every arrival is mixed into the server's model) | fedbuff (the server
    # steps once every buffer_size arrivals). One server step is one logical round (``rounds`` of them)
    mode: str = "off"
    # clients training at once (null: the synchronous cohort, clients.num x clients.fraction)
    concurrency: Optional[int] = None
    alpha: float = 0.6  # fedasync: the mixing weight α, in (0, 1]
    staleness: str = "polynomial"  # fedasync: s(t − τ): constant | polynomial | hinge
    a: Optional[float] = None  # fedasync: the staleness function's a (null: 0.5 for polynomial, 10 for hinge)
    b: float = 4.0  # fedasync: hinge's b, the staleness up to which s is 1
    buffer_size: int = 10  # fedbuff: K, arrivals per server step
    server_lr: float = 1.0  # fedbuff: η_g, the server's step along the buffered mean update
    staleness_scaling: bool = True  # fedbuff: weigh each buffered update by 1/√(1 + staleness)

    @property
    def on(self) -> bool:
        return self.mode != "off"


def check_asynchronous(cfg: Any, require: Callable[[bool, str, str], None]) -> None:
    """Check (and normalise) ``cfg.asynchronous`` against the whole config; ``require(ok, key, why)`` refuses."""
    section: AsynchronousConfig = cfg.asynchronous
    if str(section.mode) in ("False", "false"):  # YAML reads a bare off as false
        section.mode = "off"
    require(section.mode in MODES, "asynchronous.mode", f"must be one of {', '.join(MODES)}, got {section.mode!r}")
    if section.concurrency is not None:
        require(isinstance(section.concurrency, int) and 1 <= section.concurrency <= cfg.clients.num,
                "asynchronous.concurrency", f"must be a whole number of clients in [1, clients.num={cfg.clients.num}]"
                f" (or null: the synchronous cohort), got {section.concurrency!r}")
    require(_finite(section.alpha, 0.0, strict=True) and section.alpha <= 1, "asynchronous.alpha",
            f"must be in (0, 1], got {section.alpha!r}")
    require(section.staleness in STALENESS, "asynchronous.staleness",
            f"must be one of {', '.join(STALENESS)}, got {section.staleness!r}")
    if section.a is None:
        section.a = DEFAULT_A[section.staleness]
    require(_finite(section.a, 0.0), "asynchronous.a", f"must be a finite number >= 0, got {section.a!r}")
    require(_finite(section.b, 0.0), "asynchronous.b", f"must be a finite number >= 0, got {section.b!r}")
    require(isinstance(section.buffer_size, int) and section.buffer_size >= 1, "asynchronous.buffer_size",
            f"must be a whole number >= 1, got {section.buffer_size!r}")
    require(_finite(section.server_lr, 0.0, strict=True), "asynchronous.server_lr",
            f"must be a finite number > 0, got {section.server_lr!r}")
    if not section.on:
        return
    from raysim.capabilities import refusal

    name = cfg.algorithm.name
    why = refusal(name, "async", cfg)
    require(why is None, "asynchronous.mode", f"{section.mode} needs a method whose server step is a model average "
            f"(fedavg, fedprox, the FedOpt family, unideal, ...: Uploads.model()): {name} {why}")
    deadline = getattr(getattr(cfg, "system", None), "deadline_s", None)
    require(deadline is None, "asynchronous.mode", f"{section.mode} has no rounds to cut short: drop "
            f"system.deadline_s (a deadline and over-selection are synchronous policies)")
