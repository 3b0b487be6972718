"""The package's import graph, read from the source with `ast`: every import, at module level, inside functions
and under `if TYPE_CHECKING:`, resolved to the klguard module it names."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "klguard"

# Layers, lowest first: an import from another package points to a lower layer, never to its own or one above, so
# packages that share a layer stand beside each other and import nothing of one another.
LAYERS: dict[str, int] = {
    "errors": 0,  # the error types every layer raises
    "fields": 1,  # the config sections' building blocks
    "files": 1,  # whole-or-absent files: atomic writes, hashes, cached folders built once
    **dict.fromkeys(("algo", "data", "distributed", "guard"), 2),  # leaves: tensor math, parquet, ranks, the guard
    "config": 3,  # the typed schema, which embeds the leaves' choices and the guard's section
    **dict.fromkeys(("model", "runtime"), 4),  # models and infrastructure, as configured
    "reward": 5,  # rule rewards, reward models (loaded as models), the reward manager
    "ppo": 6,  # the engine
    **dict.fromkeys(("builtin", "integrations"), 7),  # the built-in task; the guard inside other trainers
    "commands": 8,  # the command line, which hands the built-in task to the engine
    "__main__": 9,
}
ROOT = "klguard"  # the package root: its face may re-export anything, so it has no layer


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


def package_of(module: str) -> str:
    """The top-level part of klguard that `module` belongs to (`klguard.ppo.setup` -> `ppo`); ROOT for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def layer_of(module: str) -> int | None:
    """The layer of a klguard module; None for the package root itself."""
    return LAYERS.get(package_of(module)) if package_of(module) != ROOT else None


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between top-level packages (and root modules), without a package's imports of itself."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        mine = package_of(module)
        packages.setdefault(mine, set()).update(package_of(t) for t in targets if package_of(t) != mine)
    return packages


def reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    """Every module that the modules in `start` import, directly or through others."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


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
