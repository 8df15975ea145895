"""Name -> implementation for algorithms, models and datasets.

Each module registers itself with a decorator; the built-in modules are imported lazily on first lookup so that
``import raysim`` stays cheap and a worker imports only what it runs.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from raysim.errors import UserError

_ALGORITHMS: dict[str, type] = {}
_MODELS: dict[str, Callable[..., Any]] = {}
_DATASETS: dict[str, Callable[..., Any]] = {}
_TABLES: dict[str, dict[str, Any]] = {"algorithm": _ALGORITHMS, "model": _MODELS, "dataset": _DATASETS}

# Every built-in algorithm, one row each: name -> (the module that registers its hooks, its Config dataclass as
# "module:class"). The Config lives apart from the hooks, in a module without torch (raysim/algorithms/configs/), so
# that loading a config (``raysim config show``, the checks before a run) imports no algorithm; the algorithm's own
# ``Config`` is the same class (a test checks every row). Adding a built-in algorithm: its hooks file, its Config
# (when it has keys of its own) and its row here.
_BUILTIN_ALGORITHMS: dict[str, tuple[str, str]] = {
    "fedavg": ("raysim.algorithms.fedavg", "raysim.config:AlgorithmConfig"),
    "local": ("raysim.algorithms.local", "raysim.config:AlgorithmConfig"),
    "partialavg": ("raysim.algorithms.partialavg", "raysim.config:AlgorithmConfig"),
    "unideal": ("raysim.algorithms.unideal", "raysim.algorithms.configs.unideal:UnidealConfig"),
    "partialkd": ("raysim.algorithms.unideal", "raysim.algorithms.configs.unideal:PartialKDConfig"),
    "fedrep": ("raysim.algorithms.fedrep", "raysim.algorithms.configs.fedrep:FedRepConfig"),
    "fapd": ("raysim.algorithms.fapd", "raysim.algorithms.configs.fapd:FAPDConfig"),
    "fedprox": ("raysim.algorithms.fedprox", "raysim.algorithms.configs.fedprox:FedProxConfig"),
    "moon": ("raysim.algorithms.moon", "raysim.algorithms.configs.moon:MOONConfig"),
    "fedproto": ("raysim.algorithms.fedproto", "raysim.algorithms.configs.fedproto:FedProtoConfig"),
    "fedpac": ("raysim.algorithms.fedpac", "raysim.algorithms.configs.fedpac:FedPACConfig"),
    "fedgen": ("raysim.algorithms.fedgen", "raysim.algorithms.configs.fedgen:FedGenConfig"),
    "fedgen-p": ("raysim.algorithms.fedgen", "raysim.algorithms.configs.fedgen:FedGenPConfig"),
    "fednh": ("raysim.algorithms.fednh", "raysim.algorithms.configs.fednh:FedNHConfig"),
    "fedbabu": ("raysim.algorithms.fedbabu", "raysim.algorithms.configs.fedbabu:FedBABUConfig"),
    "fedrod": ("raysim.algorithms.fedrod", "raysim.algorithms.configs.fedrod:FedRoDConfig"),
    "fedrcl": ("raysim.algorithms.fedrcl", "raysim.algorithms.configs.fedrcl:FedRCLConfig"),
    "fedcda": ("raysim.algorithms.fedcda", "raysim.algorithms.configs.fedcda:FedCDAConfig"),
    "fedkd": ("raysim.algorithms.fedkd", "raysim.algorithms.configs.fedkd:FedKDConfig"),
    "fedpcl": ("raysim.algorithms.fedpcl", "raysim.algorithms.configs.fedpcl:FedPCLConfig"),
    "scaffold": ("raysim.algorithms.scaffold", "raysim.algorithms.configs.scaffold:SCAFFOLDConfig"),
    "feddyn": ("raysim.algorithms.feddyn", "raysim.algorithms.configs.feddyn:FedDynConfig"),
    "fedavgm": ("raysim.algorithms.fedopt", "raysim.algorithms.configs.fedopt:FedAvgMConfig"),
    "fedadam": ("raysim.algorithms.fedopt", "raysim.algorithms.configs.fedopt:FedAdamConfig"),
    "fedyogi": ("raysim.algorithms.fedopt", "raysim.algorithms.configs.fedopt:FedYogiConfig"),
    "fedadagrad": ("raysim.algorithms.fedopt", "raysim.algorithms.configs.fedopt:FedAdagradConfig"),
    "fedbn": ("raysim.algorithms.fedbn", "raysim.config:AlgorithmConfig"),
    "ditto": ("raysim.algorithms.ditto", "raysim.algorithms.configs.ditto:DittoConfig"),
    "fednova": ("raysim.algorithms.fednova", "raysim.algorithms.configs.fednova:FedNovaConfig"),
}
# built-in name -> the module that registers it, so a lookup imports only that module: loading every model module
# would import torchvision (~2 s) in the driver and in each worker even for an MLP run
_BUILTINS: dict[str, dict[str, str]] = {
    "algorithm": {name: hooks for name, (hooks, _) in _BUILTIN_ALGORITHMS.items()},
    "model": {"mlp": "raysim.models.small", "cnn": "raysim.models.small", "char_lstm": "raysim.models.small",
              "cnn_bn": "raysim.models.small",
              "resnet18": "raysim.models.zoo",
              "resnet10": "raysim.models.zoo", "mobilenet_v3_small": "raysim.models.zoo",
              "vgg11_bn": "raysim.models.zoo", "mlp_hete": "raysim.models.zoo",
              "mobilenet_v2": "raysim.models.zoo"},
    "dataset": {"sklearn_digits": "raysim.data.sklearn_sets", "digits": "raysim.data.digits",
                "mnist": "raysim.data.digits", "mnistm": "raysim.data.digits", "synthdigits": "raysim.data.digits",
                "cifar10": "raysim.data.images", "cifar100": "raysim.data.images",
                "tinyimagenet": "raysim.data.images", "breast_cancer": "raysim.data.tabular",
                "wine": "raysim.data.tabular", "digits_table": "raysim.data.tabular", "adult": "raysim.data.tabular",
                "hcc": "raysim.data.tabular", "ilpd": "raysim.data.tabular",
                "synthetic": "raysim.data.synthetic", "femnist": "raysim.data.leaf",
                "shakespeare": "raysim.data.leaf"},
}
_BUILTIN_CONFIGS = {name: config for name, (_, config) in _BUILTIN_ALGORITHMS.items()}
_loaded: set[str] = set()


def _import_builtin(module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:  # a real missing dependency inside an existing module
            raise


def _load_builtins(kind: str) -> None:
    """Import every built-in module of a kind (to list what is known)."""
    if kind in _loaded:
        return
    _loaded.add(kind)
    for module in sorted(set(_BUILTINS[kind].values())):
        _import_builtin(module)


def import_plugins(modules: list[str] | tuple[str, ...]) -> None:
    """Import user modules that register their own algorithms, models or datasets (config key ``plugins``).

    They must be importable on every node (installed, or on PYTHONPATH), since workers look names up too.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            hint = ""
            if isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0]:
                hint = "; " + _pythonpath_hint(module)
            raise UserError(f"config key 'plugins': cannot import {module!r} ({exc}){hint}") from None


