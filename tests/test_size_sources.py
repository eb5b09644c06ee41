"""``fitbatch.sizes`` helpers: columns, tokenizers, ``datasets``, files and objects (local and S3)."""

from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fitbatch.sizes as S

CLI_DATA = Path(__file__).resolve().parent / "cli_data"


# ---------------------------------------------------------------------------- import hygiene


def test_sizes_module_imports_only_numpy() -> None:
    code = (
        "import sys, fitbatch.sizes, fitbatch.sizes\n"
        "bad = [m for m in ('fsspec', 's3fs', 'pyarrow', 'pandas', 'datasets', 'matplotlib') if m in sys.modules]\n"
        "print(bad)"
    )
    # fitbatch/__init__ imports torch (which may import tqdm); the optional data libraries must stay out.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_optional_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)
    monkeypatch.setitem(sys.modules, "fsspec.core", None)
    with pytest.raises(ImportError, match=r"pip install 'fitbatch\[fsspec\]'"):
        S.from_files("memory://nothing/here/")


# ---------------------------------------------------------------------------- columns


def test_from_array_numpy_list_and_strings() -> None:
    assert S.from_array(np.array([3, 1, 2], dtype=np.int32)).dtype == np.int64
    assert S.from_array([1.5, 2]).tolist() == [1.5, 2.0]
    assert S.from_array(np.array(["4", "5"])).tolist() == [4, 5]
    with pytest.raises(ValueError, match=r"column 'len' row 2: 'x' is not a number"):
        S.from_array(["1", "2", "x"], name="len")
    with pytest.raises(ValueError, match=r"row 1: missing value \(NaN\)"):
        S.from_array([1.0, float("nan")])
    with pytest.raises(ValueError, match=r"non-negative and finite; 1 bad value: index 1"):
        S.from_array([1, -2])


def test_from_array_pyarrow_and_pandas() -> None:
    pa = pytest.importorskip("pyarrow")
    pd = pytest.importorskip("pandas")
    assert S.from_array(pa.chunked_array([[1, 2], [3]])).tolist() == [1, 2, 3]
    assert S.from_array(pa.array([2.5, 1.0])).tolist() == [2.5, 1.0]
    assert S.from_array(pd.Series([7, 8])).tolist() == [7, 8]
    with pytest.raises(ValueError, match=r"row 2: missing value \(1 missing in all\)"):
        S.from_array(pa.chunked_array([[1, 2], [None]]))
    with pytest.raises(ValueError, match=r"row 0: missing value"):
        S.from_array(pd.Series([None, 1.0]))
    with pytest.raises(ValueError, match=r"row 1: 'b' is not a number"):
        S.from_array(pa.array(["1", "b"]))


def test_from_source_formats_agree() -> None:
    pytest.importorskip("pyarrow")
    want = [5, 3, 8, 2, 7, 4, 6, 1, 9]
    for name, column in (("small.npy", None), ("small.txt", None), ("small.csv", "tokens"), ("small.parquet", "tokens")):
        got = S.from_source(CLI_DATA / name, column=column)
        assert got.dtype == np.int64 and got.tolist() == want, name
    real = np.load(Path(__file__).resolve().parent / "data" / "cpython_stdlib_pytokens.npy")
    assert np.array_equal(S.from_source(CLI_DATA / "pytokens.csv", column="tokens"), real)
    assert np.array_equal(S.from_source(CLI_DATA / "pytokens.parquet", column="tokens"), real)


# ---------------------------------------------------------------------------- tokenizers and datasets


def _python_tokenizer(batch: list[str]) -> list[list[Any]]:
    """A real tokenizer: Python's own (``tokenize``), one token list per source text."""
    return [list(tokenize.generate_tokens(io.StringIO(text).readline)) for text in batch]


@pytest.fixture(scope="module")
def sources() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"]) / "json"
    return [p.read_text(encoding="utf-8") for p in sorted(root.glob("*.py"))]


