"""Every name the scripts outside the package (benchmarks/, tools/, examples/, docs/gen_results.py) import from
klguard exists: a rename inside the package breaks them at the import, and most of them run only by hand."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for pattern in ("benchmarks/*.py", "benchmarks/real_model/*.py", "tools/**/*.py", "examples/**/*.py",
                                   "docs/gen_results.py") for p in ROOT.glob(pattern))


def klguard_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each `from klguard... import name` in the file."""
    return [(node.module, alias.name) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "klguard"
            for alias in node.names]


def test_the_scripts_are_found() -> None:
    assert any(p.name == "watch_reallogs.py" for p in SCRIPTS) and any(klguard_imports(p) for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_klguard_name_a_script_imports_exists(path: Path) -> None:
    for module_name, name in klguard_imports(path):
        module = importlib.import_module(module_name)
        assert hasattr(module, name) or importlib.util.find_spec(f"{module_name}.{name}") is not None, (
            f"{path.relative_to(ROOT)}: `from {module_name} import {name}`: no such name")