_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "runs", "__pycache__", ".mypy_cache", ".pytest_cache"}


def _pythonpath_hint(module: str, root: Optional[Path] = None, depth: int = 4) -> str:
    """Where a plugin that cannot be imported may be: a ``<top>.py`` or ``<top>/__init__.py`` a few folders below
    the working directory, with the ``PYTHONPATH`` that makes it importable."""
    top = module.split(".")[0]
    root = Path.cwd() if root is None else root
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")
                         and len(rel.parts) < depth)
        if f"{top}.py" in files or (top in dirs and (Path(folder) / top / "__init__.py").is_file()):
            where = str(rel) if rel.parts else "."
            found = rel / (f"{top}.py" if f"{top}.py" in files else top)
            return (f"it is not on Python's path: found {found}, so run `export PYTHONPATH={where}` "
                    f"(or install it) first")
    return (f"a plugin must be importable: put the folder holding {top}.py on PYTHONPATH "
            f"(`export PYTHONPATH=DIR`) or install it")


# hooks whose arguments changed in raysim 0.2: (hook, its parameters after self)
_HOOK_PARAMETERS = {"client_setup": ("model", "ctx"), "eval_setup": ("model", "ctx")}


def _check_hook_signatures(cls: type) -> None:
    """A plugin written for raysim 0.1's ``client_setup(model, state, payload, ctx)`` gets one line naming the
    change, not a TypeError from inside a worker's first job."""
    import inspect

    for hook, wanted in _HOOK_PARAMETERS.items():
        fn = cls.__dict__.get(hook)
        if fn is None:
            continue
        params = [p.name for p in inspect.signature(fn).parameters.values()][1:]
        if len(params) != len(wanted):
            raise UserError(f"algorithm {cls.__name__}: {hook}({', '.join(params)}) has the raysim 0.1 signature; "
                            f"since raysim 0.2 it is {hook}({', '.join(wanted)}), with the client's state and "
                            f"payload in ctx.state and ctx.payload (docs/hooks.md)")


