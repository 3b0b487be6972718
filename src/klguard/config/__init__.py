"""Typed configuration with verl's key tree; see schema.py for every key and its description."""

from klguard.config.loader import LoadedConfig, config_to_dict, config_to_yaml, describe_config, load_config
from klguard.config.schema import BUILTIN_MODEL, Config
from klguard.errors import ConfigError

__all__ = ["BUILTIN_MODEL", "Config", "ConfigError", "LoadedConfig", "config_to_dict", "config_to_yaml",
    "describe_config", "load_config"]
