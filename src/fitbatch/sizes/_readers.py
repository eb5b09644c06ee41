"""Sizes from a file of sizes (``.npy``, ``.txt``, ``.csv``, ``.parquet``), and the
:func:`from_source` dispatch between such a file and a listing of files.

``pyarrow`` (for ``.parquet``) and ``fsspec`` (for URLs) are imported on use, never at import time.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.sizes._coerce import MAX_EXACT
from fitbatch.sizes._columns import (
    _finish,
    _inexact_row,
    _require,
    _too_large,
    from_array,
    to_numbers,
)
from fitbatch.sizes._files import _GLOB_CHARS, _url_to_fs, from_files

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
    # the fast path splits at any whitespace: only where no line can hold two numbers
    if b"#" not in data and b" " not in data and b"\t" not in data:
        try:
            fast = np.array(data.split(), dtype=np.float64)
            if not (fast.size and fast.max() >= MAX_EXACT):  # else: look for rounded integers below
                return _finish(fast, source)
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
    big = _inexact_row(values, numbers)
    if big is not None:
        raise ValueError(f"{source} line {keep[big] + 1}: {_too_large(values[big])}")
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
    big = _inexact_row(values, numbers)
    if big is not None:
        raise ValueError(f"{source} line {line_of[big]} (column {name!r}, row {big}): {_too_large(values[big])}")
    return _finish(numbers, f"{source} column {name!r}")


def _parquet_sizes(source: str, column: str | None, storage_options: dict[str, Any] | None) -> NDArray[Any]:
    pq = _require("pyarrow.parquet", "parquet", "reading .parquet sizes")
    data = io.BytesIO(_read_bytes(source, storage_options))
    names = pq.ParquetFile(data).schema_arrow.names
    name = _pick_column(names, column, source)
    data.seek(0)
    # one thread: a size column is small, and pyarrow's pool threads could abort the process at exit
    values = pq.read_table(data, columns=[name], use_threads=False).column(name)
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
        storage_options: see :func:`list_files`.
        progress: see :func:`list_files`.

    Returns:
        1-D int64 (or float64) sizes.

    Raises:
        FileNotFoundError: no such file, directory or prefix.
        ValueError: an unknown format, a wrong column, an empty input, or a bad value (the
            message names its line or row).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open(os.path.join(d, "sizes.csv"), "w") as f:
    ...     for line in ["id,tokens", "0,12", "1,3", "2,7"]:
    ...         print(line, file=f)
    >>> from_source(os.path.join(d, "sizes.csv"), column="tokens")
    array([12,  3,  7])
    >>> from_source(d)                     # a directory: the byte size of each file in it
    array([23])
    >>> with open(os.path.join(d, "sizes.txt"), "w") as f:
    ...     for line in ["# tokens per sample", "12", "3.5", "seven"]:
    ...         print(line, file=f)
    >>> from_source(os.path.join(d, "sizes.txt"))
    Traceback (most recent call last):
    ...
    ValueError: ...sizes.txt line 4: 'seven' is not a number
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
            except (ValueError, EOFError) as exc:  # EOFError: an empty or cut-short file
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
