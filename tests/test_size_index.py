"""fitbatch.SizeIndex and build_size_index: the on-disk format, planning from an open index, every
source format against lengths computed directly, resume after a crash, and a real Ray cluster."""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fitbatch
from fitbatch import SizeIndex, build_size_index

pa = pytest.importorskip("pyarrow")  # in the test extra: these run, they never skip in CI
pq = pytest.importorskip("pyarrow.parquet")

REPO = Path(__file__).resolve().parents[1]


def direct_histogram(values: np.ndarray) -> list[int]:
    """The manifest's log2 histogram computed the obvious way: bin 0 below 1, bin k for
    [2**(k-1), 2**k), which is the bit length of the integer part (exact, unlike math.log2)."""
    counts = [0] * 65
    for v in values.tolist():
        counts[0 if v < 1 else min(int(v).bit_length(), 64)] += 1
    while counts and counts[-1] == 0:
        counts.pop()
    return counts


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


# ---------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    ("chunks", "dtype"),
    [
        ([np.array([5, 0, 2**31 - 1]), np.array([7])], "int32"),
        ([np.array([5, 2**31]), np.array([], dtype=np.int64), np.array([2**53])], "int64"),
        ([np.array([1.5, 2.0]), np.array([3])], "float64"),
    ],
)
def test_create_open_round_trip_picks_the_narrowest_dtype(
    tmp_path: Path, chunks: list[np.ndarray], dtype: str
) -> None:
    index = SizeIndex.create(tmp_path / "idx", chunks, source="unit test")
    again = SizeIndex.open(tmp_path / "idx")
    expected = np.concatenate(chunks)
    assert again.sizes.dtype == np.dtype(dtype) and isinstance(again.sizes, np.memmap)
    np.testing.assert_array_equal(again.sizes, expected)
    assert len(again) == len(index) == expected.size and again.num_shards == len(chunks)
    for i, chunk in enumerate(chunks):
        np.testing.assert_array_equal(again.shard(i), chunk)
    assert again.stats["source"] == "unit test" and again.stats["dtype"] == dtype
    assert again.stats["integral"] is (dtype != "float64")
    with pytest.raises(IndexError, match=f"shard {len(chunks)} out of range"):
        again.shard(len(chunks))


def test_manifest_stats_and_merged_histogram_equal_direct_computation(
    tmp_path: Path, functions: np.ndarray
) -> None:
    chunks = np.array_split(functions, 7)
    stats = SizeIndex.create(tmp_path / "idx", chunks).stats
    assert stats["count"] == functions.size
    assert stats["sum"] == int(functions.astype(np.int64).sum()) == 5020888
    assert (stats["min"], stats["max"]) == (int(functions.min()), int(functions.max()))
    assert stats["histogram"] == {"bins": "log2", "counts": direct_histogram(functions)}
    for shard, chunk in zip(stats["shards"], chunks):
        assert shard["histogram"] == direct_histogram(chunk)
        assert (shard["count"], shard["sum"], shard["max"]) == (
            chunk.size,
            int(chunk.sum()),
            int(chunk.max()),
        )
    assert [s["offset"] for s in stats["shards"]] == np.cumsum(
        [0] + [c.size for c in chunks[:-1]]
    ).tolist()


@settings(max_examples=20)  # each example writes an index (fsync per shard)
@given(
    st.lists(st.lists(st.integers(0, 2**53), max_size=20), min_size=1, max_size=5).filter(
        lambda c: any(c)
    )
)
def test_exact_sum_and_histogram_for_any_integers(
    tmp_path_factory: Any, chunks: list[list[int]]
) -> None:
    path = tmp_path_factory.mktemp("idx")
    stats = SizeIndex.create(path / "i", [np.asarray(c, dtype=np.int64) for c in chunks]).stats
    flat = [v for c in chunks for v in c]
    assert stats["sum"] == sum(flat) and stats["max"] == max(
        flat
    )  # exact, no int64 wrap or float rounding
    assert stats["histogram"]["counts"] == direct_histogram(np.asarray(flat, dtype=np.float64))


def test_create_refuses_bad_sizes_and_existing_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"shard 1: .*index 0 \(size nan\)"):
        SizeIndex.create(tmp_path / "a", [[1, 2], [float("nan")]])
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="no sizes"):
        SizeIndex.create(tmp_path / "b", [[]])
    SizeIndex.create(tmp_path / "c", [[1]])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        SizeIndex.create(tmp_path / "c", [[2]])
    assert SizeIndex.create(tmp_path / "c", [[2]], overwrite=True).sizes.tolist() == [2]
    with pytest.raises(FileNotFoundError, match="manifest.json is missing"):
        SizeIndex.open(tmp_path / "nothing")


