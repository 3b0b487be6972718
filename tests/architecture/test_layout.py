"""The layout keeps its shape: imports point down the layers (commands -> engine -> infrastructure -> leaves),
no import circle, small files and functions, a small package root."""

from __future__ import annotations

import ast

from imports import PACKAGE, cycles, import_graph, layer_of

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_ROOT_MODULES = 8


def test_every_package_has_a_layer():
    graph = import_graph()
    unplaced = sorted(m for m in graph if m != "klguard" and layer_of(m) is None)
    assert not unplaced, f"modules outside every layer (add them to imports.LAYERS): {unplaced}"


def test_imports_never_point_up_a_layer():
    upward = sorted(f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
                    if layer_of(m) is not None and layer_of(t) is not None and layer_of(t) > layer_of(m))
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_files_and_functions_stay_small():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            too_long.append(f"{path.relative_to(PACKAGE)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "over the limits:\n" + "\n".join(too_long)


def test_package_root_keeps_only_its_face():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root
