"""Build the run's Config: built-in defaults < --config FILE.yaml < dotted `a.b.c=value` overrides.

The guard's built-in defaults were measured on the built-in demo's model; on any other model (a Hugging Face folder
or GGUF file as actor_rollout_ref.model.path, or the real-model built-in tasks) its thresholds are those measured on
real models (klguard.guard.config.EXTERNAL_HOST_DEFAULTS, as in the TRL callback, the verl plugin and `klguard
watch`), below the file and the overrides.

verl keys that klguard does not implement are accepted and reported once, in one warning; keys that
are neither ours nor verl's are errors that name the key and the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from klguard.config.foreign import VERL_CONFIG_NAMES, PluginFallback, find_foreign, plugin_command
from klguard.config.schema import BUILTIN_MODEL, Config
from klguard.config.structured import build, omegaconf_schema
from klguard.config.validate import validate
from klguard.config.verl_keys import canonical, in_free_form_map, newer_engine_detail, verl_keys
from klguard.errors import ConfigError
from klguard.fields import choice_fields, refusal
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS

# Hydra's list of config groups at the top of verl's YAML files: meaningless here.
_HYDRA_KEYS = ("defaults", "hydra")


@dataclasses.dataclass
class LoadedConfig:
    config: Config
    ignored_verl_keys: list[str]


def load_config(config_file: str | Path | None = None, overrides: Sequence[str] = (), *,
                config_name: str | None = None, config_path: str | None = None) -> LoadedConfig:
    """Resolve and validate the configuration; raises ConfigError with a one-line message, PluginFallback (one
    line with verl's command) for a line klguard's trainer cannot run. `config_name`/`config_path`: Hydra's
    `--config-name`/`--config-path` of a verl launch line (a YAML file there, or one of verl's own config names)."""
    fallback = _config_name_feature(config_name)
    if config_name is not None and config_file is None and fallback is None and config_name.removesuffix(
            ".yaml") not in VERL_CONFIG_NAMES:
        config_file = _hydra_file(config_name, config_path)
    layers = []
    if config_file is not None:
        layers.append(_read_yaml(Path(config_file)))
    if overrides:
        layers.append(_parse_overrides(overrides))
    found = (fallback, "--config-name", config_name) if fallback else \
        find_foreign(pair for layer in layers for pair in _flatten(layer))
    if found is not None:
        name = None if config_file is not None else config_name
        raise PluginFallback(*found, plugin_command(overrides, config_file, name, config_path))
    ignored: list[str] = []
    kept_layers = [_filter_known_keys(layer, ignored) for layer in layers]
    try:
        merged = _merge(kept_layers)
        if not _on_the_demo_model(merged):  # the file and the overrides still win
            merged = _merge([{"guard": dict(EXTERNAL_HOST_DEFAULTS)}, *kept_layers])
        config = build(Config, OmegaConf.to_container(merged, resolve=True))
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from None
    validate(config)
    return LoadedConfig(config=config, ignored_verl_keys=sorted(set(ignored)))


def _on_the_demo_model(merged) -> bool:
    """The built-in demo's 0.35M Llama: the built-in path with the arithmetic task (reviews and constraints put
    SmolLM2-135M-Instruct there)."""
    return merged.actor_rollout_ref.model.path == BUILTIN_MODEL and merged.data.builtin_task == "arith"


def _merge(layers: list[dict]):
    merged = OmegaConf.structured(omegaconf_schema(Config))
    for layer in layers:
        merged = OmegaConf.merge(merged, layer)
    return merged


def _config_name_feature(config_name: str | None) -> str | None:
    return VERL_CONFIG_NAMES.get(config_name.removesuffix(".yaml")) if config_name else None


def _hydra_file(config_name: str, config_path: str | None) -> Path:
    name = config_name if config_name.endswith((".yaml", ".yml")) else f"{config_name}.yaml"
    path = Path(config_path or ".").expanduser() / name
    if not path.is_file():
        raise ConfigError(f"--config-name={config_name}: no {name} in --config-path={config_path or '.'}")
    return path


def config_to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(config_to_dict(config)))


def config_to_dict(config: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.create(dataclasses.asdict(config)), resolve=True)


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path}{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


_OVERRIDE = re.compile(r"^\+{0,2}([A-Za-z_][\w.]*)=(.*)$", re.DOTALL)
# Hydra's choice of a config group's option for a package, `actor@actor_rollout_ref.actor=dp_actor`: one key as written
_GROUP_CHOICE = re.compile(r"^\+{0,2}([A-Za-z_][\w/]*@[A-Za-z_][\w.]*)=(\w+)$")
# verl's options of its config groups that are the FSDP engine klguard runs (the others ask for another engine)
FSDP_GROUP_OPTIONS = frozenset({"dp_actor", "dp_critic", "dp_ref", "fsdp", "dp"})


def _parse_overrides(overrides: Sequence[str]) -> dict:
    """verl/Hydra syntax: `a.b=1`, `+a.b=1`, `++a.b=1`, values parsed as YAML (lists, null, numbers)."""
    tree: dict = {}
    for item in overrides:
        choice = _GROUP_CHOICE.match(item)
        if choice:
            tree[choice.group(1)] = choice.group(2)
            continue
        match = _OVERRIDE.match(item)
        if not match:
            raise ConfigError(f"override '{item}' is not of the form key.path=value")
        key, raw = match.groups()
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override '{item}' conflicts with an earlier value of {part}")
            node = child
        node[parts[-1]] = value
    return tree


def _flatten(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def _filter_known_keys(layer: dict, ignored: list[str]) -> dict:
    """Keep our keys, collect verl-only keys in `ignored`, raise on unknown keys."""
    ours, free_form = _schema_keys()
    kept: dict = {}
    for key, value in canonical(_flatten(layer)):
        top = key.split(".")[0]
        if key == "trainer.logger" and isinstance(value, str):  # verl takes one tracker's name as well as a list
            value = [value]
        if "@" in key:  # a config group's option: verl's FSDP ones are what klguard runs anyway
            if value not in FSDP_GROUP_OPTIONS:
                raise ConfigError(f"{key}={value} chooses a verl config that klguard does not read (its FSDP "
                                  f"options: {', '.join(sorted(FSDP_GROUP_OPTIONS))})")
            ignored.append(key)
            continue
        if key in ours or _under(key, free_form) or (isinstance(value, dict) and key in free_form):
            _set(kept, key, value)
        elif _under(key, ours):  # `a.b={c: 1}` where a.b is one of our single-value keys
            leaf = next(k for k in ours if key.startswith(k + "."))
            raise ConfigError(f"{leaf} takes a single value, not a mapping (got {key})")
        elif top in _HYDRA_KEYS or key in verl_keys() or _under(key, verl_keys()) or newer_engine_detail(key) \
                or in_free_form_map(key):
            ignored.append(key)
        else:
            raise ConfigError(_unknown_key_message(key, ours))
    return kept


def _under(key: str, prefixes: set[str] | frozenset[str]) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:i]) in prefixes for i in range(1, len(parts)))