def test_readers_refuse_booleans_and_integers_float64_cannot_hold(tmp_path: Path) -> None:
    big = 2**53 + 1
    np.save(tmp_path / "flags.npy", np.array([True, False]))
    with pytest.raises(ValueError, match=r"flags\.npy: sizes must be numbers, got booleans"):
        S.from_source(tmp_path / "flags.npy")
    np.save(tmp_path / "huge.npy", np.array([1, 2**63 + 5], dtype=np.uint64))
    with pytest.raises(ValueError, match=r"huge\.npy: integer sizes must be at most 2\*\*53.*index 1 \(size 9223372036854775813\)"):
        S.from_source(tmp_path / "huge.npy")
    (tmp_path / "big.txt").write_text(f"5\n{big}\n")
    with pytest.raises(ValueError, match=rf"big\.txt line 2: {big} is an integer above 2\*\*53"):
        S.from_source(tmp_path / "big.txt")
    (tmp_path / "big.csv").write_text(f"n\n5\n{big}\n")
    with pytest.raises(ValueError, match=rf"big\.csv line 3 \(column 'n', row 1\): {big} is an integer above 2\*\*53"):
        S.from_source(tmp_path / "big.csv")
    with pytest.raises(ValueError, match=rf"column 'sizes' row 1: {big} is an integer above"):
        S.from_array([1, big])
    (tmp_path / "float.txt").write_text("5\n1e17\n")  # a float literal: kept, as a float
    assert S.from_source(tmp_path / "float.txt").tolist() == [5.0, 1e17]
    np.save(tmp_path / "edge.npy", np.array([1, 2**53]))
    assert S.from_source(tmp_path / "edge.npy").dtype == np.int64


def test_from_tokenizer_counts_real_tokens(sources: list[str]) -> None:
    got = S.from_tokenizer(sources, _python_tokenizer, batch_size=2)
    assert got.tolist() == [len(_python_tokenizer([t])[0]) for t in sources]
    assert got.min() > 10


def test_from_tokenizer_accepts_hf_and_tokenizers_styles(sources: list[str]) -> None:
    want = S.from_tokenizer(sources, _python_tokenizer)

    def hf_style(batch: list[str]) -> dict[str, list[list[int]]]:  # a transformers tokenizer's return
        return {"input_ids": [list(range(len(t))) for t in _python_tokenizer(batch)], "attention_mask": []}

    class Encoding:
        def __init__(self, n: int) -> None:
            self.ids = list(range(n))

    class TokenizersStyle:  # tokenizers.Tokenizer: encode_batch -> objects with .ids
        def encode_batch(self, batch: list[str]) -> list[Encoding]:
            return [Encoding(len(t)) for t in _python_tokenizer(batch)]

    assert S.from_tokenizer(sources, hf_style).tolist() == want.tolist()
    assert S.from_tokenizer(iter(sources), TokenizersStyle(), batch_size=3).tolist() == want.tolist()
    with pytest.raises(ValueError, match="returned 1 results for a batch of 2 texts"):
        S.from_tokenizer(["a", "b"], lambda b: [b])
    with pytest.raises(TypeError, match="single string"):
        S.from_tokenizer("abc", _python_tokenizer)


class FakeDataset:
    """The slice of ``datasets.Dataset`` that ``from_dataset`` uses (when datasets is absent)."""

    def __init__(self, columns: dict[str, list[Any]]) -> None:
        self.columns = columns
        self.map_calls: list[dict[str, Any]] = []

    @property
    def column_names(self) -> list[str]:
        return list(self.columns)

    def map(self, fn: Any, *, batched: bool, batch_size: int, input_columns: list[str], num_proc: int | None,
            remove_columns: list[str], desc: str) -> FakeDataset:
        assert batched
        self.map_calls.append({"num_proc": num_proc, "input_columns": input_columns})
        out: dict[str, list[Any]] = {}
        values = self.columns[input_columns[0]]
        for start in range(0, len(values), batch_size):
            for k, v in fn(values[start : start + batch_size]).items():
                out.setdefault(k, []).extend(v)
        kept = {k: v for k, v in self.columns.items() if k not in remove_columns}
        return FakeDataset({**kept, **out})

    def with_format(self, kind: str) -> FakeDataset:
        assert kind == "arrow"
        return self

    def __getitem__(self, column: str) -> list[Any]:
        return self.columns[column]


def test_from_dataset_reads_or_computes_the_column(sources: list[str]) -> None:
    ds = FakeDataset({"text": sources, "input_ids": [list(range(len(t))) for t in sources], "n": [len(t) for t in sources]})
    assert S.from_dataset(ds, "n").tolist() == [len(t) for t in sources]
    assert not ds.map_calls
    assert S.from_dataset(ds, "length", source="input_ids", num_proc=2, batch_size=2).tolist() == [len(t) for t in sources]
    assert ds.map_calls == [{"num_proc": 2, "input_columns": ["input_ids"]}]
    tokens = S.from_dataset(ds, "tokens", source="text", tokenizer=_python_tokenizer)
    assert tokens.tolist() == S.from_tokenizer(sources, _python_tokenizer).tolist()
    with pytest.raises(ValueError, match=r"no column 'length'; columns: \['text', 'input_ids', 'n'\]. Pass source="):
        S.from_dataset(ds, "length")
    with pytest.raises(ValueError, match="no column 'ids' to measure"):
        S.from_dataset(ds, "length", source="ids")


