"""Error types that the command line turns into one clear line and an exit code."""

from __future__ import annotations


class UserError(Exception):
    """Something the user gave us is wrong (config, data, paths). Exit code 2, no traceback."""

    exit_code = 2


class ConfigError(UserError):
    """A configuration key or value is wrong; the message names the key."""