def test_untrusted_open_detects_a_damaged_column(tmp_path: Path) -> None:
    SizeIndex.create(tmp_path / "idx", [np.array([4.5, 2.0, 8.0])])
    column = np.load(tmp_path / "idx" / "sizes.npy", mmap_mode="r+")
    column[1] = -1.0
    column.flush()
    del column
    trusted = fitbatch.as_sizes(
        SizeIndex.open(tmp_path / "idx")
    )  # the manifest's word: not re-read
    assert trusted.values.tolist() == [4.5, -1.0, 8.0]
    with pytest.raises(ValueError, match=r"index 1 \(size -1.0\).*damaged"):
        fitbatch.as_sizes(SizeIndex.open(tmp_path / "idx", trust=False))
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    manifest["dtype"] = "int32"
    (tmp_path / "idx" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="damaged"):
        SizeIndex.open(tmp_path / "idx")


# ---------------------------------------------------------------------------- planning from an index


@pytest.mark.parametrize("strategy", ["sequential", "sorted", "pooled", "buckets", "packed"])
@pytest.mark.parametrize("kind", ["int32", "float64"])
def test_plan_from_an_open_index_equals_plan_from_the_array(
    tmp_path: Path, functions: np.ndarray, strategy: str, kind: str
) -> None:
    sizes = (
        functions if kind == "int32" else functions * 0.75
    )  # fractional: a read-only memmap plans
    index = SizeIndex.create(tmp_path / "idx", np.array_split(sizes, 5))
    assert index.sizes.dtype == np.dtype(kind)
    for epoch in (0, 3):
        kw: dict[str, Any] = {"cost": "padded", "strategy": strategy, "seed": 11, "epoch": epoch}
        a = fitbatch.plan_batches(SizeIndex.open(index.path), 8192, **kw)
        b = fitbatch.plan_batches(sizes, 8192, **kw)
        np.testing.assert_array_equal(a.order, b.order)
        np.testing.assert_array_equal(a.offsets, b.offsets)
        assert a.stats().as_dict() | {"plan_seconds": 0} == b.stats().as_dict() | {
            "plan_seconds": 0
        }


def test_as_sizes_converts_once_and_a_float_index_is_not_copied(tmp_path: Path) -> None:
    ints = SizeIndex.open(SizeIndex.create(tmp_path / "i", [[3, 1], [2]]).path)
    sizes = fitbatch.as_sizes(ints, n=3)
    assert fitbatch.as_sizes(ints) is sizes and sizes.integral and sizes.values.dtype == np.float64
    with pytest.raises(ValueError, match="n=4 but sizes hold 3"):
        fitbatch.as_sizes(ints, n=4)
    floats = SizeIndex.create(tmp_path / "f", [[0.5, 2]])
    values = fitbatch.as_sizes(floats).values
    assert (
        isinstance(values, np.memmap)
        and not values.flags.writeable
        and not fitbatch.as_sizes(floats).integral
    )


def test_samplers_accept_an_index_and_it_pickles_by_path(
    tmp_path: Path, functions: np.ndarray
) -> None:
    import pickle

    index = SizeIndex.create(tmp_path / "idx", [functions[:3000], functions[3000:5000]])
    copy = pickle.loads(pickle.dumps(index))
    assert len(pickle.dumps(index)) < 1000 and copy.path == index.path and len(copy) == 5000
    kw: dict[str, Any] = {"strategy": "pooled", "seed": 3, "num_replicas": 2, "rank": 1}
    from_index = fitbatch.BudgetBatchSampler(index, 8192, **kw)
    from_array = fitbatch.BudgetBatchSampler(functions[:5000], 8192, **kw)
    assert list(from_index) == list(from_array) and len(from_index) == len(from_array)
    sched = [
        fitbatch.schedule.ScheduledBatchSampler(s, 64, micro_batch_size=8, num_replicas=1, rank=0)
        for s in (index, functions[:5000])
    ]
    assert list(sched[0]) == list(sched[1]) and sum(len(b) for b in sched[0]) == 5000


