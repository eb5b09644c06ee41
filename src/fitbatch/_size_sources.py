"""Sizes from where data lives: array columns, ``datasets`` columns, tokenizers, files and objects.

Every helper returns a 1-D numpy array (int64 when every size is a whole number, else float64),
validated like :func:`fitbatch.as_sizes`. Optional libraries (``fsspec``, ``pyarrow``, ``pandas``,
``datasets``, ``tqdm``) are imported inside the helpers that need them, never at import time.

File and object sizes come from directory listings: one listing call per directory (an S3
"directory" is one paginated ``ListObjectsV2`` per prefix), never one request per object.

>>> from_array([3, 1, 2])
array([3, 1, 2])
>>> from_tokenizer(["a b c", "d"], lambda batch: [t.split() for t in batch])
array([3, 1])
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.sizes import as_sizes

logger = logging.getLogger(__name__)

CACHE_PREFIX = ".fitbatch-sizes"
_GLOB_CHARS = re.compile(r"[*?\[]")


def _require(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs {module!r}: pip install 'fitbatch[{extra}]' (or pip install {module.split('.')[0]})"
        ) from exc


def _finish(values: NDArray[Any], where: str) -> NDArray[Any]:
    """Validate (non-negative, finite) and return int64 when every size is whole, else float64."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{where}: sizes must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind in "iub":
        out = arr.astype(np.int64, copy=False)
    else:
        out = arr.astype(np.float64, copy=False)
    try:
        as_sizes(out)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if out.dtype == np.float64 and out.size and np.all(out == np.floor(out)) and out.max() < 2**62:
        return out.astype(np.int64)
    return out


def to_numbers(values: Sequence[Any] | NDArray[Any], where: str, first_row: int = 0) -> NDArray[np.float64]:
    """Strings or objects to float64, or ``ValueError`` naming the first bad row and its value.

    >>> to_numbers(["1", "2.5"], "x").tolist()
    [1.0, 2.5]
    >>> to_numbers(["1", "two"], "column 'n'")
    Traceback (most recent call last):
    ...
    ValueError: column 'n' row 1: 'two' is not a number
    """
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        pass
    for i, v in enumerate(values):  # only on failure: find the row to report
        try:
            if v is None or isinstance(v, bool):
                raise ValueError
            float(v)
        except (TypeError, ValueError):
            shown = v.decode(errors="replace") if isinstance(v, bytes) else v
            what = "missing value" if v is None or shown == "" else f"{shown!r} is not a number"
            raise ValueError(f"{where} row {first_row + i}: {what}") from None
    raise ValueError(f"{where}: values are not numbers")  # pragma: no cover - asarray failed on a 2-D ragged input


def from_array(column: Any, *, name: str = "sizes") -> NDArray[Any]:
    """Sizes from a column: numpy array, list, ``pyarrow`` Array/ChunkedArray or ``pandas`` Series.

    Args:
        column: one size per sample; strings that hold numbers are converted.
        name: what to call the column in error messages.

    Returns:
        1-D int64 array (float64 if some size is fractional).

    Raises:
        ValueError: a missing or non-numeric value (its row is named), a negative size.

    >>> from_array(["4", "5"])
    array([4, 5])
    >>> from_array([1.5, 2])
    array([1.5, 2. ])
    """
    where = f"column {name!r}"
    if hasattr(column, "is_null") and hasattr(column, "to_numpy"):  # pyarrow Array / ChunkedArray
        if column.null_count:
            nulls = np.flatnonzero(np.asarray(column.is_null()))
            raise ValueError(f"{where} row {int(nulls[0])}: missing value ({len(nulls)} missing in all)")
        arr = column.to_numpy(zero_copy_only=False) if not hasattr(column, "chunks") else column.to_numpy()
    elif hasattr(column, "isna") and hasattr(column, "to_numpy"):  # pandas Series
        missing = np.asarray(column.isna())
        if missing.any():
            bad = np.flatnonzero(missing)
            raise ValueError(f"{where} row {int(bad[0])}: missing value ({bad.size} missing in all)")
        arr = column.to_numpy()
    elif hasattr(column, "detach"):  # torch
        arr = column.detach().cpu().numpy()
    else:
        arr = np.asarray(column) if not isinstance(column, (list, tuple)) else np.asarray(column, dtype=object)
    if arr.dtype.kind not in "iufb":
        arr = to_numbers(arr.tolist() if arr.dtype == object else arr.astype(object).tolist(), where)
    if arr.dtype.kind == "f" and arr.size and np.isnan(arr).any():
        raise ValueError(f"{where} row {int(np.flatnonzero(np.isnan(arr))[0])}: missing value (NaN)")
    return _finish(arr, where)


