"""The CLI never prints a traceback on bad input (issue 37): every subcommand over a corpus of
bad inputs exits with status 2 and one line on stderr, ``fitbatch...: error: ...``.

In process (``cli.main``), so that a traceback is an exception this test sees; usage errors
(argparse) are held to the same one line.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fitbatch import cli
from fitbatch.index import SizeIndex

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


# cli.main configures logging for its process: undo it after each test (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("restore_logging")


def corpus(d: Path) -> dict[str, Path]:
    """Bad inputs, each a path under ``d``."""
    out: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        out[name] = d / name
        out[name].write_bytes(data)

    def npy(name: str, array: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=True)
        put(name, buf.getvalue())

    put("empty.npy", b"")
    put("garbage.npy", b"\x93NUMPY\x01\x00garbage")
    put("truncated.npy", np.lib.format.header_data_from_array_1_0(np.arange(3)) and b"\x93NUMPY" + b"\0" * 20)
    npy("negative.npy", np.array([3, -1]))
    npy("nan.npy", np.array([1.0, np.nan]))
    npy("strings.npy", np.array(["a", "b"]))
    npy("objects.npy", np.array([{"a": 1}], dtype=object))
    npy("two_d.npy", np.ones((2, 3)))
    npy("bools.npy", np.array([True, False]))
    npy("zero_d.npy", np.array(5))
    put("binary.txt", bytes(range(256)) * 4)
    put("words.txt", b"one\ntwo\n")
    put("huge.txt", b"1e400\n")
    put("binary.csv", b"\xff\xfe\x00tokens\n\x00\x01\n")
    put("ragged.csv", b"a,b\n1\n")
    put("garbage.parquet", b"PAR1 this is not parquet PAR1")
    put("garbage.idx", b"not a megatron index")
    put("short.idx", b"MMIDIDX\x00\x00" + struct.pack("<Q", 1))
    put("garbage.tar", b"not a tar at all" * 50)
    put("weird.md", b"# nothing")
    # parquet files with content problems
    pq.write_table(pa.table({"n": pa.array([3, None], pa.int64())}), d / "nulls.parquet")
    out["nulls.parquet"] = d / "nulls.parquet"
    pq.write_table(pa.table({"a": [1], "b": [2]}), d / "two.parquet")
    out["two.parquet"] = d / "two.parquet"
    pq.write_table(pa.table({"t": pa.array([], pa.string())}), d / "nothing.parquet")
    out["nothing.parquet"] = d / "nothing.parquet"
    pq.write_table(pa.table({"t": [{"x": 1}]}), d / "struct.parquet")
    out["struct.parquet"] = d / "struct.parquet"
    # a tar whose members have no extension
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("noext")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    put("noext.tar", buf.getvalue())
    # directories
    (d / "emptydir").mkdir()
    out["emptydir"] = d / "emptydir"
    mds = d / "mds"
    mds.mkdir()
    (mds / "index.json").write_text("{not json")
    out["mds"] = mds
    mds2 = d / "mds2"
    mds2.mkdir()
    (mds2 / "index.json").write_text(json.dumps({"shards": [{"format": "mds", "raw_data": {"basename": "x.mds"}, "samples": 1}]}))
    out["mds-missing"] = mds2
    # size indexes: finished but damaged, and interrupted
    for how in ("bad-json", "no-count", "no-file", "truncated", "garbage", "interrupted", "no-shards-offset"):
        where = d / f"index-{how}"
        SizeIndex.create(where, [np.array([3, 1, 4]), np.array([5])])
        manifest = where / "manifest.json"
        data = json.loads(manifest.read_text())
        if how == "bad-json":
            manifest.write_text("{")
        elif how == "no-count":
            del data["count"]
            manifest.write_text(json.dumps(data))
        elif how == "no-file":
            (where / "sizes.npy").unlink()
        elif how == "truncated":
            (where / "sizes.npy").write_bytes((where / "sizes.npy").read_bytes()[:-4])
        elif how == "garbage":
            (where / "sizes.npy").write_bytes(b"garbage")
        elif how == "no-shards-offset":
            del data["shards"][0]["offset"]
            manifest.write_text(json.dumps(data))
        else:  # what a killed build leaves: parts and the build record, no manifest
            manifest.unlink()
            (where / "sizes.npy").unlink()
            (where / "parts").mkdir()
            (where / "parts" / "build.json").write_text(json.dumps({"source": "x", "shards": ["a"]}))
            np.save(where / "parts" / "part-000000.npy", np.array([3, 1]))
        out[f"index-{how}"] = where
    out["missing"] = d / "does-not-exist.npy"
    out["missing-glob"] = d / "nothing-*.parquet"
    return out


READ = ["empty.npy", "garbage.npy", "truncated.npy", "negative.npy", "nan.npy", "strings.npy", "objects.npy",
        "two_d.npy", "bools.npy", "zero_d.npy", "binary.txt", "words.txt", "huge.txt", "binary.csv", "ragged.csv",
        "garbage.parquet", "nulls.parquet", "two.parquet", "nothing.parquet", "struct.parquet", "weird.md",
        "emptydir", "index-bad-json", "index-no-count", "index-no-file", "index-truncated", "index-garbage",
        "index-interrupted", "index-no-shards-offset", "missing", "missing-glob"]
INDEX = ["garbage.parquet", "nulls.parquet", "two.parquet", "nothing.parquet", "struct.parquet", "garbage.idx",
         "short.idx", "garbage.tar", "noext.tar", "emptydir", "mds", "mds-missing", "missing", "missing-glob"]


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # argparse
        status = exc.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    err = captured.err
    assert status == 2, f"{argv}: status {status}\nstdout: {captured.out[-500:]}\nstderr: {err[-2000:]}"
    lines = [line for line in err.splitlines() if not line.startswith("WARNING ")]  # logged warnings aside
    assert len(lines) == 1 and lines[0].startswith("fitbatch") and ": error: " in lines[0], f"{argv}: {err!r}"
    assert "Traceback" not in err and "\x1b" not in err
    return lines[0]


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return corpus(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("name", READ)
@pytest.mark.parametrize("command", ["plan", "sizes"])
def test_plan_and_sizes_over_bad_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        bad: dict[str, Path], command: str, name: str) -> None:
    argv = [command, str(bad[name])]
    argv += ["--budget", "100"] if command == "plan" else ["-o", str(tmp_path / "out.npy")]
    line = one_line(capsys, argv)
    if name.startswith("index-"):
        assert str(bad[name]) in line, line  # the index is named
        assert "rebuild it" in line or "interrupted" in line or "missing" in line, line


@pytest.mark.parametrize("name", INDEX)
def test_index_over_bad_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path, bad: dict[str, Path], name: str) -> None:
    one_line(capsys, ["index", str(bad[name]), "-o", str(tmp_path / "idx"), "--workers", "1"])


def good(tmp_path: Path) -> str:
    np.save(tmp_path / "ok.npy", np.array([3, 1, 4, 1, 5]))
    return str(tmp_path / "ok.npy")


BAD_ARGS = [
    ["plan", "{ok}", "--budget", "abc"],
    ["plan", "{ok}", "--budget", "-5"],
    ["plan", "{ok}", "--budget", "inf"],
    ["plan", "{ok}", "--budget", "0.5"],
    ["plan", "{ok}", "--budget", "100", "--column", "x"],
    ["plan", "{ok}", "--budget", "100", "--strategy", "nope"],
    ["plan", "{ok}", "--budget", "100", "--max-batch-size", "0"],
    ["plan", "{ok}", "--budget", "100", "--world-size", "x"],
    ["plan", "{ok}", "--budget", "100", "--epochs", "-1"],
    ["plan", "{ok}", "--budget", "100", "--plot", "{tmp}/no/such/dir/p.png"],
    ["plan", "{ok}", "--budget", "3", "--oversized", "error"],
    ["plan", "{ok}"],
    ["sizes", "{ok}"],
    ["sizes", "{ok}", "-o", "{tmp}"],
    ["sizes", "{ok}", "-o", "{tmp}/no/such/out.npy"],
    ["sizes", "{ok}", "-o", "{tmp}/o.npy", "--paths", "{tmp}/no/such/paths.txt"],
    ["index", "{ok}", "-o", "{ok}"],
    ["index", "{ok}", "-o", "{tmp}/i", "--column", "x"],
    ["index", "{ok}", "-o", "{tmp}/i", "--format", "parquet"],
    ["index", "{ok}", "-o", "{tmp}/i", "--rows-per-shard", "0"],
    ["index", "{ok}", "-o", "{tmp}/i", "--engine", "spark"],
    ["index", "{ok}"],
    ["demo", "--budget", "abc"],
    ["demo", "--limit", "0"],
    ["demo", "--cost", "nope"],
    ["nope"],
    [],
]


@pytest.mark.parametrize("argv", BAD_ARGS, ids=[" ".join(a)[:40] for a in BAD_ARGS])
def test_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]) -> None:
    ok = good(tmp_path)
    one_line(capsys, [a.format(ok=ok, tmp=tmp_path) for a in argv])