def test_cli_plans_from_an_index_path(
    tmp_path: Path, functions: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    from fitbatch import cli

    SizeIndex.create(tmp_path / "idx", np.array_split(functions, 3))
    np.save(tmp_path / "f.npy", functions)

    def plan(source: Path) -> dict[str, Any]:
        assert (
            cli.main(["plan", str(source), "--budget", "8192", "--strategy", "sorted", "--json"])
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        for r in out["rows"]:
            for e in [*r["per_epoch"], r["mean"]]:
                e["plan_seconds"] = 0
        return out

    a, b = plan(tmp_path / "idx"), plan(tmp_path / "f.npy")
    assert a["n_samples"] == functions.size and a["rows"] == b["rows"]
    assert cli.main(["sizes", str(tmp_path / "idx"), "-o", str(tmp_path / "out.npy")]) == 0
    assert "58,754 sizes, total 5,020,888" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), functions)


# ---------------------------------------------------------------------------- sources


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: Any, request: Any) -> tuple[Path, np.ndarray]:
    """4 parquet files from real function lengths: list, string, binary and numeric columns."""
    lengths = np.load(REPO / "tests" / "data" / "cpython_stdlib_functions.npy")[:2400].astype(
        np.int64
    )
    d = tmp_path_factory.mktemp("parquet")
    for k, part in enumerate(np.array_split(lengths, 4)):
        table = pa.table(
            {
                "ids": [list(range(n)) for n in part.tolist()],
                "text": ["é" * n for n in part.tolist()],  # 2 bytes, 1 character each
                "blob": [b"\0" * n for n in part.tolist()],
                "tokens": part,
            }
        )
        pq.write_table(table, d / f"part-{k:02d}.parquet")
    (d / "_SUCCESS").write_bytes(b"")  # what Spark leaves beside its parquet files
    return d, lengths


@pytest.mark.parametrize("column", ["ids", "text", "blob", "tokens"])
def test_build_from_parquet_equals_lengths(
    tmp_path: Path, parquet_dir: tuple[Path, np.ndarray], column: str
) -> None:
    d, lengths = parquet_dir
    index = build_size_index(str(d / "*.parquet"), tmp_path / "idx", column=column, workers=1)
    np.testing.assert_array_equal(index.sizes, lengths)
    assert index.num_shards == 4 and index.stats["source"].startswith("parquet: ")
    assert [s["name"] for s in index.stats["shards"]] == [
        str(d / f"part-{k:02d}.parquet") for k in range(4)
    ]


def test_build_from_parquet_with_sizeof_and_errors(
    tmp_path: Path, parquet_dir: tuple[Path, np.ndarray], caplog: pytest.LogCaptureFixture
) -> None:
    d, lengths = parquet_dir
    index = build_size_index(
        [str(d)],
        tmp_path / "idx",
        column="text",
        sizeof=lambda texts: [len(t.encode()) for t in texts],
        workers=2,
    )
    np.testing.assert_array_equal(index.sizes, 2 * lengths)
    assert "parquet source: 1 other files left out" in caplog.text and "_SUCCESS" in caplog.text
    with pytest.raises(ValueError, match=r"has 4 columns .*column="):
        build_size_index(str(d), tmp_path / "other", workers=1)
    with pytest.raises(
        ValueError, match=r"unknown engine 'spark'; expected one of \('local', 'ray'\)"
    ):
        build_size_index(str(d), tmp_path / "other", engine="spark")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no size index"):
        build_size_index(str(d), tmp_path / "busy", column="ids", workers=1)
    with pytest.raises(ValueError, match="another source"):
        build_size_index(str(d), tmp_path / "idx", column="ids", workers=1)


def test_build_from_a_hf_dataset(tmp_path: Path, functions: np.ndarray) -> None:
    datasets = pytest.importorskip("datasets")
    lengths = functions[:1500]
    ds = datasets.Dataset.from_dict(
        {"input_ids": [[1] * n for n in lengths.tolist()], "label": list(range(1500))}
    )
    index = build_size_index(
        ds, tmp_path / "idx", column="input_ids", rows_per_shard=400, workers=2
    )
    np.testing.assert_array_equal(index.sizes, lengths)
    assert [s["name"] for s in index.stats["shards"]] == [
        "rows[0:400]",
        "rows[400:800]",
        "rows[800:1200]",
        "rows[1200:1500]",
    ]


