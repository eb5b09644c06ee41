"""The package layout is the architecture: checks that keep it so (docs/architecture.md).

No import cycles between modules, counting every import (those run at module load, those inside
functions and those under ``TYPE_CHECKING``); no import from the core into the outer ring
(``integrations/``, ``compat/``); no core module at the top level but the package faces, the
entry point and the shared leaves; no module past a generous sanity bound (modules are split by
concept, never by length); and the concepts a newcomer looks for each live in one place named
after it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "fitbatch"
# a sanity bound, not a design rule: a module this long is probably two concepts
MAX_LINES = 900
# the only modules at the top of the package: its face, the entry point and the shared leaves
TOP_LEVEL = {"__init__.py", "__main__.py", "_lazy.py", "_rng.py", "_validate.py", "_state.py"}
# the outer ring imports the core; the core never imports it
OUTER = ("fitbatch.integrations", "fitbatch.compat")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every fitbatch module ``path`` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_imports_inside_functions_and_type_checking_count(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from fitbatch.plan import BatchPlan\n"
        "def f():\n    from fitbatch.sizes import as_sizes\n"
    )
    assert _imports(module) == {"fitbatch.plan", "fitbatch.sizes"}


def _outer(name: str) -> bool:
    return any(name == o or name.startswith(o + ".") for o in OUTER)


def test_the_core_never_imports_the_outer_ring() -> None:
    wrong = {
        name: sorted(i for i in _imports(path) if _outer(i))
        for name, path in MODULES.items()
        if not _outer(name) and name != "fitbatch"
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_only_faces_and_shared_leaves_at_the_top() -> None:
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == sorted(TOP_LEVEL)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_past_the_sanity_bound(name: str) -> None:
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
        ("plan", "fitbatch.plan._planner"),
        ("sampler", "fitbatch.sampler._budget"),
        ("resume", "fitbatch._state"),
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
