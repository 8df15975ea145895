"""FAPD's consensus-driven curriculum controller (server side).

The network is stable at round t when |acc_t − acc_τ| < ε for every τ in t−N+1 … t−1 (N = ``window``); it is never
stable before N accuracies exist. Stable: k grows by Δk, capped at the teacher's dimension D; otherwise k stays.
The controller holds only numbers and a short list, so its ``state_dict`` goes into the checkpoint and a resumed run
continues the same curriculum.
"""

from __future__ import annotations

from typing import Any, Optional


def is_stable(history: list[float], epsilon: float, window: int) -> bool:
    """The consensus condition C(t) for the last entry of ``history`` (the oldest entries are ignored)."""
    if len(history) < window:
        return False
    current = history[-1]
    return all(abs(current - past) < epsilon for past in history[len(history) - window:-1])


class ConsensusController:
    """``.k`` is the coming round's dimension; ``update(acc)`` records a round's accuracy and returns the next k."""

    def __init__(self, k0: int, delta_k: int, epsilon: float, window: int, max_dim: int):
        if max_dim < 1 or not 1 <= k0 <= max_dim:
            raise ValueError(f"need 1 <= k0 <= max_dim, got k0={k0}, max_dim={max_dim}")
        if delta_k < 0 or epsilon < 0 or window < 1:
            raise ValueError(f"need delta_k >= 0, epsilon >= 0, window >= 1; got {delta_k}, {epsilon}, {window}")
        self.k0, self.delta_k, self.epsilon, self.window, self.max_dim = int(k0), int(delta_k), float(epsilon), \
            int(window), int(max_dim)
        self.k = self.k0
        self.history: list[float] = []  # the last ``window`` accuracies, oldest first
        self.stable: Optional[bool] = None  # C(t) of the last update (None before any)

    def update(self, acc: float) -> int:
        self.history = (self.history + [float(acc)])[-self.window:]
        self.stable = is_stable(self.history, self.epsilon, self.window)
        if self.stable:
            self.k = min(self.k + self.delta_k, self.max_dim)
        return self.k

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers and lists only: checkpoints are read with ``torch.load(weights_only=True)``."""
        return {"k": self.k, "history": list(self.history), "stable": self.stable, "k0": self.k0,
                "delta_k": self.delta_k, "epsilon": self.epsilon, "window": self.window, "max_dim": self.max_dim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the curriculum's position; the rule's parameters stay those this controller was built with."""
        k = int(state["k"])
        if not 1 <= k <= self.max_dim:
            raise ValueError(f"saved k={k} is outside 1..{self.max_dim}")
        self.k = k
        self.history = [float(a) for a in state.get("history", [])][-self.window:]
        stable = state.get("stable")
        self.stable = None if stable is None else bool(stable)