def test_build_from_files_by_byte_size(tmp_path: Path, pytokens: np.ndarray) -> None:
    fsspec = pytest.importorskip("fsspec")
    lengths = pytokens[:40] // 64
    for i, n in enumerate(lengths.tolist()):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"f{i:03d}.bin").write_bytes(b"x" * n)
    index = build_size_index(str(tmp_path / "data"), tmp_path / "idx", rows_per_shard=16)
    np.testing.assert_array_equal(index.sizes, lengths)
    np.testing.assert_array_equal(index.sizes, fitbatch.sizes.from_files(tmp_path / "data"))
    assert index.num_shards == 3
    mem = fsspec.filesystem("memory")
    for i, n in enumerate(lengths[:5].tolist()):
        mem.pipe(f"/fitbatch-index-test/f{i}.bin", b"y" * n)
    np.testing.assert_array_equal(
        build_size_index("memory://fitbatch-index-test/", tmp_path / "mem", workers=1).sizes,
        lengths[:5],
    )


def write_megatron_idx(
    path: Path, sequence_lengths: np.ndarray, document_indices: np.ndarray
) -> None:
    """The Megatron-Core MMIDIDX layout: magic, <Q version 1, <B dtype code, <Q sequences,
    <Q documents, int32 sequence_lengths, int64 sequence_pointers, int64 document_indices."""
    itemsize = 4  # dtype code 4: int32 tokens
    pointers = np.concatenate([[0], np.cumsum(sequence_lengths[:-1].astype(np.int64) * itemsize)])
    with open(path, "wb") as fh:
        fh.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4))
        fh.write(
            struct.pack("<Q", sequence_lengths.size) + struct.pack("<Q", document_indices.size)
        )
        fh.write(sequence_lengths.astype("<i4").tobytes() + pointers.astype("<i8").tobytes())
        fh.write(document_indices.astype("<i8").tobytes())


def test_build_from_megatron_idx(tmp_path: Path, functions: np.ndarray) -> None:
    a, b = functions[:1000], functions[1000:1700]
    write_megatron_idx(tmp_path / "a_text_document.idx", a, np.arange(a.size + 1))
    write_megatron_idx(tmp_path / "b_text_document.idx", b, np.arange(0, b.size + 1, 2))
    (tmp_path / "a_text_document.bin").write_bytes(b"")  # the token data: not read
    index = build_size_index(
        [str(tmp_path / "a_text_document.idx"), str(tmp_path / "b_text_document.idx")],
        tmp_path / "idx",
        rows_per_shard=300,
    )
    np.testing.assert_array_equal(index.sizes, np.concatenate([a, b]))
    assert index.num_shards == 4 + 3
    (tmp_path / "bad.idx").write_bytes(b"NOTMAGIC!" + bytes(30))
    with pytest.raises(ValueError, match="not a Megatron .idx file"):
        build_size_index(str(tmp_path / "bad.idx"), tmp_path / "bad")


def write_mds(root: Path, shards: list[list[dict[str, Any]]]) -> None:
    """MosaicML Streaming's MDS layout: per shard ``uint32 count, uint32 offsets[count+1]`` then
    the samples, each a uint32 size per variable-size column then the columns' bytes (columns
    sorted by name); ``index.json`` lists the shards."""
    names, encodings, widths = ["id", "text"], ["int", "str"], [8, None]
    infos = []
    for k, samples in enumerate(shards):
        encoded = []
        for s in samples:
            text = s["text"].encode()
            encoded.append(
                np.array([len(text)], "<u4").tobytes() + np.int64(s["id"]).tobytes() + text
            )
        offsets = np.cumsum([0] + [len(e) for e in encoded]).astype("<u4") + 4 * (len(samples) + 2)
        data = np.uint32(len(samples)).tobytes() + offsets.tobytes() + b"".join(encoded)
        basename = f"shard.{k:05d}.mds"
        (root / basename).write_bytes(data)
        infos.append(
            {
                "column_encodings": encodings,
                "column_names": names,
                "column_sizes": widths,
                "compression": None,
                "format": "mds",
                "hashes": [],
                "samples": len(samples),
                "raw_data": {"basename": basename, "bytes": len(data), "hashes": {}},
                "size_limit": 1 << 26,
                "version": 2,
                "zip_data": None,
            }
        )
    (root / "index.json").write_text(json.dumps({"shards": infos, "version": 2}))


