"""The package's import graph, read from the source with `ast`: every import, at module level, inside functions
and under `if TYPE_CHECKING:`, resolved to the klguard module it names."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "klguard"

# Layers, lowest first: a module may import its own layer and the ones below, never one above.
LAYERS: dict[str, int] = {
    **dict.fromkeys(("errors", "fields"), 0),  # the error types and config-field helpers every layer uses
    **dict.fromkeys(("algo", "guard", "config", "data", "model", "reward", "distributed"), 1),  # leaves
    "runtime": 2,  # infrastructure
    "ppo": 3,  # the engine
    "integrations": 4,  # the guard inside other trainers
    "builtin": 4,  # the built-in task, handed to the engine by the commands
    "commands": 5,
    "__main__": 5,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest klguard module that `name` (a module, or a name inside one) refers to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every klguard module `path` imports, wherever the import statement sits."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if target == "klguard" or target.startswith("klguard."):
                resolved = _resolve(target, modules)
                if resolved and resolved != me:
                    found.add(resolved)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int | None:
    """The layer of a klguard module; None for the package root itself (its face may re-export anything)."""
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
