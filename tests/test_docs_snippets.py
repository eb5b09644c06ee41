"""The runnable snippets of the feature pages run: every ```python block of a page, in order,
in one namespace (a page may build on its earlier blocks). Pages listed here promise that."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
RUNNABLE = ("padding_free.md", "limits.md", "plan_quality.md", "rl.md")
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("page", RUNNABLE)
def test_every_python_block_of_the_page_runs(page: str, one_torch_thread: None) -> None:
    blocks = BLOCK.findall((DOCS / page).read_text())
    assert blocks, f"docs/{page} has no python block"
    namespace: dict[str, object] = {"__name__": f"docs_{page}"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/{page}[block {i}]", "exec"), namespace)


def test_the_stream_shuffling_snippet_runs() -> None:
    text = (DOCS / "streaming.md").read_text()
    section = text.split("## Shuffling", 1)[1].split("\n## ", 1)[0]
    (block,) = BLOCK.findall(section)
    namespace: dict[str, object] = {}
    exec(compile(block, "docs/streaming.md[shuffling]", "exec"), namespace)
    assert len(namespace["batches"]) > 0


def test_the_windowed_planning_example_runs() -> None:
    """docs/scale.md's windowed planning example, as the doctest it is written as."""
    import doctest

    section = (DOCS / "scale.md").read_text().split("## Windowed planning", 1)[1]
    (block,) = BLOCK.findall(section.split("\n## ", 1)[0])
    test = doctest.DocTestParser().get_doctest(block, {}, "docs/scale.md[windowed]", "docs/scale.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.summarize().failed == 0 and test.examples
