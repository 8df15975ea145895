"""Synthetic(α, β): the federated benchmark of FedProx (Li et al., "Federated Optimization in Heterogeneous
Networks", MLSys 2020, §5.1), made client by client on demand.

It follows the authors' generator, ``data/synthetic_1_1/generate_synthetic.py`` in github.com/litian96/FedProx
(commit d2a4501): for client k,

- n_k = int(lognormal(4, 2)) + 50 samples (the paper's power-law sizes);
- u_k ~ N(0, α) and B_k ~ N(0, β) (the script passes α and β as the standard deviation);
- W_k ~ N(u_k, 1) of shape [dimension, 10], b_k ~ N(u_k, 1) of shape [10];
- v_k ~ N(B_k, 1) per dimension; x ~ N(v_k, Σ) with Σ diagonal, Σ_jj = j^-1.2 (j = 1..dimension);
- y = argmax softmax(W_k^T x + b_k).

α controls how much the clients' models differ, β how much their inputs do; the paper's settings are (0, 0),
(0.5, 0.5) and (1, 1), with 60 dimensions and 10 classes. The script draws every client from one global NumPy
stream; here each client draws from its own stream seeded by (seed, client id), so a client's data is made where
and when it is needed and a client that is never sampled costs nothing. The authors then shuffle each client's
samples and keep 90 % for training; here the held-out share is ``data.test_fraction``.
"""

from __future__ import annotations

import numpy as np

from raysim.data.base import OnDemandData
from raysim.errors import UserError
from raysim.registry import register_dataset

NUM_CLASSES = 10
DEFAULT_DIMENSION = 60
DEFAULT_ALPHA = 1.0  # Synthetic(1, 1), the paper's most heterogeneous setting
DEFAULT_BETA = 1.0
_STREAM = 60_010  # separates these draws from every other use of the run seed


def client_size(rng: np.random.Generator, cap: int | None) -> int:
    """The generator's ``int(lognormal(4, 2)) + 50``, capped at ``cap`` (``data.samples_per_domain``) when set."""
    n = int(rng.lognormal(4.0, 2.0)) + 50
    return min(n, cap) if cap else n


class SyntheticData(OnDemandData):
    """The settings of a Synthetic(α, β) federation; ``client_arrays`` makes one client's samples."""

    def __init__(self, seed: int, num_clients: int, alpha: float, beta: float, dimension: int,
                 test_fraction: float, cap: int | None = None):
        self.seed, self.num_clients, self.alpha, self.beta = int(seed), int(num_clients), float(alpha), float(beta)
        self.dimension, self.test_fraction, self.cap = int(dimension), float(test_fraction), cap
        self.num_classes = NUM_CLASSES
        self.meta = {"alpha": self.alpha, "beta": self.beta, "dimension": self.dimension}
        self._sd = np.power(np.arange(1, self.dimension + 1, dtype=np.float64), -1.2) ** 0.5  # sqrt(Σ_jj)

    def _rng(self, client_id: int) -> np.random.Generator:
        if not 0 <= client_id < self.num_clients:
            raise IndexError(f"client {client_id} is not in a federation of {self.num_clients}")
        return np.random.default_rng([self.seed, _STREAM, int(client_id)])

    def input_shape(self, client_id: int) -> tuple[int, ...]:
        return (self.dimension,)

    def num_samples(self, client_id: int) -> int:
        """The client's size, its stream's first draw: known without making its samples."""
        return client_size(self._rng(client_id), self.cap)

    def num_train(self, client_id: int) -> int:
        return self._split_sizes(self.num_samples(client_id))[0]

    def num_test(self, client_id: int) -> int:
        return self._split_sizes(self.num_samples(client_id))[1]

    def _split_sizes(self, n: int) -> tuple[int, int]:
        """(train, test) sizes: ``test_fraction`` held out, at least one sample on each side."""
        n_test = min(max(int(round(n * self.test_fraction)), 1), n - 1)
        return n - n_test, n_test

    def generate(self, client_id: int) -> tuple[np.ndarray, np.ndarray]:
        """All of client ``client_id``'s samples, (x float32 [n, dimension], y int64 [n]), in generation order."""
        rng = self._rng(client_id)
        n = client_size(rng, self.cap)
        d = self.dimension
        u = rng.normal(0.0, self.alpha)  # mean of W_k and b_k
        big_b = rng.normal(0.0, self.beta)
        v = rng.normal(big_b, 1.0, d)
        w = rng.normal(u, 1.0, (d, NUM_CLASSES))
        b = rng.normal(u, 1.0, NUM_CLASSES)
        x = v + rng.standard_normal((n, d)) * self._sd
        y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: its argmax is the logits'
        return x.astype(np.float32), y.astype(np.int64)

    def client_arrays(self, client_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x, y = self.generate(client_id)
        order = np.random.default_rng([self.seed, _STREAM, int(client_id), 1]).permutation(len(y))
        n_train, _ = self._split_sizes(len(y))
        train, test = order[:n_train], order[n_train:]
        return x[train], y[train], x[test], y[test]


@register_dataset("synthetic")
def synthetic(cfg) -> SyntheticData:
    """FedProx's Synthetic(α, β) (data.alpha, data.beta; default (1, 1)): data.dimension inputs (60), 10 classes,
    power-law client sizes, made per client on demand."""
    d = cfg.data
    alpha = DEFAULT_ALPHA if d.alpha is None else d.alpha
    beta = DEFAULT_BETA if d.beta is None else d.beta
    if alpha < 0 or beta < 0:  # validated with the config too; also here for configs built without validation
        raise UserError(f"config key 'data.{'alpha' if alpha < 0 else 'beta'}': must be >= 0 for synthetic")
    return SyntheticData(cfg.seed, cfg.clients.num, alpha, beta, d.dimension, d.test_fraction,
                         d.samples_per_domain)
