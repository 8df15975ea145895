"""FedScale's device-capacity trace (``client_device_capacity``) as client traits (``system.traits: fedscale``).

FedScale (Lai et al., "FedScale: Benchmarking Model and System Performance of Federated Learning at Scale", ICML
2022; github.com/SymbioticLab/FedScale, benchmark/dataset/data/device_info/README.md) ships a pickle mapping each
client id to ``{'computation': ms, 'communication': kbit/s}``: ``computation`` is the device's inference latency of
FedScale's model in milliseconds per sample, and its simulator charges a trained sample three times that (a backward
pass is about twice a forward); ``communication`` is a bandwidth in kbit/s (FedScale's model size is
``bytes / 1024 * 8`` kbit), the same for downloads and uploads, with no latency
(fedscale/cloud/internal/client_metadata.py, ``get_completion_time``). So a client's traits here are: speed =
1000 / (3 x computation) samples a second, down = up = 128 x communication bytes a second, latency 0.

The pickle is read as the behaviour trace is (``raysim.system.model``): plain dicts, lists and numbers only; a pickle
that names any class or function is refused without building it, and nothing in it runs. The file may hold more
clients than the federation (FedScale's holds about 500,000 devices): clients 0 to clients.num - 1 are read, and
each of them must be there.
"""

from __future__ import annotations

import math

import numpy as np

from raysim.system.files import _client_id, _fail, _read_pickle_or_json

AUGMENTATION = 3.0  # FedScale's augmentation_factor: a trained sample costs three inferences
KBIT = 1024 / 8  # bytes in FedScale's kbit


def read_capacity(path: str, num_clients: int) -> np.ndarray:
    """(num_clients, 4): each client's speed (samples/s), down, up (bytes/s) and latency (0 s) from FedScale's
    capacity trace at ``path`` (.pkl, or .json with the same layout)."""
    key = "system.capacity"
    raw = _read_pickle_or_json(key, path, "a capacity trace (FedScale's client_device_capacity, .pkl or .json)")
    if not isinstance(raw, dict):
        raise _fail(key, path, "must map client ids to {computation, communication} (FedScale's layout)")
    table = np.full((num_clients, 4), np.nan)
    for client, entry in raw.items():
        value = int(client) if isinstance(client, str) and client.lstrip("-").isdigit() else client
        if isinstance(value, int) and not isinstance(value, bool) and value >= num_clients:
            continue  # a device beyond the federation
        cid = _client_id(key, path, 0, value, num_clients)
        numbers = [entry.get(name) if isinstance(entry, dict) else None for name in ("computation", "communication")]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                   for v in numbers):
            raise _fail(key, path, f"client {cid}'s entry needs a computation (ms per sample) and a communication "
                                   f"(kbit/s), each a finite number > 0 (FedScale's layout), got {entry!r:.80}")
        computation, communication = (float(v) for v in numbers if v is not None)
        table[cid] = (1000.0 / (AUGMENTATION * computation), KBIT * communication, KBIT * communication, 0.0)
    missing = np.flatnonzero(np.isnan(table[:, 0]))
    if len(missing):
        raise _fail(key, path, f"names {num_clients - len(missing)} of the {num_clients} clients (client "
                               f"{int(missing[0])} is missing); it must name every client of the federation")
    return table
