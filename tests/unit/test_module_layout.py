"""The package's shape stays readable: no module over 600 lines, no import circle between its modules, and one
package per platform under ``hooks/`` whose ``__init__`` exports the hook class the registry names.

The import graph is read from the source (``ast``), every import counted -- module level, inside functions and under
``TYPE_CHECKING`` alike, relative ones resolved -- so a circle hidden behind a lazy or a typing-only import shows
too."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import airflow_provider_tao
from airflow_provider_tao.hooks import PLATFORMS

PACKAGE = Path(airflow_provider_tao.__file__).resolve().parent
MAX_LINES = 600


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import name`` counts as ``pkg.name`` when that is a
    module, else as ``pkg``)."""
    files = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = (f"{base}.{node.module}" if node.module else base) if node.level else str(node.module)
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names]
            else:
                continue
            edges |= {target for target in targets if target in files and target != name}
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def long_modules(root: Path) -> dict[str, int]:
    return {
        name: count for name, path in modules(root).items() if (count := len(path.read_text().splitlines())) > MAX_LINES
    }


def test_no_module_is_over_600_lines() -> None:
    assert long_modules(PACKAGE) == {}


def test_no_two_modules_import_each_other_even_lazily() -> None:
    assert circles(import_graph(PACKAGE)) == []


def test_the_checks_see_a_circle_through_a_typing_only_import(tmp_path: Path) -> None:
    """A circle closed only under ``TYPE_CHECKING`` (how the runner's job / inputs / outputs one was) is found."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import B\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n")
    assert circles(import_graph(package)) == [["pkg.a", "pkg.b"]]
    (package / "c.py").write_text("\n" * (MAX_LINES + 1))
    assert long_modules(package) == {"pkg.c": MAX_LINES + 1}


def test_every_platform_is_a_package_exporting_its_hook() -> None:
    """``hooks/<platform>/`` per platform; the registry's class path (the one provider info, the README and the
    docs name) is the package's export of the class its ``hook`` module defines."""
    for platform, (_, class_path) in PLATFORMS.items():
        module, _, name = class_path.rpartition(".")
        assert module == f"airflow_provider_tao.hooks.{platform}"
        assert (PACKAGE / "hooks" / platform / "__init__.py").is_file()
        assert getattr(importlib.import_module(module), name).__module__ == f"{module}.hook"