def test_from_dataset_with_real_datasets(sources: list[str]) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": sources, "n": [len(t) for t in sources]}).shuffle(seed=0)
    got = S.from_dataset(ds, "tokens", source="text", tokenizer=_python_tokenizer, num_proc=2)
    assert got.tolist() == S.from_tokenizer(ds["text"], _python_tokenizer).tolist()
    assert S.from_dataset(ds, "n").tolist() == [len(t) for t in ds["text"]]  # read as Arrow, shuffled order
    assert S.from_dataset(ds, "chars", source="text", batch_size=2).tolist() == [len(t) for t in ds["text"]]


# ---------------------------------------------------------------------------- local files


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~300 real files of varying sizes from this Python's standard library, nested."""
    root = Path(sysconfig.get_paths()["stdlib"])
    dest = tmp_path_factory.mktemp("tree")
    picked = sorted(root.glob("*.py"))[:200] + sorted((root / "email").rglob("*")) + sorted((root / "json").glob("*"))
    for path in picked:
        if path.is_file():
            target = dest / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return dest


def _expected(root: Path, pattern: str = "**/*") -> tuple[list[str], list[int]]:
    files = sorted(str(p) for p in root.glob(pattern) if p.is_file() and not p.name.startswith(".fitbatch-sizes"))
    return files, [os.path.getsize(p) for p in files]


def test_from_files_local_directory_matches_os(tree: Path) -> None:
    paths, sizes = S.list_files(tree)
    want_paths, want_sizes = _expected(tree)
    assert len(paths) > 250 and paths == want_paths and sizes.tolist() == want_sizes
    assert len(set(sizes.tolist())) > 100  # varying sizes
    assert S.from_files(str(tree) + "/").tolist() == want_sizes
    assert S.from_files(f"file://{tree}").tolist() == want_sizes


def test_from_files_globs(tree: Path) -> None:
    assert S.list_files(tree / "*.py")[0] == _expected(tree, "*.py")[0]  # one level only
    assert S.list_files(f"{tree}/**/*.py")[0] == _expected(tree, "**/*.py")[0]
    assert S.list_files(f"{tree}/email/**.py")[0] == _expected(tree, "email/**/*.py")[0]
    assert S.list_files(f"{tree}/json/[de]*.py")[0] == _expected(tree, "json/[de]*.py")[0]
    one = next(tree.glob("*.py"))
    assert S.list_files(one) == ([str(one)], pytest.approx(np.array([one.stat().st_size])))


def test_from_files_cache_next_to_the_data(tree: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(tree / "json", data)
    first = S.from_files(data, cache=True)
    cache = data / ".fitbatch-sizes.npy"
    assert S.cache_path(data) == str(cache) and cache.exists()
    assert np.array_equal(np.load(cache), first)
    (data / "extra.bin").write_bytes(b"x" * 123)
    assert np.array_equal(S.from_files(data, cache=True), first)  # read from the cache, as asked
    fresh = S.from_files(data)  # the cache file itself is never listed as data
    assert fresh.tolist() == sorted_sizes(data)
    cache.unlink()
    assert S.from_files(data, cache=True).tolist() == sorted_sizes(data)


def sorted_sizes(root: Path) -> list[int]:
    return [os.path.getsize(p) for p in sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".fitbatch-sizes"))]


def test_from_files_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        S.from_files(tmp_path / "nope")
    with pytest.raises(ValueError, match="no files under"):
        S.from_source(tmp_path)
    with pytest.raises(ValueError, match="column= applies to .csv and .parquet files"):
        S.from_source(tmp_path, column="x")


