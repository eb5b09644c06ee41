"""Fuzzing ``build_size_index`` against the true sizes (issue 37): random parquet shards,
builds killed after a random number of shards, shards rewritten between runs (other rows, or
the same byte count with a later mtime). Whatever the history, a build that finishes holds the
true sizes of the files as they are now; a finished index whose source changed is refused (and
rebuilt once deleted); a source of empty shards leaves the path free.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fitbatch.index._build as build
from fitbatch.index import build_size_index

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

rows = st.lists(st.integers(0, 30), max_size=6)  # one shard: the length of each row's list
actions = st.lists(
    st.one_of(
        st.tuples(st.just("build"), st.one_of(st.none(), st.integers(0, 3))),  # killed after k shards
        st.tuples(st.just("rewrite"), st.integers(0, 3), rows),
        st.tuples(st.just("touch"), st.integers(0, 3), st.none()),  # same bytes, a later mtime
    ),
    min_size=1,
    max_size=6,
)


def write(path: Path, lengths: list[int], stamp: int) -> None:
    pq.write_table(pa.table({"ids": pa.array([list(range(n)) for n in lengths], pa.list_(pa.int64()))}), path)
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, 1_700_000_000_000_000_000 + stamp * 1_000_000_000))


class Killed(BaseException):
    """A kill mid-build (not an Exception: nothing in the build may catch it)."""


def killing(after: int | None) -> Any:
    real, calls = build.read_shard, []

    def read(shard: Any, column: Any, sizeof: Any) -> np.ndarray:
        calls.append(shard.name)
        if after is not None and len(calls) > after:
            raise Killed
        return real(shard, column, sizeof)

    return mock.patch.object(build, "read_shard", read)


# each example writes parquet files and indexes (an fsync per shard): 12 in CI, the profile's
# count under FITBATCH_HYPOTHESIS=hunt (tests/conftest.py)
EXAMPLES = settings.default.max_examples if os.environ.get("FITBATCH_HYPOTHESIS") == "hunt" else 12


@settings(max_examples=EXAMPLES)
@given(st.lists(rows, min_size=1, max_size=4), actions)
def test_a_finished_build_holds_the_true_sizes_whatever_happened_before(shards: list[list[int]], history: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d, out = Path(tmp) / "src", Path(tmp) / "idx"
        d.mkdir()
        truth = [list(r) for r in shards]
        clock = 0
        for k, r in enumerate(truth):
            write(d / f"part-{k}.parquet", r, clock)
        changed_since_finish = False
        for action in [*history, ("build", None)]:
            kind, arg, new = action if len(action) == 3 else (*action, None)
            if kind in ("rewrite", "touch"):
                k = arg % len(truth)
                clock += 1
                if kind == "rewrite":
                    truth[k] = list(new)
                write(d / f"part-{k}.parquet", truth[k], clock)
                changed_since_finish = changed_since_finish or (out / "manifest.json").exists()
                continue
            expected = [n for r in truth for n in r]
            if (out / "manifest.json").exists() and changed_since_finish:
                with pytest.raises(ValueError, match="changed since"):
                    build_size_index(str(d), out, workers=1)
                shutil.rmtree(out)
                changed_since_finish = False
            try:
                with killing(arg):
                    index = build_size_index(str(d), out, workers=1)
            except Killed:
                assert not (out / "manifest.json").exists()
                continue
            except ValueError as exc:
                assert not expected and "no sizes" in str(exc)
                assert not (out / "parts").exists(), "an empty build leaves the path free"
                continue
            assert index.sizes.tolist() == expected
            assert len(index) == len(expected) and index.num_shards == len(truth)