def _set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


def _unknown_key_message(key: str, ours: frozenset[str]) -> str:
    candidates = sorted(ours | verl_keys())
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:  # compare the last part: `actor.clip_ratoi` -> `...actor.clip_ratio`
        leaf = key.rsplit(".", 1)[-1]
        leaves = {c.rsplit(".", 1)[-1]: c for c in sorted(ours)}
        close = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)]
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown config key {key}{hint}"


def schema_fields(cls: type = Config, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """Every leaf field of the schema with its dotted path, in declaration order."""
    for f in dataclasses.fields(cls):
        sub = _dataclass_type(cls, f.name)
        if sub is not None:
            yield from schema_fields(sub, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


def describe_config(config: Config) -> str:
    """`key = value  # description` for every key, values as resolved in `config`."""
    values = dict(_flatten(config_to_dict(config)))
    lines = []
    for path, f in schema_fields():
        value = values.get(path, {} if f.type in ("dict", dict) else None)
        lines.append(f"{path} = {value!r}  # {f.metadata.get('help', '')}")
    return "\n".join(lines) + "\n"


@cache
def _schema_keys() -> tuple[frozenset[str], frozenset[str]]:
    """All leaf keys of the schema, and the keys of free-form dict fields (whose sub-keys are the user's)."""
    leaves = {path: f for path, f in schema_fields()}
    free_form = {path for path, f in leaves.items() if f.type in ("dict", dict)}
    return frozenset(leaves), frozenset(free_form)


def _dataclass_type(cls: type, name: str) -> type | None:
    default = next(f for f in dataclasses.fields(cls) if f.name == name).default_factory
    if default is not dataclasses.MISSING and isinstance(default, type) and dataclasses.is_dataclass(default):
        return default
    return None


@cache
def _choice_fields() -> dict[str, tuple[dataclasses.Field, tuple]]:
    return {path: (f, allowed) for path, f, allowed in choice_fields(Config)}


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or ""
    msg = str(getattr(exc, "msg", "") or exc).splitlines()[0]
    value = getattr(exc, "value", None)
    if key in _choice_fields() and ("expected one of" in msg or "Cannot convert" in msg):  # not one of its Literal
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        return refusal(key, value, *_choice_fields()[key])
    if "Value '" in msg and "could not be converted" in msg:
        expected = msg.rsplit("to ", 1)[-1].rstrip(".")
        return f"{key}={value!r} is not a valid {expected}"
    if "Incompatible value" in msg or "Cannot assign" in msg:
        return f"{key}={value!r} has the wrong type: {msg}"
    return f"{key}: {msg}" if key else msg