def test_from_files_progress_bar(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    assert S.from_files(tree, progress=True).size > 250
    assert S.from_files(tree, progress=False).size > 250


def test_from_files_memory_filesystem() -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for i in range(30):
        fs.pipe(f"/fitbatch-test/d{i % 3}/f{i:02d}.bin", b"x" * (i * 7))
    paths, sizes = S.list_files("memory://fitbatch-test/")
    assert len(paths) == 30 and paths[0].startswith("memory://")
    assert sorted(sizes.tolist()) == [i * 7 for i in range(30)]
    assert S.from_files("memory://fitbatch-test/d1/*.bin").tolist() == [i * 7 for i in range(1, 30, 3)]
    fs.rm("/fitbatch-test", recursive=True)


# ---------------------------------------------------------------------------- S3 through a real server


class S3Server:
    """moto's S3 server on 127.0.0.1, with every HTTP request it receives logged."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        app = DomainDispatcherApplication(create_backend_app)
        self.requests: list[tuple[str, str, str]] = []

        def logged(environ: dict[str, Any], start_response: Any) -> Any:
            self.requests.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")))
            return app(environ, start_response)

        self.server = make_server("127.0.0.1", 0, logged, threaded=True, request_handler=Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, name="moto-s3", daemon=True)
        self.thread.start()
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)

    def listings(self) -> list[str]:
        return [q for m, _, q in self.requests if m == "GET" and "list-type=2" in q]


N_PREFIXES, PER_PREFIX = 4, 800


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[S3Server, dict[str, Any]]]:
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install s3fs)")
    try:
        import boto3
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        server = S3Server()
    except Exception as exc:  # noqa: BLE001 - any failure to start means: skip, saying why
        pytest.skip(f"cannot start moto's S3 server on 127.0.0.1: {exc!r}")
    client = boto3.client("s3", endpoint_url=server.url, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket="fitbatch")
    client.put_object(Bucket="fitbatch", Key="shards/readme.txt", Body=b"hello")  # real PUTs go through too
    # Thousands of objects: written straight into the server's (in-process) backend, for speed;
    # the listings under test all go through HTTP.
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for p in range(N_PREFIXES):
        for i in range(PER_PREFIX):
            backend.put_object("fitbatch", f"shards/p{p}/s{i:05d}.tar", b"x" * ((i * 37 + p) % 1000))
    options = {"endpoint_url": server.url, "key": "testing", "secret": "testing",
               "client_kwargs": {"region_name": "us-east-1"}}
    yield server, options
    server.close()


def test_s3_listing_is_one_request_per_prefix(s3: tuple[S3Server, dict[str, Any]]) -> None:
    server, options = s3
    server.requests.clear()
    paths, sizes = S.list_files("s3://fitbatch/shards/", storage_options=options)
    n_objects = N_PREFIXES * PER_PREFIX + 1
    assert len(paths) == n_objects and paths[0] == "s3://fitbatch/shards/p0/s00000.tar"
    want = sorted((f"shards/p{p}/s{i:05d}.tar", (i * 37 + p) % 1000) for p in range(N_PREFIXES) for i in range(PER_PREFIX))
    by_path = dict(zip(paths, sizes.tolist()))
    assert [by_path[f"s3://fitbatch/{k}"] for k, _ in want] == [s for _, s in want]
    directories = 1 + N_PREFIXES
    pages = directories + N_PREFIXES * (math.ceil(PER_PREFIX / 1000) - 1)
    listings = server.listings()
    # one paginated ListObjectsV2 per prefix (+1 existence probe of the root), never one per object
    # one paginated ListObjectsV2 per prefix ("directory"), never a request per object
    assert len(listings) == pages, listings
    assert server.requests == [("GET", "/fitbatch", q) for q in listings]
    # without the trailing slash, one HEAD and one probe listing check whether it is a file
    server.requests.clear()
    assert S.from_files("s3://fitbatch/shards", storage_options=options).size == n_objects
    assert len(server.requests) <= pages + 2


def test_s3_glob_lists_only_the_prefixes_it_needs(s3: tuple[S3Server, dict[str, Any]]) -> None:
    server, options = s3
    server.requests.clear()
    one = S.from_files("s3://fitbatch/shards/p2/*.tar", storage_options=options)
    assert one.tolist() == [(i * 37 + 2) % 1000 for i in range(PER_PREFIX)]
    assert len(server.listings()) == 1
    server.requests.clear()
    every = S.from_files("s3://fitbatch/shards/**.tar", storage_options=options)
    assert every.size == N_PREFIXES * PER_PREFIX
    assert len(server.listings()) == 1 + N_PREFIXES  # fresh listings, not fsspec's cached ones


def test_s3_cache_is_written_next_to_the_data(s3: tuple[S3Server, dict[str, Any]]) -> None:
    server, options = s3
    first = S.from_files("s3://fitbatch/shards/p1/", storage_options=options, cache=True)
    server.requests.clear()
    again = S.from_files("s3://fitbatch/shards/p1/", storage_options=options, cache=True)
    assert np.array_equal(first, again) and server.listings() == []  # read back, no listing
    assert ("GET", "/fitbatch/shards/p1/.fitbatch-sizes.npy", "") in [(m, p, q) for m, p, q in server.requests]
    fresh = S.from_files("s3://fitbatch/shards/p1/", storage_options=options)
    assert np.array_equal(fresh, first)  # the cache object is not counted as data


def test_a_text_file_holds_one_number_per_line(tmp_path: Path) -> None:
    """The fast path split at any whitespace: ``3 4`` on one line made two samples of one."""
    (tmp_path / "two.txt").write_text("12\n3 4\n7\n")
    with pytest.raises(ValueError, match=r"two\.txt line 2: '3 4' is not a number"):
        S.from_source(tmp_path / "two.txt")
    (tmp_path / "spaced.txt").write_text(" 12 \n\n3\t\n")  # blanks around a number are fine
    assert S.from_source(tmp_path / "spaced.txt").tolist() == [12, 3]
