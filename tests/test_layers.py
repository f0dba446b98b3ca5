"""The packages import one another in one direction only: no cycle between packages of ``mainspring``
(a lazy import inside a function counts), and none between the modules of a package."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import mainspring

SRC = Path(mainspring.__file__).parent


def imports(path: Path) -> Iterator[str]:
    """The ``mainspring`` modules ``path`` imports, anywhere in it."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mainspring"):
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("mainspring"))


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def graph(level: int) -> dict[str, set[str]]:
    """Edges between names cut to ``level`` parts (2: packages such as ``mainspring.worker``)."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        source = ".".join(name.split(".")[:level])
        for target in imports(path):
            if target not in MODULES:
                continue  # ``from mainspring.x import name``: the module is the one before the name
            cut = ".".join(target.split(".")[:level])
            if cut != source:
                edges.setdefault(source, set()).add(cut)
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``edges``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_two_packages_import_each_other() -> None:
    assert cycle(graph(2)) is None


def test_no_two_modules_of_a_package_import_each_other() -> None:
    edges = graph(4)  # mainspring.<package>.<module>, and one level below for runtimes
    found = cycle({k: v for k, v in edges.items() if k.count(".") >= 2})
    assert found is None, " -> ".join(found or [])
