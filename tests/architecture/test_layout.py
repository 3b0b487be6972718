"""The layout keeps its shape: imports between packages point down the layers (commands -> built-in task ->
engine -> rewards -> models and infrastructure -> config -> leaves), the engine never reaches the built-in task, no
import circle between modules or between packages, small files and functions, a small package root."""

from __future__ import annotations

import ast

from imports import PACKAGE, cycles, import_graph, layer_of, package_graph, package_of, reachable

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_ROOT_MODULES = 8


def test_every_package_has_a_layer():
    graph = import_graph()
    unplaced = sorted(m for m in graph if m != "klguard" and layer_of(m) is None)
    assert not unplaced, f"modules outside every layer (add them to imports.LAYERS): {unplaced}"


def test_imports_between_packages_point_down_a_layer():
    against = sorted(f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
                     if package_of(m) != package_of(t) and layer_of(m) is not None and layer_of(t) is not None
                     and layer_of(t) >= layer_of(m))
    assert not against, "imports against the layers (or between packages of one layer):\n" + "\n".join(against)


def test_the_engine_never_reaches_the_builtin_task():
    """ppo/ gets the built-in task passed in (klguard.ppo.task); no chain of imports from it leads into builtin/."""
    graph = import_graph()
    engine = {m for m in graph if package_of(m) == "ppo"}
    found = sorted(m for m in reachable(graph, engine) if package_of(m) == "builtin")
    assert not found, f"the engine imports the built-in task: {found}"


# What the engine offers the clients above it: the trainer, the rollout (sampling), what it asks of the built-in task.
# Everything else in ppo/ (checkpointing, guard_host, update, setup, ...) is the trainer's own.
PUBLIC_ENGINE = {"klguard.ppo", "klguard.ppo.trainer", "klguard.ppo.rollout", "klguard.ppo.task"}


def test_clients_of_the_engine_use_only_its_public_modules():
    """integrations/ (the guard inside other trainers) and builtin/ (the task) reach the engine through its public
    modules only, so the engine's internals can move without breaking them."""
    graph = import_graph()
    found = sorted(f"{m} -> {t}" for m, targets in graph.items() if package_of(m) in ("integrations", "builtin")
                   for t in targets if package_of(t) == "ppo" and t not in PUBLIC_ENGINE)
    assert not found, "engine internals imported by its clients:\n" + "\n".join(found)


def test_no_import_circle_between_modules():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_circle_between_packages():
    found = cycles(package_graph(import_graph()))
    assert not found, "package circles:\n" + "\n".join(" <-> ".join(c) for c in found)


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
