"""Loading a config: YAML files (``extends:`` layers a file on another), dotted ``key=value`` overrides and a
base mapping, merged by OmegaConf onto the schema (``raysim.config_sections``) with the sections that the chosen
algorithm, models and datasets declare, then validated; and writing a config back as YAML. Import these names from
``raysim.config``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raysim.config_sections import AlgorithmConfig, DataConfig, ExperimentConfig, ModelConfig
from raysim.errors import UserError
from raysim.validate import ConfigError, require

def yaml_problem(exc: BaseException, text: Optional[str] = None) -> str:
    """What is wrong with a YAML ``text``, in one line naming the line and column (and the key, for a duplicate)."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        problem, mark = exc.problem, exc.problem_mark
        lines = (text or "").splitlines()
        if "cannot start any token" in problem and mark is not None and mark.line < len(lines) \
                and lines[mark.line][mark.column:mark.column + 1] == "\t":
            return f"a tab at line {mark.line + 1}, column {mark.column + 1}: YAML indents with spaces only"
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{problem}{where}"
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


def _read_yaml(path: Path, depth: int = 0) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = OmegaConf.load(path)
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError and friends: one line naming the file
        raise ConfigError(f"{path}: not valid YAML ({yaml_problem(exc, path.read_text(errors='replace'))})") \
            from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: a config file must be a mapping of keys")
    odd = next((i for i, key in enumerate(raw.keys()) if not (isinstance(key, str) and _KEY.fullmatch(key))), None)
    if odd is not None:  # a file that is no config (extends: /etc/passwd): named, never echoed
        raise ConfigError(f"{path}: not a raysim config: its top-level key number {odd + 1} is not a config key name")
    parent = raw.pop("extends", None)
    if parent is not None:
        require(depth < 8, "extends", "chain is too deep (a cycle?)")
        require(str(parent).endswith((".yaml", ".yml")), "extends",
                f"names a config file, which ends in .yaml or .yml (in {path})")
        raw = OmegaConf.merge(_read_yaml((path.parent / str(parent)).resolve(), depth + 1), raw)
    return raw


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_ENV = re.compile(r"\$\{\s*oc\.env\s*:")  # OmegaConf's resolver that reads an environment variable


def _refuse_environment(layer: DictConfig) -> None:
    """``${oc.env:VAR}`` would be resolved into the ``config.yaml`` a run saves in its directory, carrying the
    variable's value (a token, a password) there: refused, naming the key."""
    for key, value in flatten_container(OmegaConf.to_container(layer, resolve=False)).items():
        if isinstance(value, str) and _ENV.search(value):
            raise ConfigError(f"config key '{key}': ${{oc.env:...}} reads an environment variable, whose value a "
                              f"run would save in its directory's config.yaml; give the value itself (on the "
                              f"command line, {key}=\"$VAR\" is expanded by the shell)")


