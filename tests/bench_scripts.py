"""Benchmark scripts imported in tests as they run from their folder (they import each other by name)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@contextlib.contextmanager
def import_scripts(*names: str, folder: Path = BENCH) -> Iterator[tuple[ModuleType, ...]]:
    """The scripts `names` of `folder`, imported with the folder on sys.path, which it leaves afterwards."""
    sys.path.insert(0, str(folder))
    try:
        yield tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(folder))
