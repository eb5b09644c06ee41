"""The package layout is the architecture: checks that keep it so (docs/architecture.md).

No import cycles between modules at import time, no module over 500 lines, no flat
``_size_*``/``_streaming_*``/``_schedule_*`` modules at the top level, and the concepts a newcomer
looks for each live in one place named after it.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "fitbatch"
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _import_time_nodes(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run when the module is imported (not those under ``if TYPE_CHECKING:``)."""
    for node in body:
        if isinstance(node, ast.If):
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                continue
            yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _import_time_nodes(node.body)
        else:
            yield node


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in _import_time_nodes(ast.parse(path.read_text()).body):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fitbatch"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles() -> None:
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_500_lines(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines: split it by concept"


def test_no_flat_prefixed_modules() -> None:
    flat = [p.name for p in PACKAGE.glob("_*.py") if p.name.startswith(("_size_", "_streaming_", "_schedule_"))]
    assert flat == []
    assert not (PACKAGE / "_pipeline").exists()


@pytest.mark.parametrize(
    ("concept", "module"),
    [
        ("sizes", "fitbatch.sizes"),
        ("size index", "fitbatch.index"),
        ("costs", "fitbatch.costs"),
        ("strategies", "fitbatch.strategies"),
        ("plan", "fitbatch.plan"),
        ("sampler", "fitbatch.sampler"),
        ("resume", "fitbatch.resume"),
        ("stream", "fitbatch.streaming"),
        ("schedule", "fitbatch.schedule"),
        ("pipeline", "fitbatch.pipeline"),
        ("memory", "fitbatch.memory"),
        ("steps", "fitbatch.steps"),
    ],
)
def test_each_concept_has_one_place_named_after_it(concept: str, module: str) -> None:
    assert module in MODULES, f"{concept!r} should live in {module}"
    assert importlib.import_module(module).__doc__, f"{module} needs a docstring saying what it owns"