def register_algorithm(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        _check_hook_signatures(cls)
        cls.name = name  # type: ignore[attr-defined]  # Algorithm.name
        _ALGORITHMS[name] = cls
        return cls

    return wrap


def register_model(name: str, config: Optional[type] = None) -> Callable[[Callable], Callable]:
    """Register a backbone factory ``fn(*, input_shape, cfg, client_id, seed) -> nn.Module`` (``cfg`` is the
    ``model`` section). ``config``: a dataclass of the model's own keys, which appear as ``model.<name>.*`` and
    reach the factory as ``cfg.<name>`` (a ``Config`` attribute on the factory does the same)."""
    return _register_factory(_MODELS, name, config)


def register_dataset(name: str, config: Optional[type] = None) -> Callable[[Callable], Callable]:
    """Register a dataset builder ``fn(cfg) -> FederatedData`` (``cfg`` is the whole experiment config).
    ``config``: a dataclass of the dataset's own keys, ``data.<name>.*`` (read as ``cfg.data.<name>``)."""
    return _register_factory(_DATASETS, name, config)


def _register_factory(table: dict[str, Callable], name: str, config: Optional[type]) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable) -> Callable:
        if config is not None:
            fn.Config = config  # type: ignore[attr-defined]
        table[name] = fn
        return fn

    return wrap


def component_config(kind: str, name: str) -> Optional[type]:
    """The ``Config`` dataclass a model or dataset declares, or None. Built-ins (whose keys live in the ``model`` /
    ``data`` sections) are not imported for this: loading a config must not import torchvision."""
    table = {"model": _MODELS, "dataset": _DATASETS}[kind]
    if name not in table and name in _BUILTINS[kind]:
        return None
    return getattr(_get(table, kind, "model.name" if kind == "model" else "data.name", name), "Config", None)


def _get(table: dict, kind: str, key: str, name: str) -> Any:
    if name not in table and name in _BUILTINS[kind]:
        _import_builtin(_BUILTINS[kind][name])
    if name not in table:
        _load_builtins(kind)
    if name not in table:
        raise _unknown(kind, key, name, table)
    return table[name]


def _unknown(kind: str, key: str, name: str, known: Any) -> UserError:
    return UserError(f"config key '{key}': unknown {kind} {name!r}{did_you_mean(str(name), known)}; "
                     f"known: {', '.join(sorted(known))}")