# ---------------------------------------------------------------------------- tokenizers


def _token_counts(batch: list[str], tokenizer: Any) -> list[int]:
    """Tokens per text of one batch for an HF tokenizer, a ``tokenizers.Tokenizer`` or a function."""
    if hasattr(tokenizer, "encode_batch"):  # tokenizers.Tokenizer (transformers' have no encode_batch)
        return [len(e.ids) for e in tokenizer.encode_batch(batch)]
    out = tokenizer(batch)
    if hasattr(out, "keys") and "input_ids" in out:  # transformers BatchEncoding / dict
        out = out["input_ids"]
    counts = [len(x) for x in out]
    if len(counts) != len(batch):
        raise ValueError(
            f"the tokenizer returned {len(counts)} results for a batch of {len(batch)} texts; it must "
            "take a list of texts and return one token sequence per text (or a mapping with 'input_ids')"
        )
    return counts


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def from_tokenizer(texts: Iterable[str] | Any, tokenizer: Any, *, batch_size: int = 1024) -> NDArray[np.int64]:
    """Tokens per text: run ``tokenizer`` over a text column in batches.

    Args:
        texts: an iterable of strings, or a ``pyarrow``/``pandas`` string column.
        tokenizer: a ``transformers`` tokenizer (called on a list, ``input_ids`` counted), a
            ``tokenizers.Tokenizer`` (``encode_batch``), or any function taking a list of texts
            and returning one token sequence per text.
        batch_size: texts per tokenizer call.

    Returns:
        int64 token counts, one per text.

    >>> from_tokenizer(["x = 1", "pass"], lambda b: [s.split() for s in b]).tolist()
    [3, 1]
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a column of strings, got a single string")
    if hasattr(texts, "to_pylist"):
        texts = texts.to_pylist()
    elif hasattr(texts, "tolist"):
        texts = texts.tolist()
    counts: list[int] = []
    for batch in _batched(texts, max(1, int(batch_size))):
        counts.extend(_token_counts(batch, tokenizer))
    return np.asarray(counts, dtype=np.int64)


# ---------------------------------------------------------------------------- datasets


def _lengths_batch(values: list[Any], *, column: str, tokenizer: Any) -> dict[str, list[int]]:
    """The ``.map(batched=True)`` function: lengths (or token counts) of one batch."""
    if tokenizer is not None:
        return {column: _token_counts(list(values), tokenizer)}
    return {column: [len(v) for v in values]}


def from_dataset(
    dataset: Any,
    column: str,
    *,
    source: str | None = None,
    tokenizer: Any = None,
    num_proc: int | None = None,
    batch_size: int = 1000,
) -> NDArray[Any]:
    """Sizes from a Hugging Face ``datasets.Dataset`` column, computed when it is missing.

    Args:
        dataset: a ``datasets.Dataset`` (anything with ``column_names``, ``map`` and
            ``with_format``).
        column: the size column; read directly (as Arrow, no Python loop) when present.
        source: when ``column`` is missing, the column to measure: ``len(value)`` of each value
            (token ids, audio arrays), or with ``tokenizer`` the token count of each text.
        tokenizer: see :func:`from_tokenizer`.
        num_proc: processes for ``dataset.map(batched=True, num_proc=...)``.
        batch_size: rows per ``map`` batch.

    Returns:
        1-D int64 (or float64) sizes in dataset order.

    Raises:
        ValueError: ``column`` is missing and no ``source`` is given, or ``source`` is missing.
    """
    names = list(dataset.column_names)
    if column not in names:
        if source is None:
            raise ValueError(
                f"dataset has no column {column!r}; columns: {names}. Pass source='<column>' to "
                f"compute {column!r} as the length (or, with tokenizer=, the token count) of each value"
            )
        if source not in names:
            raise ValueError(f"dataset has no column {source!r} to measure; columns: {names}")
        fn = functools.partial(_lengths_batch, column=column, tokenizer=tokenizer)
        logger.info("computing %r from %r with dataset.map(batched=True, num_proc=%s)", column, source, num_proc)
        dataset = dataset.map(
            fn, batched=True, batch_size=batch_size, input_columns=[source], num_proc=num_proc,
            remove_columns=[c for c in names if c != source] + [source], desc=f"fitbatch: {column}",
        )
    values = dataset.with_format("arrow")[column]
    return from_array(values, name=column)


# ---------------------------------------------------------------------------- files and objects


def _split_glob(path: str) -> tuple[str, str | None]:
    """(root directory to list, glob pattern or None) of a protocol-stripped path."""
    head = _GLOB_CHARS.search(path)
    if head is None:
        return path.rstrip("/") or "/", None
    root = path[: head.start()].rsplit("/", 1)[0]
    return root or "/", path


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regex over whole paths: ``*`` and ``?`` stay in one path component,
    ``**`` crosses any number of them (``a/**/b`` also matches ``a/b``), ``[...]`` as in fnmatch.

    >>> bool(_glob_regex("d/**.tar").match("d/x/y.tar")), bool(_glob_regex("d/*.tar").match("d/x/y.tar"))
    (True, False)
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] in "*?":
            out.append("[^/]*" if pattern[i] == "*" else "[^/]")
            i += 1
        elif pattern[i] == "[" and pattern.find("]", i + 2) != -1:
            end = pattern.find("]", i + 2)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _pattern_depth(root: str, pattern: str) -> int | None:
    """How many directory levels below ``root`` the pattern reaches (None: any, for ``**``)."""
    if "**" in pattern:
        return None
    return pattern[len(root) :].strip("/").count("/") + 1


def _is_cache(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.startswith(CACHE_PREFIX) and base.endswith(".npy")


def _walk_local(root: str, maxdepth: int | None, on_dir: Callable[[int], None]) -> tuple[list[str], list[int]]:
    """``os.scandir`` walk: one directory read per directory and a stat per file (symlinked dirs not followed)."""
    paths: list[str] = []
    sizes: list[int] = []
    stack = [(root, 1)]
    # Invariant: every directory on the stack is still to be read; files of read ones are collected.
    while stack:
        path, depth = stack.pop()
        before = len(paths)
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        if maxdepth is None or depth < maxdepth:
                            stack.append((entry.path, depth + 1))
                    elif entry.is_file():
                        paths.append(entry.path)
                        sizes.append(entry.stat().st_size)
        except (PermissionError, NotADirectoryError) as exc:
            logger.warning("cannot list %s: %s", path, exc)
        on_dir(len(paths) - before)
    return paths, sizes


def _walk_fs(fs: Any, root: str, maxdepth: int | None, on_dir: Callable[[int], None]) -> tuple[list[str], list[int]]:
    """``fs.walk(detail=True)``: one listing per directory (S3: one paginated ListObjectsV2 per prefix)."""
    paths: list[str] = []
    sizes: list[int] = []
    for dirpath, _dirs, files in fs.walk(root, maxdepth=maxdepth, detail=True):
        for name, info in files.items():
            paths.append(info.get("name") or f"{dirpath.rstrip('/')}/{name}")
            sizes.append(int(info.get("size") or 0))
        on_dir(len(files))
    return paths, sizes


def _progress(enabled: bool | None, desc: str) -> Any:
    """A tqdm bar counting files, shown after 2 s (auto: when stderr is a terminal)."""
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return None
    if enabled is None:
        try:
            import tqdm  # noqa: F401
        except ImportError:
            return None
    tqdm_mod = _require("tqdm", "progress", "a progress bar")
    return tqdm_mod.tqdm(desc=desc, unit=" files", delay=2.0, leave=False)


def _url_to_fs(urlpath: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    fsspec_core = _require("fsspec.core", "fsspec", "listing files with fitbatch.sizes.from_files")
    return fsspec_core.url_to_fs(urlpath, **(storage_options or {}))


def list_files(
    urlpath: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> tuple[list[str], NDArray[np.int64]]:
    """Paths and byte sizes of the files under a directory, prefix or glob, sorted by path.

    Args:
        urlpath: a local path or any fsspec URL (``"s3://bucket/prefix/"``,
            ``"s3://bucket/prefix/**.tar"``, ``"gcs://..."``); a glob selects files below
            the longest plain prefix (``**`` at any depth).
        storage_options: passed to the fsspec filesystem (endpoint, credentials).
        progress: a progress bar over directories (``None``: when stderr is a terminal and
            tqdm is installed; shown only for listings longer than 2 s).

    Returns:
        (paths, int64 sizes); local paths are absolute, others keep their protocol.

    Raises:
        FileNotFoundError: nothing exists at ``urlpath``.
        ImportError: ``fsspec`` is needed for non-local URLs.
    """
    url = os.fspath(urlpath)
    local = "://" not in url or url.startswith("file://")
    t0 = time.perf_counter()
    bar = _progress(progress, f"listing {url}")
    on_dir: Callable[[int], None] = (lambda k: None) if bar is None else bar.update
    try:
        if local:
            path = os.path.abspath(url[7:] if url.startswith("file://") else url)
            root, pattern = _split_glob(path)
            if pattern is None and os.path.isfile(root):
                return [root], np.asarray([os.path.getsize(root)], dtype=np.int64)
            if not os.path.isdir(root):
                raise FileNotFoundError(f"no such file or directory: {url!r}")
            paths, sizes = _walk_local(root, None if pattern is None else _pattern_depth(root, pattern), on_dir)
            unstrip: Callable[[str], str] = str
        else:
            fs, stripped = _url_to_fs(url, storage_options)
            root, pattern = _split_glob(stripped)
            fs.invalidate_cache()  # a fresh listing each call, not fsspec's cached one
            if pattern is None and not url.endswith("/") and fs.isfile(root):
                return [fs.unstrip_protocol(root)], np.asarray([fs.size(root)], dtype=np.int64)
            paths, sizes = _walk_fs(fs, root, None if pattern is None else _pattern_depth(root, pattern), on_dir)
            if not paths and pattern is None and not fs.exists(root):
                raise FileNotFoundError(f"no such file, directory or prefix: {url!r}")
            unstrip = fs.unstrip_protocol
    finally:
        if bar is not None:
            bar.close()
    keep = _select(paths, pattern)
    order = sorted(keep, key=paths.__getitem__)
    out_paths = [unstrip(paths[i]) for i in order]
    out_sizes = np.asarray(sizes, dtype=np.int64)[order] if order else np.zeros(0, np.int64)
    logger.info("listed %d files under %s in %.2f s", len(out_paths), url, time.perf_counter() - t0)
    return out_paths, out_sizes


def _select(paths: list[str], pattern: str | None) -> list[int]:
    """Indices of the paths that match the glob and are not fitbatch's own cache files."""
    if pattern is None:
        return [i for i, p in enumerate(paths) if not _is_cache(p)]
    rx = _glob_regex(pattern)
    return [i for i, p in enumerate(paths) if rx.match(p) and not _is_cache(p)]