def flatten_container(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as dotted keys (list items by index)."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else None
    if items is None:
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(flatten_container(value, f"{prefix}{key}."))
    return out


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"config key '{key}': {text}" if key else f"config: {text}"


def _algorithm_key_hint(exc: OmegaConfBaseException, algorithm: str) -> str:
    """For an ``algorithm.*`` key the chosen algorithm lacks: which algorithms have it (``algorithm.mu=0.1`` with
    fedavg: fedprox and moon do)."""
    from omegaconf.errors import ConfigKeyError

    key = str(getattr(exc, "full_key", None) or "")
    if not isinstance(exc, ConfigKeyError) or not key.startswith("algorithm.") or key.count(".") < 1:
        return ""
    field_name = key.split(".")[1]
    from raysim.registry import algorithm_config, algorithm_names

    owners = [n for n in algorithm_names() if n != algorithm
              and field_name in {f.name for f in dataclasses.fields(algorithm_config(n))}]
    if not owners:
        return ""
    return (f"; {algorithm} has no key {field_name}, but {', '.join(owners)} "
            f"{'does' if len(owners) == 1 else 'do'} (set algorithm.name={owners[0]})")


def algorithm_config_class(name: str) -> type:
    from raysim.registry import algorithm_config

    return algorithm_config(name)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: dict | DictConfig | None = None, validate: bool = True, warn: bool = True) -> ExperimentConfig:
    """Build the validated config from an optional base mapping, a YAML file and dotted ``key=value`` overrides.

    ``warn``: print :mod:`raysim.checks`'s warnings (off for configs that are checked but not run, such as a sweep's
    validation candidates)."""
    layers: list[DictConfig] = []
    if base is not None:
        layers.append(OmegaConf.create(base) if isinstance(base, dict) else base)
    if path is not None:
        from raysim.catalog import resolve

        try:
            path = resolve(path)  # a file, or a shipped experiment by name (raysim list experiments)
        except UserError as exc:
            raise ConfigError(str(exc)) from None
        layers.append(_read_yaml(Path(path)))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like dotted.key=value")
    try:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        for layer in layers:
            _refuse_environment(layer)
        peek = OmegaConf.merge(*layers) if layers else OmegaConf.create()
        from raysim.registry import import_plugins

        import_plugins([str(m) for m in (OmegaConf.select(peek, "plugins", default=None) or [])])
        algo_name = OmegaConf.select(peek, "algorithm.name", default=AlgorithmConfig.name)
        algo_cls = algorithm_config_class(str(algo_name))
        model_names = OmegaConf.select(peek, "model.name", default=ModelConfig.name)
        model_names = [str(n) for n in model_names] if OmegaConf.is_list(model_names) else [str(model_names)]
        data_name = str(OmegaConf.select(peek, "data.name", default=DataConfig.name))
        model_cls = _with_sections(ModelConfig, "model", "model", tuple(dict.fromkeys(model_names)))
        data_cls = _with_sections(DataConfig, "data", "dataset", (data_name,))
        merged = OmegaConf.merge(_schema(algo_cls, model_cls, data_cls), *layers)  # merge copies the schema
        cfg: ExperimentConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc) + _algorithm_key_hint(exc, str(algo_name))) from None
    for item in overrides:  # YAML reads yes/on/true as a boolean: an error should echo the user's own word
        key, _, word = item.partition("=")
        if key == "engine.vectorize" and str(cfg.engine.vectorize) in ("True", "true"):
            cfg.engine.vectorize = word
    if not validate:
        return cfg
    cfg.validate()
    if warn:
        from raysim.checks import warn_config

        warn_config(cfg)  # settings that run but mean less than they seem (niid2 = niid1, a curriculum that can't move)
    return cfg


@functools.lru_cache(maxsize=64)
def _schema(algo_cls: type, model_cls: type, data_cls: type) -> DictConfig:
    """The structured schema of a config with these sections, built once: OmegaConf.structured walks every
    dataclass (~70 ms here), and ``OmegaConf.merge`` never changes its first argument."""
    return OmegaConf.structured(ExperimentConfig(algorithm=algo_cls(), model=model_cls(), data=data_cls()))


def _with_sections(base: type, key: str, kind: str, names: tuple[str, ...]) -> type:
    """``base`` plus one sub-section per named plugin model/dataset whose factory declares a ``Config`` dataclass:
    ``model.<name>.*`` / ``data.<name>.*``. Built-ins keep their keys in the section itself."""
    from raysim.registry import component_config

    sections = {n: c for n in names if (c := component_config(kind, n)) is not None}
    return _section_class(base, key, tuple(sections.items())) if sections else base


@functools.lru_cache(maxsize=None)
def _section_class(base: type, key: str, sections: tuple[tuple[str, type], ...]) -> type:
    taken = {f.name for f in dataclasses.fields(base)}
    for name, _ in sections:
        require(name not in taken and name.isidentifier(), f"{key}.name",
                 f"{name!r} cannot have a config section (it clashes with the key {key}.{name})")
    cls = dataclasses.make_dataclass(f"{base.__name__}_{'_'.join(n for n, _ in sections)}",
                                     [(n, c, field(default_factory=c)) for n, c in sections], bases=(base,))
    cls.__module__ = base.__module__
    return cls


def to_yaml(cfg: ExperimentConfig) -> str:
    """The config as OmegaConf writes it (``OmegaConf.to_yaml(OmegaConf.structured(cfg))``, byte for byte), without
    building the structured config (~0.1 s a run directory) where every value is a plain one."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    try:
        container = _plain(cfg)
    except TypeError:  # a plugin's value of another type: OmegaConf's own conversion
        return OmegaConf.to_yaml(OmegaConf.structured(cfg))
    return yaml.dump(container, default_flow_style=False, allow_unicode=True, sort_keys=False,
                     Dumper=get_omega_conf_dumper())


def _plain(value: Any) -> Any:
    """Dataclasses, dicts and sequences as the dicts and lists ``OmegaConf.to_container`` gives, enums by name."""
    import enum

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(type(value).__name__)
