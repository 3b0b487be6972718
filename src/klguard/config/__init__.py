"""Typed configuration with verl's key tree; see schema.py for every key and its description.

The names below load on first use, so that importing a leaf module of this package (`klguard.config.fields`,
which klguard.guard uses) does not import the schema, the loader and torch with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from klguard.errors import ConfigError

if TYPE_CHECKING:
    from klguard.config.loader import LoadedConfig, config_to_dict, config_to_yaml, describe_config, load_config
    from klguard.config.schema import BUILTIN_MODEL, Config

_WHERE = {"LoadedConfig": "loader", "config_to_dict": "loader", "config_to_yaml": "loader",
          "describe_config": "loader", "load_config": "loader", "BUILTIN_MODEL": "schema", "Config": "schema"}

__all__ = ["BUILTIN_MODEL", "Config", "ConfigError", "LoadedConfig", "config_to_dict", "config_to_yaml",
    "describe_config", "load_config"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"klguard.config.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