def cache_path(urlpath: str | os.PathLike[str]) -> str:
    """Where ``from_files(..., cache=True)`` keeps the sizes: a ``.npy`` in the listed directory.

    >>> cache_path("/data/shards/")
    '/data/shards/.fitbatch-sizes.npy'
    >>> cache_path("s3://b/p/**.tar")  # doctest: +ELLIPSIS
    's3://b/p/.fitbatch-sizes-....npy'
    """
    url = os.fspath(urlpath)
    proto, sep, rest = url.partition("://")
    path = rest if sep else url
    root, pattern = _split_glob(path)
    name = CACHE_PREFIX if pattern is None else f"{CACHE_PREFIX}-{hashlib.sha1(pattern.encode()).hexdigest()[:10]}"
    return f"{proto}{sep}{root.rstrip('/')}/{name}.npy" if sep else f"{root.rstrip('/')}/{name}.npy"


def _load_cache(path: str, storage_options: dict[str, Any] | None) -> NDArray[np.int64] | None:
    if "://" not in path:
        return np.load(path, allow_pickle=False) if os.path.isfile(path) else None
    fs, stripped = _url_to_fs(path, storage_options)
    if not fs.exists(stripped):
        return None
    with fs.open(stripped, "rb") as fh:
        return np.load(io.BytesIO(fh.read()), allow_pickle=False)