def did_you_mean(word: str, known: Any) -> str:
    """" (did you mean 'fedavg'?)" for a close misspelling of a known name (difflib), else ""."""
    import difflib

    close = difflib.get_close_matches(word, sorted(known), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def get_algorithm(name: str) -> type:
    return _get(_ALGORITHMS, "algorithm", "algorithm.name", name)


def algorithm_config(name: str) -> type:
    """The ``Config`` dataclass of algorithm ``name``. A built-in's comes from its module under
    raysim/algorithms/configs/, without importing the algorithm (torch, ~1-2 s); a plugin's from its class."""
    if name not in _ALGORITHMS:
        if name in _BUILTIN_CONFIGS:
            module, _, attr = _BUILTIN_CONFIGS[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        if name not in _BUILTINS["algorithm"]:
            raise _unknown("algorithm", "algorithm.name", name, set(_BUILTINS["algorithm"]) | set(_ALGORITHMS))
        _import_builtin(_BUILTINS["algorithm"][name])  # a built-in without a torch-free Config yet: right, but slow
    return _ALGORITHMS[name].Config  # type: ignore[attr-defined]  # every Algorithm has one (AlgorithmConfig)


def algorithm_names() -> list[str]:
    """Every algorithm name, built-ins and registered plugins, sorted, without importing any algorithm."""
    return sorted(set(_BUILTINS["algorithm"]) | set(_ALGORITHMS))


def loaded_algorithm(name: str) -> Optional[type]:
    """The class registered as ``name`` if its module has been imported (every plugin's is, by ``load_config``),
    else None: then a built-in's Config speaks for it (``algorithm_config``)."""
    return _ALGORITHMS.get(name)


def get_model(name: str) -> Callable[..., Any]:
    return _get(_MODELS, "model", "model.name", name)


def get_dataset(name: str) -> Callable[..., Any]:
    return _get(_DATASETS, "dataset", "data.name", name)


def names(kind: str) -> list[str]:
    _load_builtins(kind)
    return sorted(_TABLES[kind])


def builtin_names(kind: str) -> list[str]:
    """The names raysim itself registers (no plugins), sorted."""
    return sorted(_BUILTINS[kind])


def describe(kind: str) -> list[tuple[str, str]]:
    """(name, first paragraph of its docstring) for every registered algorithm / model / dataset, plugins included.

    Built-ins are described from their modules' source, without importing them: importing every model would load
    torchvision, and every algorithm torch (seconds, for a list)."""
    static = _static_docs(kind)
    table = _TABLES[kind]
    out = []
    for name in sorted(set(_BUILTINS[kind]) | set(table)):
        if name in static and (name not in table or name in _BUILTINS[kind]):
            doc = static[name]
        else:
            obj = _get(table, kind, kind, name)
            module = sys.modules.get(getattr(obj, "__module__", ""))
            doc = obj.__doc__ or getattr(module, "__doc__", None) or ""  # a plugin without its own: its module's
        out.append((name, first_paragraph(doc) or "(no docstring)"))
    return out


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph as one line (the whole sentence, however it was wrapped)."""
    paragraph = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines() if line.strip())


_DECORATORS = {"algorithm": "register_algorithm", "model": "register_model", "dataset": "register_dataset"}


def _static_docs(kind: str) -> dict[str, str]:
    """Built-in name -> its docstring, read from the source of the module that registers it (``@register_*("name")``
    on a function or class; the module's docstring when it has none)."""
    package = Path(__file__).resolve().parent
    out: dict[str, str] = {}
    for module in sorted(set(_BUILTINS[kind].values())):
        path = package.joinpath(*module.split(".")[1:]).with_suffix(".py")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == _DECORATORS[kind] and dec.args
                        and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
                    out[dec.args[0].value] = ast.get_docstring(node) or ast.get_docstring(tree) or ""
    return out
