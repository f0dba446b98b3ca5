"""The packages import one another in one direction only: no cycle between packages of ``mainspring``
(a lazy import inside a function counts), none between the modules of a package, and no import that runs
against the direction the layers are meant to go (a frontend process that imports the controller, say)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

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


# Bottom first: each imports only those before it.
LOWER_LAYERS = ("time", "settings", "protocol", "transport", "models")
PACKAGES = sorted({name.split(".")[1] for name in MODULES if "." in name})  # and the top-level modules


def above(layer: str) -> tuple[str, ...]:
    """What a lower layer must not import: every other package but the lower layers below it."""
    below = LOWER_LAYERS[: LOWER_LAYERS.index(layer)]
    return tuple(p for p in PACKAGES if p != layer and p not in below)


# (importer, what it must not import): a frontend process runs without the controller and the policies;
# the cells' routing reads any policy's forecast, not clockwork's internals; a policy is a pure state
# machine that knows nothing of what serves it.
FORBIDDEN = [
    ("frontend", ("controller", "scheduler", "sim")),
    ("cells", ("scheduler.clockwork",)),
    ("scheduler", ("controller", "frontend", "serving")),
    *((layer, above(layer)) for layer in LOWER_LAYERS),
]


def within(package: str, module: str) -> bool:
    """Whether ``module`` (a dotted name) is ``mainspring.<package>`` or inside it."""
    prefix = f"mainspring.{package}"
    return module == prefix or module.startswith(prefix + ".")


def crossings(importer: str, banned: tuple[str, ...]) -> list[str]:
    """Each import, lazy ones included, by a module of ``importer`` of a module of a ``banned`` package."""
    found = set()
    for name, path in MODULES.items():
        if within(importer, name):
            found |= {f"{name} -> {t}" for t in imports(path) if t in MODULES and any(within(b, t) for b in banned)}
    return sorted(found)


@pytest.mark.parametrize(("importer", "banned"), FORBIDDEN, ids=[importer for importer, _ in FORBIDDEN])
def test_no_package_imports_against_the_direction_of_the_layers(importer: str, banned: tuple[str, ...]) -> None:
    assert crossings(importer, banned) == []


def test_the_direction_check_finds_an_import_that_breaks_a_rule() -> None:
    """The check itself, on an import that exists: were ``cells`` banned from ``scheduler``, its
    signal's reading of a policy's forecast would break the rule."""
    assert "mainspring.cells.signal -> mainspring.scheduler.base" in crossings("cells", ("scheduler",))
