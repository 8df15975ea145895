"""What each built-in algorithm's declarations allow, kept without torch, so that a config check answers before any
algorithm (and torch, 2-5 s) is imported: whether its clients can be stacked (``engine.vectorize``), and whether it
can run FedAsync/FedBuff, DP-FedAvg or a robust rule (``Algorithm.refusal``'s answer from the class alone).

The table is derived from the classes (``Algorithm.uploads``, ``vectorizable``, ``shared``, ``server_history``, the
hooks they override), never written by hand: ``python -m raysim.capabilities`` writes it again, and a test
checks it against the classes, so it cannot drift. A plugin's algorithm is not in it: its class is imported and asked.
A setting's own reason (the Config's ``refusal``: Ditto's ``select_lam``) is asked of the loaded config either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

FEATURES = ("stack", "async", "privacy", "robust")

# (stack, async, privacy, robust) refusals, None where the declarations allow it; generated, see the docstring
# --- generated table: begin
TABLE: dict[str, tuple[Optional[str], ...]] = {'ditto': (None, None, None, None),
 'fapd': (None, None, None, None),
 'fedadagrad': (None, None, None, None),
 'fedadam': (None, None, None, None),
 'fedavg': (None, None, None, None),
 'fedavgm': (None, None, None, None),
 'fedbabu': (None, None, None, 'averages only part of the model'),
 'fedbn': (None,
           'uploads a weighted mean, not a model (Algorithm.uploads = Uploads.mean(...))',
           'uploads a weighted mean, not a model (Algorithm.uploads = Uploads.mean(...))',
           'uploads a weighted mean, not a model (Algorithm.uploads = Uploads.mean(...))'),
 'fedcda': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'feddyn': (None,
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fedgen': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fedgen-p': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
              'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
              'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
              'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fedkd': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
           'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
           'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
           'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fednh': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
           'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
           'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
           'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fednova': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
             'uploads a weighted mean, not a model (Algorithm.uploads = Uploads.mean(...))',
             'uploads a weighted mean, not a model (Algorithm.uploads = Uploads.mean(...))',
             'uploads a weighted mean, not a model (Algorithm.uploads = Uploads.mean(...))'),
 'fedpac': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fedpcl': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
            'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fedproto': ('declares no vectorisable client hooks (Algorithm.vectorizable)',
              'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
              'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))',
              'needs every upload of a round at once (Algorithm.uploads = Uploads.apart(...))'),
 'fedprox': (None, None, None, None),
 'fedrcl': ('declares no vectorisable client hooks (Algorithm.vectorizable)', None, None, None),
 'fedrep': (None, None, None, 'averages only part of the model'),
 'fedrod': ('declares no vectorisable client hooks (Algorithm.vectorizable)', None, None, None),
 'fedyogi': (None, None, None, None),
 'local': (None, 'shares no model', 'shares no model', 'shares no model'),
 'moon': ('declares no vectorisable client hooks (Algorithm.vectorizable)', None, None, None),
 'partialavg': (None, None, None, 'averages only part of the model'),
 'partialkd': (None, None, None, 'averages only part of the model'),
 'scaffold': (None,
              'uploads named statistics, not a model (Algorithm.uploads = Uploads.stats(...))',
              'uploads named statistics, not a model (Algorithm.uploads = Uploads.stats(...))',
              'uploads named statistics, not a model (Algorithm.uploads = Uploads.stats(...))'),
 'unideal': (None, None, None, 'averages only part of the model')}
# --- generated table: end


def refusal(name: str, feature: str, cfg: Any = None) -> Optional[str]:
    """Why algorithm ``name`` cannot serve ``feature`` (None: it can): its declarations (from the table for a
    built-in, from its class for a plugin), then the settings of ``cfg`` (its Config's ``refusal``)."""
    row = TABLE.get(name)
    if row is not None:
        static = row[FEATURES.index(feature)]
    else:
        from raysim.registry import get_algorithm

        static = get_algorithm(name)._static_refusal(feature)
    if static is not None or cfg is None:
        return static
    return cfg.algorithm.refusal(feature)


def derived_table() -> dict[str, tuple[Optional[str], ...]]:
    """The table as the built-in classes declare it (imports every built-in algorithm)."""
    from raysim.registry import builtin_names, get_algorithm

    return {name: tuple(get_algorithm(name)._static_refusal(f) for f in FEATURES)
            for name in builtin_names("algorithm")}


def write_table(path: Path = Path(__file__)) -> None:
    """Write :func:`derived_table` into this module, between its markers."""
    import pprint

    text = path.read_text()
    head, rest = text.split("# --- generated table: begin\n")
    _, tail = rest.split("# --- generated table: end\n")
    body = pprint.pformat(derived_table(), width=116, sort_dicts=True)
    table = "TABLE: dict[str, tuple[Optional[str], ...]] = " + body + "\n"
    path.write_text(head + "# --- generated table: begin\n" + table + "# --- generated table: end\n" + tail)


if __name__ == "__main__":
    write_table()
