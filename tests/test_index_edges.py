"""Size indexes at their edges (issue 37): a source's shape checked once, a changed source
detected, damaged indexes named with the way out, no half-built directory left in the way."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fitbatch.index import SizeIndex, build_size_index

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write(path: Path, **columns: Any) -> None:
    pq.write_table(pa.table(columns), path)


def shards_of(d: Path, rows: list[list[str]], column: str = "text") -> None:
    d.mkdir(exist_ok=True)
    for k, texts in enumerate(rows):
        write(d / f"part-{k}.parquet", **{column: texts})


def test_a_sizeof_must_return_one_size_per_row(tmp_path: Path) -> None:
    """3 shards of 5 rows and a sizeof returning 2 sizes gave SizeIndex(count=6): 9 rows lost."""
    shards_of(tmp_path / "d", [["a"] * 5] * 3)
    with pytest.raises(ValueError, match=r"part-0\.parquet: sizeof .* returned 2 sizes for 5 rows"):
        build_size_index(str(tmp_path / "d"), tmp_path / "idx", sizeof=lambda rows: [1, 2], workers=1)
    index = build_size_index(str(tmp_path / "d"), tmp_path / "ok", sizeof=lambda rows: [len(r) for r in rows], workers=1)
    assert len(index) == 15


def test_one_column_for_every_parquet_shard(tmp_path: Path) -> None:
    """mix/*.parquet without column= sized "text" in one shard and "body" in another."""
    d = tmp_path / "mix"
    d.mkdir()
    write(d / "a.parquet", text=["xx", "yyy"])
    write(d / "b.parquet", body=["zzzzzz"])
    with pytest.raises(ValueError, match=r"b\.parquet has no column 'text', the only column of .*a\.parquet.*pass column="):
        build_size_index(str(d / "*.parquet"), tmp_path / "idx", workers=1)
    write(d / "b.parquet", text=["zzzzzz"])
    assert build_size_index(str(d / "*.parquet"), tmp_path / "idx", workers=1).sizes.tolist() == [2, 3, 6]


def crash_after(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """read_shard fails on its (k+1)-th call, as a kill after k shards would stop the build."""
    import fitbatch.index._build as build

    real, calls = build.read_shard, []

    def read(shard: Any, column: Any, sizeof: Any) -> np.ndarray:
        calls.append(shard.name)
        if len(calls) > k:
            raise KeyboardInterrupt
        return real(shard, column, sizeof)

    monkeypatch.setattr(build, "read_shard", read)


def test_a_resumed_build_sizes_a_rewritten_shard_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted build re-run after shard 0 changed reused its stale part (600 sizes for 630 rows)."""
    d = tmp_path / "d"
    shards_of(d, [["ab"] * 600, ["c"] * 40, ["d"] * 50])
    with monkeypatch.context() as m:
        crash_after(m, 2)
        with pytest.raises(KeyboardInterrupt):
            build_size_index(str(d), tmp_path / "idx", workers=1)
    assert sorted(p.name for p in (tmp_path / "idx" / "parts").glob("*.npy")) == ["part-000000.npy", "part-000001.npy"]
    write(d / "part-0.parquet", text=["abc"] * 630)  # rewritten: another size and mtime
    index = build_size_index(str(d), tmp_path / "idx", workers=1)
    assert index.sizes.tolist() == [3] * 630 + [1] * 40 + [1] * 50


def test_a_rewrite_of_the_same_size_is_seen_by_its_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "d"
    shards_of(d, [["a", "bbb"] * 3, ["c"] * 4])
    with monkeypatch.context() as m:
        crash_after(m, 1)
        with pytest.raises(KeyboardInterrupt):
            build_size_index(str(d), tmp_path / "idx", workers=1)
    before = (d / "part-0.parquet").stat()
    write(d / "part-0.parquet", text=["aa", "bb"] * 3)  # as many bytes, other sizes
    os.utime(d / "part-0.parquet", ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert (d / "part-0.parquet").stat().st_size == before.st_size
    index = build_size_index(str(d), tmp_path / "idx", workers=1)
    assert index.sizes.tolist() == [2] * 6 + [1] * 4


def test_a_finished_index_of_a_rewritten_source_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "d"
    shards_of(d, [["ab"] * 6, ["c"] * 4])
    assert len(build_size_index(str(d), tmp_path / "idx", workers=1)) == 10
    assert len(build_size_index(str(d), tmp_path / "idx", workers=1)) == 10  # unchanged: reused
    write(d / "part-1.parquet", text=["c"] * 9)
    with pytest.raises(ValueError, match=r"changed since .*part-1\.parquet.*rebuild it"):
        build_size_index(str(d), tmp_path / "idx", workers=1)


def test_a_listing_index_sees_a_file_that_changed_size(tmp_path: Path) -> None:
    d = tmp_path / "files"
    d.mkdir()
    for name, n in [("a.bin", 3), ("b.bin", 5)]:
        (d / name).write_bytes(b"x" * n)
    assert build_size_index(str(d), tmp_path / "idx", workers=1).sizes.tolist() == [3, 5]
    (d / "b.bin").write_bytes(b"x" * 7)
    with pytest.raises(ValueError, match="changed since"):
        build_size_index(str(d), tmp_path / "idx", workers=1)


def test_a_build_over_empty_shards_leaves_the_path_free(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    for k in range(2):
        write(d / f"e{k}.parquet", text=pa.array([], pa.string()))
    with pytest.raises(ValueError, match="no sizes"):
        build_size_index(str(d), tmp_path / "idx", workers=1)
    assert not (tmp_path / "idx" / "parts").exists()
    shards_of(tmp_path / "other", [["abc"]])
    assert build_size_index(str(tmp_path / "other"), tmp_path / "idx", workers=1).sizes.tolist() == [3]


@pytest.fixture
def index(tmp_path: Path) -> Path:
    SizeIndex.create(tmp_path / "idx", [np.array([3, 1, 4]), np.array([1, 5])])
    return tmp_path / "idx"


def damage(index: Path, how: str) -> None:
    manifest = index / "manifest.json"
    if how == "bad json":
        manifest.write_text('{"format": "fitbatch-size-index", ')
    elif how == "not an object":
        manifest.write_text("[1, 2]")
    elif how.startswith("no "):
        data = json.loads(manifest.read_text())
        key = how[3:]
        if key.startswith("shards[]."):
            del data["shards"][0][key[9:]]
        else:
            del data[key]
        manifest.write_text(json.dumps(data))
    elif how == "truncated column":
        column = index / "sizes.npy"
        column.write_bytes(column.read_bytes()[:-6])
    elif how == "garbage column":
        (index / "sizes.npy").write_bytes(b"\x93NUMPY garbage" * 3)
    elif how == "empty column":
        (index / "sizes.npy").write_bytes(b"")
    else:  # pragma: no cover
        raise AssertionError(how)


DAMAGES = ["bad json", "not an object", "no count", "no shards", "no dtype", "no shards[].offset",
           "truncated column", "garbage column", "empty column"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_index_is_named_with_rebuild_it(index: Path, how: str) -> None:
    damage(index, how)
    with pytest.raises(ValueError, match="rebuild it") as exc:
        SizeIndex.open(index)
    assert str(index) in str(exc.value)


def test_bad_arguments_of_the_index_api(index: Path, tmp_path: Path) -> None:
    opened = SizeIndex.open(index)
    with pytest.raises(TypeError, match=r"shard index must be an int, got '1'"):
        opened.shard("1")  # type: ignore[arg-type]
    assert opened.shard(np.int64(1)).tolist() == [1, 5]
    with pytest.raises(TypeError, match=r"chunks must be an iterable of 1-D arrays.*got int"):
        SizeIndex.create(tmp_path / "five", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"chunks must be an iterable of 1-D arrays.*got ndarray"):
        SizeIndex.create(tmp_path / "flat", np.arange(4))
    assert not (tmp_path / "five").exists() and not (tmp_path / "flat").exists()
