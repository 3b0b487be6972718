"""klguard's settings for a tool that takes only some sections of them (the TRL callback, the verl plugin,
`klguard watch`): the same loader and one-line errors, and a one-line refusal for any other key."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from klguard.config.loader import load_config
from klguard.config.schema import Config
from klguard.errors import ConfigError


def load_restricted(overrides: Sequence[str], prefixes: Sequence[str], *, who: str, elsewhere: str,
                    refused: Mapping[str, str] | None = None) -> Config:
    """The Config of `overrides` ("key=value" strings); a key outside `prefixes` is refused, naming `who` takes
    which keys and where the others go (`elsewhere`); `refused` maps single keys to why they do not apply."""
    if isinstance(overrides, str):
        raise ConfigError(f"{who} takes a list of 'key=value' strings, not one string")
    for item in overrides:
        key = str(item).partition("=")[0].strip().lstrip("+")
        if refused and key in refused:
            raise ConfigError(f"{key} does not apply to {who}: {refused[key]}")
        if "=" in str(item) and not key.startswith(tuple(prefixes)):
            takes = ", ".join(p + "*" if p.endswith(".") else p for p in prefixes)
            raise ConfigError(f"{key} is not a key of {who} (it takes {takes}); {elsewhere}")
    return load_config(overrides=list(overrides)).config


def with_host_defaults(overrides: Sequence[str], defaults: Mapping[str, object], prefix: str = "guard.") -> list[str]:
    """`defaults` (the guard's keys -> values: klguard.guard.config.EXTERNAL_HOST_DEFAULTS) as overrides before the
    user's own, which win: the defaults of a host that runs another trainer's model."""
    if isinstance(overrides, str):
        return list(overrides)  # load_restricted refuses it with its one line
    given = {str(item).partition("=")[0].strip().lstrip("+") for item in overrides}
    return [f"{prefix}{key}={json.dumps(value)}" for key, value in defaults.items()
            if f"{prefix}{key}" not in given] + list(overrides)