def test_build_from_mds(tmp_path: Path, pytokens: np.ndarray) -> None:
    lengths = (pytokens[:90] // 16).tolist()
    samples = [{"id": i, "text": "t" * n} for i, n in enumerate(lengths)]
    write_mds(tmp_path, [samples[:50], samples[50:]])
    text = build_size_index(str(tmp_path), tmp_path / "text", column="text")
    np.testing.assert_array_equal(text.sizes, lengths)
    whole = build_size_index(str(tmp_path / "index.json"), tmp_path / "whole", workers=1)
    np.testing.assert_array_equal(whole.sizes, np.asarray(lengths) + 4 + 8)  # head + id + text
    assert build_size_index(str(tmp_path), tmp_path / "id", column="id").sizes.tolist() == [8] * 90
    (tmp_path / "shard.00001.mds").unlink()
    with pytest.raises(ValueError, match="shard.00001.mds is absent"):
        build_size_index(str(tmp_path), tmp_path / "gone")


def test_build_from_webdataset_tars(tmp_path: Path, pytokens: np.ndarray) -> None:
    lengths = (pytokens[:60] // 8).tolist()
    expected_txt, expected_all = [], []
    for k in range(3):
        with tarfile.open(tmp_path / f"shard-{k:04d}.tar", "w") as tar:
            for i in range(20):
                key, n = f"sub/{k:02d}{i:04d}", lengths[20 * k + i]
                members = {
                    f"{key}.txt": b"w" * n,
                    f"{key}.cls": str(i).encode(),
                    f"{key}.json": b"{}" * (i % 3),
                }
                for name, data in members.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                expected_txt.append(n)
                expected_all.append(sum(len(v) for v in members.values()))
    index = build_size_index(str(tmp_path / "shard-*.tar"), tmp_path / "txt", column="txt")
    np.testing.assert_array_equal(index.sizes, expected_txt)
    np.testing.assert_array_equal(
        build_size_index(str(tmp_path / "*.tar"), tmp_path / "all").sizes, expected_all
    )


# ---------------------------------------------------------------------------- resume


def test_resume_after_a_crash_builds_the_identical_index(
    tmp_path: Path, parquet_dir: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fitbatch.index._build as build

    d, _ = parquet_dir
    clean = build_size_index(str(d), tmp_path / "clean", column="ids", workers=1)
    real = build.read_shard
    calls: list[str] = []

    def crash_on_third(shard: Any, column: Any, sizeof: Any) -> np.ndarray:
        calls.append(shard.name)
        if len(calls) == 3:
            raise OSError("disk vanished mid-shard")
        return real(shard, column, sizeof)

    monkeypatch.setattr(build, "read_shard", crash_on_third)
    with pytest.raises(OSError, match="part-02.parquet: disk vanished"):
        build_size_index(str(d), tmp_path / "idx", column="ids", workers=1)
    parts = tmp_path / "idx" / "parts"
    (parts / "part-000002.npy.999.tmp").write_bytes(b"half a shard")  # what a killed writer leaves
    assert sorted(p.name for p in parts.glob("*.npy")) == ["part-000000.npy", "part-000001.npy"]
    with pytest.raises(FileNotFoundError, match="interrupted"):
        SizeIndex.open(tmp_path / "idx")
    calls.clear()
    resumed = build_size_index(str(d), tmp_path / "idx", column="ids", workers=1)
    assert [Path(c).name for c in calls] == [
        "part-02.parquet",
        "part-03.parquet",
    ]  # only what was missing
    assert files_of(Path(resumed.path)) == files_of(Path(clean.path))
    assert not parts.exists()
    calls.clear()
    assert (
        len(build_size_index(str(d), tmp_path / "idx", column="ids", workers=1)) == 2400
        and calls == []
    )


def test_cli_index_then_plan(
    tmp_path: Path, parquet_dir: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    from fitbatch import cli

    d, lengths = parquet_dir
    args = ["index", str(d / "*.parquet"), "-o", str(tmp_path / "idx"), "--column", "tokens"]
    assert cli.main([*args, "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{lengths.size:,} sizes" in out and "4 shards, int32" in out
    np.testing.assert_array_equal(SizeIndex.open(tmp_path / "idx").sizes, lengths)
    assert cli.main(["index", str(d), "-o", str(tmp_path / "other")]) == 2  # 4 columns: which?
    assert "has 4 columns" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main([*args, "--engine", "spark"])
    assert exc.value.code == 2 and "invalid choice: 'spark'" in capsys.readouterr().err


def test_worker_processes_raise_the_shards_error_and_show_progress(
    tmp_path: Path, parquet_dir: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    d, lengths = parquet_dir
    with pytest.raises(ValueError, match=r"part-0[0-3].parquet has no column 'nope'"):
        build_size_index(str(d), tmp_path / "err", column="nope", workers=2)
    index = build_size_index(str(d), tmp_path / "idx", column="tokens", workers=1, progress=True)
    assert "sizing shards" in capsys.readouterr().err and len(index) == lengths.size


# ---------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """One local Ray cluster for the module (2 CPUs, no dashboard); its start-up time is logged."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        if "PYTHONPATH" not in os.environ:  # Ray's workers import this checkout's fitbatch
            mp.setenv("PYTHONPATH", str(REPO / "src"))
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        logging.getLogger(__name__).warning("ray.init took %.1f s", time.perf_counter() - t0)
        yield ray
        ray.shutdown()


def test_ray_engine_builds_the_same_index_byte_for_byte(
    tmp_path: Path, parquet_dir: tuple[Path, np.ndarray], ray_cluster: Any
) -> None:
    d, lengths = parquet_dir
    local = build_size_index(str(d), tmp_path / "local", column="ids", engine="local", workers=2)
    remote = build_size_index(str(d), tmp_path / "ray", column="ids", engine="ray")
    assert ray_cluster.is_initialized()  # an initialised cluster is used, not shut down
    assert files_of(Path(remote.path)) == files_of(Path(local.path))
    np.testing.assert_array_equal(remote.sizes, lengths)
    with pytest.raises(ValueError, match=r"part-0[0-3].parquet.*has no column 'nope'"):
        build_size_index(str(d), tmp_path / "err", column="nope", engine="ray")
    chars = build_size_index(  # a lambda travels to Ray's workers too (cloudpickle)
        str(d),
        tmp_path / "chars",
        column="text",
        sizeof=lambda t: [len(x) for x in t],
        engine="ray",
    )
    np.testing.assert_array_equal(chars.sizes, lengths)


def test_docs_scale_examples_run() -> None:
    import doctest

    result = doctest.testfile(
        str(REPO / "docs" / "scale.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert result.attempted >= 10 and result.failed == 0


def test_an_empty_shard_keeps_a_whole_number_index_whole(tmp_path: Path) -> None:
    """An empty list reads as float64: the index turned float, and planned against the budget
    lowered for fractional sizes (4 batches where 2 fit)."""
    index = SizeIndex.create(tmp_path / "idx", [[5, 5, 5, 5], []])
    assert index.sizes.dtype == np.int32 and index.stats["integral"]
    assert fitbatch.plan_batches(index, 10, cost="sum", strategy="sequential").to_lists() == [[0, 1], [2, 3]]


def test_create_with_no_sizes_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no sizes"):
        SizeIndex.create(tmp_path / "idx", [])
    assert not (tmp_path / "idx").exists()
    assert len(SizeIndex.create(tmp_path / "idx", [[1, 2]])) == 2  # the path is free


def test_another_sizeof_at_the_same_path_is_refused(tmp_path: Path) -> None:
    """Two lambdas have one name: the code tells them apart (the old index was returned)."""
    pq.write_table(pa.table({"text": ["a bb ccc", "dd e"]}), tmp_path / "t.parquet")
    chars = build_size_index(str(tmp_path / "t.parquet"), tmp_path / "idx", column="text",
                             sizeof=lambda texts: [len(t) for t in texts], workers=1)
    assert chars.sizes.tolist() == [8, 4]
    with pytest.raises(ValueError, match="holds an index of another source"):
        build_size_index(str(tmp_path / "t.parquet"), tmp_path / "idx", column="text",
                         sizeof=lambda texts: [len(t.split()) for t in texts], workers=1)
    again = build_size_index(str(tmp_path / "t.parquet"), tmp_path / "idx", column="text",
                             sizeof=lambda texts: [len(t) for t in texts], workers=1)
    assert again.sizes.tolist() == [8, 4]  # the same code: the finished index, opened


def test_ray_engine_error_is_the_tasks_own_one_line(
    tmp_path: Path, ray_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shard with a null printed Ray's multi-line, colour-coded traceback as the CLI's one line."""
    from fitbatch import cli

    pq.write_table(pa.table({"n": pa.array([3, None, 5], pa.int64())}), tmp_path / "null.parquet")
    with pytest.raises(ValueError) as exc:
        build_size_index(str(tmp_path / "null.parquet"), tmp_path / "idx", engine="ray")
    assert "\n" not in str(exc.value) and "\x1b" not in str(exc.value)
    assert "row 1: missing value" in str(exc.value)
    assert cli.main(["index", str(tmp_path / "null.parquet"), "-o", str(tmp_path / "cli"), "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fitbatch: error: ") and "missing value" in err
    assert "\x1b" not in err and "Traceback" not in err and "ray::" not in err