def _save_cache(path: str, sizes: NDArray[Any], storage_options: dict[str, Any] | None) -> None:
    buf = io.BytesIO()
    np.save(buf, sizes)
    if "://" not in path:
        with open(path, "wb") as fh:
            fh.write(buf.getvalue())
        return
    fs, stripped = _url_to_fs(path, storage_options)
    with fs.open(stripped, "wb") as fh:
        fh.write(buf.getvalue())


def from_files(
    urlpath: str | os.PathLike[str],
    *,
    cache: bool | str = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> NDArray[np.int64]:
    """Byte size of every file under a directory, prefix or glob, in sorted path order.

    Sizes come from directory listings (one per directory; on S3 one paginated listing per
    prefix), not from a request per object. :func:`list_files` gives the matching paths.

    Args:
        urlpath: local path or fsspec URL, e.g. ``"s3://bucket/prefix/**.tar"``.
        cache: ``True`` keeps the sizes in a ``.npy`` inside the listed directory
            (:func:`cache_path`) and reads them from there next time (delete it to refresh);
            a string names the cache file.
        storage_options: fsspec filesystem options (``{"endpoint_url": ...}`` and the like).
        progress: see :func:`list_files`.

    Returns:
        int64 byte sizes.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for name, n in [("a.bin", 3), ("b.bin", 10)]:
    ...     with open(os.path.join(d, name), "wb") as f:
    ...         _ = f.write(b"x" * n)
    >>> from_files(d).tolist()
    [3, 10]
    """
    where = cache_path(urlpath) if cache is True else (os.fspath(cache) if cache else None)
    if where is not None:
        cached = _load_cache(where, storage_options)
        if cached is not None:
            logger.info("sizes of %s read from the cache %s", os.fspath(urlpath), where)
            return cached.astype(np.int64, copy=False)
    _, sizes = list_files(urlpath, storage_options=storage_options, progress=progress)
    if where is not None:
        _save_cache(where, sizes, storage_options)
    return sizes


# ---------------------------------------------------------------------------- size files

FILE_FORMATS = (".npy", ".txt", ".csv", ".parquet")


def _is_listing(source: str) -> bool:
    """A directory, a glob or a URL without a size-file extension: byte sizes of the files there."""
    if _GLOB_CHARS.search(source):
        return True
    if "://" in source and not source.startswith("file://"):
        return not source.lower().endswith(FILE_FORMATS)
    path = source[7:] if source.startswith("file://") else source
    return os.path.isdir(path)


def _read_bytes(source: str, storage_options: dict[str, Any] | None) -> bytes:
    if "://" in source and not source.startswith("file://"):
        fs, stripped = _url_to_fs(source, storage_options)
        with fs.open(stripped, "rb") as fh:
            return bytes(fh.read())
    path = source[7:] if source.startswith("file://") else source
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file or directory: {source!r}")
    with open(path, "rb") as fh:
        return fh.read()


def _pick_column(names: Sequence[str], column: str | None, source: str) -> str:
    if column is None:
        if len(names) == 1:
            return names[0]
        raise ValueError(f"{source} has {len(names)} columns {list(names)}: choose one with column= (--column)")
    if column not in names:
        raise ValueError(f"{source} has no column {column!r}; columns: {list(names)}")
    return column


def _text_sizes(data: bytes, source: str) -> NDArray[Any]:
    """One number per line; blank lines and ``#`` comments are ignored."""
    if b"#" not in data:
        try:
            return _finish(np.array(data.split(), dtype=np.float64), source)
        except ValueError:
            pass  # find the line below
    lines = data.splitlines()
    keep = [i for i, raw in enumerate(lines) if raw.strip() and not raw.lstrip().startswith(b"#")]
    values = [lines[i].split(b"#", 1)[0].strip() for i in keep]
    try:
        numbers = to_numbers(values, source)
    except ValueError as exc:
        row = int(re.search(r" row (\d+):", str(exc)).group(1))  # type: ignore[union-attr]
        raise ValueError(f"{source} line {keep[row] + 1}: {lines[keep[row]].strip().decode(errors='replace')!r} is not a number") from None
    return _finish(numbers, source)


def _csv_sizes(data: bytes, column: str | None, source: str) -> NDArray[Any]:
    import csv

    reader = csv.reader(io.StringIO(data.decode("utf-8-sig")))
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{source} is empty (no header line)")
    name = _pick_column([h.strip() for h in header], column, source)
    col = [h.strip() for h in header].index(name)
    values: list[str] = []
    line_of: list[int] = []
    for row in reader:
        if not row:
            continue
        if len(row) <= col:
            raise ValueError(f"{source} line {reader.line_num}: no value for column {name!r}")
        values.append(row[col].strip())
        line_of.append(reader.line_num)
    try:
        numbers = to_numbers(values, f"column {name!r}")
    except ValueError as exc:
        row_no = int(re.search(r" row (\d+):", str(exc)).group(1))  # type: ignore[union-attr]
        shown = values[row_no]
        what = "missing value" if shown == "" else f"{shown!r} is not a number"
        raise ValueError(f"{source} line {line_of[row_no]} (column {name!r}, row {row_no}): {what}") from None
    return _finish(numbers, f"{source} column {name!r}")


def _parquet_sizes(source: str, column: str | None, storage_options: dict[str, Any] | None) -> NDArray[Any]:
    pq = _require("pyarrow.parquet", "parquet", "reading .parquet sizes")
    data = io.BytesIO(_read_bytes(source, storage_options))
    names = pq.ParquetFile(data).schema_arrow.names
    name = _pick_column(names, column, source)
    data.seek(0)
    values = pq.read_table(data, columns=[name]).column(name)
    try:
        return from_array(values, name=name)
    except ValueError as exc:
        raise ValueError(f"{source} {exc}") from None


def from_source(
    source: str | os.PathLike[str],
    *,
    column: str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> NDArray[Any]:
    """Sizes from a file of sizes, or byte sizes of the files under a directory, prefix or glob.

    Args:
        source: ``.npy`` (1-D array), ``.txt`` (one number per line, ``#`` comments),
            ``.csv`` / ``.parquet`` (one column; ``column`` picks it when there are several);
            any other directory, glob or fsspec URL gives the byte sizes of its files
            (:func:`from_files`).
        column: the column of a ``.csv`` or ``.parquet`` file.
        storage_options, progress: see :func:`list_files`.

    Returns:
        1-D int64 (or float64) sizes.

    Raises:
        FileNotFoundError: no such file, directory or prefix.
        ValueError: an unknown format, a wrong column, an empty input, or a bad value (the
            message names its line or row).
    """
    src = os.fspath(source)
    if _is_listing(src):
        if column is not None:
            raise ValueError(f"column= applies to .csv and .parquet files, not to a listing of {src!r}")
        sizes: NDArray[Any] = from_files(src, storage_options=storage_options, progress=progress)
        if sizes.size == 0:
            raise ValueError(f"no files under {src!r} (empty input)")
        return sizes
    ext = os.path.splitext(src.lower())[1]
    if ext not in FILE_FORMATS:
        if "://" not in src and not os.path.exists(src):
            raise FileNotFoundError(f"no such file or directory: {src!r}")
        raise ValueError(f"unknown sizes format {ext or src!r}; expected one of {FILE_FORMATS}, or a directory, glob or URL of files")
    if column is not None and ext in (".npy", ".txt"):
        raise ValueError(f"column= applies to .csv and .parquet files, not to {ext}")
    if ext == ".parquet":
        sizes = _parquet_sizes(src, column, storage_options)
    else:
        data = _read_bytes(src, storage_options)
        if ext == ".npy":
            try:
                arr = np.load(io.BytesIO(data), allow_pickle=False)
            except ValueError as exc:
                raise ValueError(f"{src} is not a numeric .npy array: {exc}") from None
            if arr.dtype.kind not in "iufb" and arr.ndim == 1:
                arr = to_numbers(arr.tolist(), src)
            sizes = _finish(arr, src)
        elif ext == ".txt":
            sizes = _text_sizes(data, src)
        else:
            sizes = _csv_sizes(data, column, src)
    if sizes.size == 0:
        raise ValueError(f"{src} holds no sizes (empty input)")
    return sizes
