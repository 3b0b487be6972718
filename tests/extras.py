"""Optional extras in tests: skip where one is absent, except under CI=true, where CI installs every extra and its
absence is a failure."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def import_extra(module: str, extra: str) -> ModuleType:
    """`module`, which klguard's optional `extra` brings: imported, or the test skips (raises under CI=true)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{module} is not installed (pip install -e '.[{extra}]' in the clone)")
