"""Make ``klguard`` importable from the source tree when the package is not installed."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("klguard") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
