"""The runnable snippets of the feature pages run: every ```python block of a page, in order,
in one namespace (a page may build on its earlier blocks). Pages listed here promise that."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
RUNNABLE = ("padding_free.md", "limits.md", "plan_quality.md", "getting_started.md", "rl.md")
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("page", RUNNABLE)
def test_every_python_block_of_the_page_runs(page: str, one_torch_thread: None) -> None:
    blocks = BLOCK.findall((DOCS / page).read_text())
    assert blocks, f"docs/{page} has no python block"
    namespace: dict[str, object] = {"__name__": f"docs_{page}"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/{page}[block {i}]", "exec"), namespace)


def test_the_readme_quickstart_runs(one_torch_thread: None) -> None:
    """The README's first screen (also the site's Getting started page) runs as it is."""
    text = (DOCS.parent / "README.md").read_text()
    section = text.split("<!-- --8<-- [start:quickstart] -->", 1)[1]
    blocks = BLOCK.findall(section.split("<!-- --8<-- [end:quickstart] -->", 1)[0])
    assert len(blocks) == 3  # padded, padding-free, numpy only
    namespace: dict[str, object] = {"__name__": "readme_quickstart"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md[quickstart {i}]", "exec"), namespace)
    assert namespace["plan"].stats().n_batches > 0  # type: ignore[attr-defined]


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


def test_the_trl_snippets_run(tmp_path, monkeypatch, one_torch_thread: None) -> None:
    """docs/integrations.md's TRL section, in order, on a tiny random Llama and an in-memory tokenizer."""
    pytest.importorskip("trl", reason="the integrations extra is not installed")
    import sys

    import datasets

    sys.path.insert(0, str(Path(__file__).resolve().parent / "integrations"))
    import tiny_lm

    section = (DOCS / "integrations.md").read_text().split("## TRL `SFTTrainer`", 1)[1].split("\n## ", 1)[0]
    blocks = BLOCK.findall(section)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    tokenizer = tiny_lm.tokenizer()
    namespace: dict[str, object] = {"datasets": datasets, "texts": tiny_lm.texts(40), "tokenizer": tokenizer,
                                    "model": tiny_lm.model(len(tokenizer))}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/integrations.md[TRL block {i}]", "exec"), namespace)
    assert namespace["trainer"].state.global_step > 0 and namespace["packed"].state.global_step > 0
