"""The import graph of codecrt and codecd: no cycles, no reaching into another package's privates.

Every import statement counts, wherever it is: at module level, inside a
function (a lazy import is still a dependency) and under ``TYPE_CHECKING``.
The graph is read from the sources with ``ast``, so the check needs neither the
native module nor any optional dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"codecrt": ROOT / "bindings" / "codecrt", "codecd": ROOT / "daemon" / "codecd"}


def _modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of both packages."""
    out: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((pkg, *parts))] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``from X import ...`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import statement of a module,
    restricted to modules of the two packages."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(name, node)
            names = [a.name for a in node.names]
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES]
            out += [(s, []) for s in subs]  # `from . import _twostage`: the submodule
            rest = [n for n in names if f"{mod}.{n}" not in MODULES]
            if rest or not subs:
                out.append((mod, rest))
    return [(m, ns) for m, ns in out if m in MODULES]


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _graph() -> dict[str, set[str]]:
    """Module -> the modules importing it runs: the one named, and the packages above it
    whose ``__init__`` runs first (unless the importer is inside them already)."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        deps: set[str] = set()
        for mod, _ in _imports(name):
            deps.add(mod)
            deps |= {p for p in _ancestors(mod) if p in MODULES and not name.startswith(p + ".")
                     and p != name}
        deps.discard(name)
        graph[name] = deps
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def _package_of(name: str) -> str:
    return name if _is_package(name) else name.rpartition(".")[0]


def test_the_graph_sees_every_module():
    """The walk finds both packages' modules and their imports (so its passes mean something)."""
    assert {"codecrt", "codecrt._stream", "codecd.session", "codecd.convert"} <= set(MODULES)
    graph = _graph()
    assert "codecrt._errors" in graph["codecrt._stream"]
    # importing a module runs the __init__ of the packages above it first
    assert "codecd.engine" in graph["codecd.worker"] and "codecd" not in graph["codecd.worker"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycles(package):
    """No chain of imports (module level, lazy or TYPE_CHECKING) leads a module back to itself."""
    graph = _graph()
    sub = {n: {m for m in deps if m.split(".")[0] == package}
           for n, deps in graph.items() if n.split(".")[0] == package}
    cycle = _find_cycle(sub)
    assert cycle is None, " -> ".join(cycle)


def test_no_private_imports_across_packages():
    """A module imports another package's underscore modules and underscore names never."""
    bad = []
    for name in MODULES:
        home = _package_of(name)
        for mod, names in _imports(name):
            if _package_of(mod) == home or mod == home:
                continue
            if mod.rpartition(".")[2].startswith("_") and not _is_package(mod):
                bad.append(f"{name} imports {mod}")
            bad += [f"{name} imports {mod}.{n}" for n in names if n.startswith("_")]
    assert not bad, bad
