"""Sharded size sources for :func:`fitbatch.build_size_index`: what a shard is, and how to size it.

:func:`plan_shards` turns a source into a description and a list of :class:`Shard` (small,
picklable: paths and row ranges, sent to worker processes or Ray tasks); :func:`read_shard`
sizes one shard in a worker. The size taken per format:

* **parquet** (one shard per file): a list column -> its lengths, a string column -> characters
  (UTF-8 code points), a binary column -> bytes, a numeric column as is; ``sizeof`` instead maps
  the column's values (a list) to sizes;
* **dataset** (a Hugging Face ``datasets.Dataset``, shards of ``rows_per_shard`` rows): as parquet;
* **megatron** (``.idx`` of a Megatron-LM / Megatron-Core indexed dataset, shards of rows): the
  ``sequence_lengths`` array, tokens per sequence, read from the ``MMIDIDX`` header layout;
* **mds** (MosaicML Streaming ``index.json``, one shard per MDS shard): the bytes of each encoded
  sample from the shard's offset table (with ``column``: that column's bytes); a shard whose raw
  ``.mds`` file is absent (compressed only) is refused;
* **webdataset** (``.tar`` shards): the bytes of each sample's members (members grouped by key:
  the path up to the first dot of the file name), in order of first appearance; with ``column``
  an extension (``"txt"``), only that member's bytes;
* **files** (any other directory, glob or fsspec URL): each file's byte size from the listing
  (:func:`fitbatch.sizes.list_files`), in sorted path order, shards of ``rows_per_shard`` files.

>>> import numpy as np
>>> read_shard(Shard("array", "demo", (np.array([3, 1]),)), None, None)
array([3, 1])
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.sizes._columns import _require, from_array
from fitbatch.sizes._files import _GLOB_CHARS, _url_to_fs, list_files
from fitbatch.sizes._readers import _pick_column

logger = logging.getLogger("fitbatch.index")

FORMATS = ("parquet", "dataset", "megatron", "mds", "webdataset", "files")
_EXTENSIONS = {".parquet": "parquet", ".idx": "megatron", ".tar": "webdataset"}
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
_MEGATRON_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents


@dataclasses.dataclass(frozen=True)
class Shard:
    """One unit of work: ``kind`` (a reader), ``name`` (what resume and errors call it), ``args``."""

    kind: str
    name: str
    args: tuple[Any, ...]


# ---------------------------------------------------------------------------- readers (workers)


def _open(path: str) -> Any:
    if "://" in path and not path.startswith("file://"):
        fs, stripped = _url_to_fs(path, None)
        return fs.open(stripped, "rb")
    return open(path[7:] if path.startswith("file://") else path, "rb")


def _arrow_sizes(column: Any, name: str, sizeof: Callable[[list[Any]], Any] | None) -> NDArray[Any]:
    """Sizes of a pyarrow column: lengths of lists, strings, binaries; numbers as they are."""
    pa = _require("pyarrow", "parquet", "sizes of arrow columns")
    pc = _require("pyarrow.compute", "parquet", "sizes of arrow columns")
    if sizeof is not None:
        return from_array(np.asarray(sizeof(column.to_pylist())), name=name)
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        column = pc.list_value_length(column)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = pc.utf8_length(column)
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        column = pc.binary_length(column)
    return from_array(column, name=name)


def _parquet_columns(path: str) -> list[str]:
    pq = _require("pyarrow.parquet", "parquet", "sizes from parquet files")
    with _open(path) as fh:
        return list(pq.ParquetFile(fh).schema_arrow.names)


def _parquet(path: str, column: str | None, sizeof: Any, first: str | None = None) -> NDArray[Any]:
    """One parquet file's sizes; ``first``: the file whose only column ``column`` is (no
    ``column=`` given), so that a file with another column is refused, not sized."""
    pq = _require("pyarrow.parquet", "parquet", "sizes from parquet files")
    with _open(path) as fh:
        names = pq.ParquetFile(fh).schema_arrow.names
        if first is not None and column not in names:
            raise ValueError(
                f"{path} has no column {column!r}, the only column of {first}, and no column= was "
                f"given (columns here: {list(names)}): pass column= to size the same column in every shard"
            )
        name = _pick_column(names, column, path)
        fh.seek(0)
        table = pq.read_table(fh, columns=[name], use_threads=False)
    return rows_checked(_arrow_sizes(table.column(name), name, sizeof), table.num_rows, path, sizeof)


def _dataset(dataset: Any, start: int, stop: int, sizeof: Any) -> NDArray[Any]:
    name = dataset.column_names[0]  # the driver kept only the sized column
    table = dataset.with_format("arrow")[start:stop]
    return rows_checked(_arrow_sizes(table.column(name), name, sizeof), stop - start, f"rows[{start}:{stop}]", sizeof)


def megatron_header(data: bytes, path: str) -> tuple[int, int]:
    """(sequence count, document count) of a Megatron ``.idx`` header, or ``ValueError``."""
    if len(data) < _MEGATRON_HEADER.size:
        raise ValueError(f"{path} is too short for a Megatron .idx header ({len(data)} bytes)")
    magic, version, _code, n_seq, n_doc = _MEGATRON_HEADER.unpack_from(data)
    if magic != MEGATRON_MAGIC:
        raise ValueError(
            f"{path} is not a Megatron .idx file: magic {magic!r}, expected {MEGATRON_MAGIC!r}"
        )
    if version != 1:
        raise ValueError(f"{path}: Megatron .idx version {version}; only version 1 is known")
    return int(n_seq), int(n_doc)


def _megatron(path: str, start: int, stop: int) -> NDArray[Any]:
    with _open(path) as fh:
        fh.seek(
            _MEGATRON_HEADER.size + 4 * start
        )  # sequence_lengths: int32, right after the header
        data = fh.read(4 * (stop - start))
    if len(data) != 4 * (stop - start):
        raise ValueError(f"{path} is truncated: sequence_lengths[{start}:{stop}] is incomplete")
    return from_array(np.frombuffer(data, dtype="<i4"), name=f"{path} sequence_lengths")


def _mds(path: str, samples: int, variable: int | None, fixed: int | None) -> NDArray[Any]:
    if fixed is not None:
        return np.full(samples, fixed, dtype=np.int64)
    head = 4 * (samples + 2)  # uint32 count, then samples + 1 uint32 offsets
    with _open(path) as fh:
        data = fh.read(head) if variable is None else fh.read()  # the offset table, or all
    count = int(np.frombuffer(data, dtype="<u4", count=1)[0]) if len(data) >= 4 else -1
    if count != samples or len(data) < head:
        raise ValueError(f"{path}: the shard holds {count} samples but index.json says {samples}")
    offsets = np.frombuffer(data, dtype="<u4", count=samples + 1, offset=4).astype(np.int64)
    if variable is None:
        return np.diff(offsets)
    buf = np.frombuffer(data, dtype=np.uint8)
    at = offsets[:-1] + 4 * variable  # the per-sample head: a uint32 size per variable-size column
    if at.size and at.max() + 4 > buf.size:
        raise ValueError(
            f"{path} is truncated: {buf.size} bytes, sample heads reach {int(at.max()) + 4}"
        )
    word = buf[at] | (buf[at + 1].astype(np.int64) << 8) | (buf[at + 2].astype(np.int64) << 16)
    return (word | (buf[at + 3].astype(np.int64) << 24)).astype(np.int64)


def _webdataset(path: str, extension: str | None) -> NDArray[Any]:
    import tarfile

    keys: list[str] = []
    sizes: list[int] = []
    try:
        with _open(path) as fh, tarfile.open(fileobj=fh, mode="r:*" if fh.seekable() else "r|*") as tar:
            for member in tar:
                match = (
                    re.match(r"^((?:.*/|)[^./]+)\.([^/]*)$", member.name) if member.isfile() else None
                )
                if match is None:  # webdataset skips members without an extension
                    continue
                if extension is None or match.group(2) == extension:
                    keys.append(match.group(1))
                    sizes.append(member.size)
    except tarfile.TarError as exc:  # not a tar, or one cut short
        reason = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
        raise ValueError(f"{path} is not a readable tar file ({reason}): a WebDataset shard is a .tar") from None
    if not keys:
        what = f"members with extension {extension!r}" if extension else "samples"
        raise ValueError(f"{path} holds no {what}")
    uniq, first, inverse = np.unique(np.asarray(keys), return_index=True, return_inverse=True)
    per_key = np.bincount(inverse, weights=np.asarray(sizes, dtype=np.float64), minlength=uniq.size)
    return per_key[np.argsort(first)].astype(np.int64)


def rows_checked(values: NDArray[Any], rows: int, where: str, sizeof: Any) -> NDArray[Any]:
    """``values`` when they are one size per row of the shard, else a ``ValueError``.

    Every reader's sizes pass here: a ``sizeof`` that returns fewer or more sizes than it was
    given rows would shift every later size onto another sample.

    >>> rows_checked(np.array([1, 2]), 3, "part-0.parquet", len)
    Traceback (most recent call last):
    ...
    ValueError: part-0.parquet: sizeof builtins.len returned 2 sizes for 3 rows; a sizeof must return one size per row (a list or 1-D array as long as its argument)
    """
    if values.ndim == 1 and values.shape[0] == rows:
        return values
    what = f"sizeof {_function_name(sizeof)} returned" if sizeof is not None else "the reader gave"
    raise ValueError(
        f"{where}: {what} {values.shape[0] if values.ndim == 1 else values.shape} sizes for {rows} rows; "
        "a sizeof must return one size per row (a list or 1-D array as long as its argument)"
    )


def read_shard(
    shard: Shard, column: str | None, sizeof: Callable[[list[Any]], Any] | None
) -> NDArray[Any]:
    """The validated 1-D sizes of one shard (int64, or float64 when some size is fractional)."""
    kind, args = shard.kind, shard.args
    if kind == "array":
        return from_array(args[0], name=shard.name)
    if kind == "parquet":  # args: path, and the column found in the first file (no column= given)
        inferred = args[1] if len(args) > 1 and column is None else None
        return _parquet(args[0], inferred or column, sizeof, args[2] if inferred else None)
    if kind == "dataset":
        return _dataset(args[0], args[1], args[2], sizeof)
    if kind == "megatron":
        return _megatron(*args)
    if kind == "mds":
        return _mds(*args)
    if kind == "webdataset":
        return _webdataset(args[0], column)
    raise ValueError(f"unknown shard kind {kind!r}")  # pragma: no cover - plan_shards makes them


# ---------------------------------------------------------------------------- planning (driver)


def _ranges(n: int, rows: int) -> list[tuple[int, int]]:
    return [(a, min(a + rows, n)) for a in range(0, n, rows)] or [(0, 0)]


def _is_file(path: str, local: str) -> bool:
    if "://" in path and not path.startswith("file://"):
        fs, stripped = _url_to_fs(path, None)
        return not path.endswith("/") and bool(fs.isfile(stripped))
    return os.path.isfile(local)


def _expand(source: Any) -> tuple[list[str], list[int | None]]:
    """Paths of a path, glob, directory or URL, or of a list of them (listings in sorted order),
    with the byte size of each listed file (``None`` for a file named directly)."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    paths: list[str] = []
    sizes: list[int | None] = []
    for item in items:
        path = os.fspath(item)
        local = path[7:] if path.startswith("file://") else path
        if not _GLOB_CHARS.search(path) and _is_file(path, local):
            paths.append(path)
            sizes.append(None)
        elif not _GLOB_CHARS.search(path) and os.path.isfile(os.path.join(local, "index.json")):
            paths.append(os.path.join(local, "index.json"))
            sizes.append(None)
        else:
            listed, found = list_files(path, progress=False)
            paths += listed
            sizes += found.tolist()
    return paths, sizes


def _kind_of(path: str) -> str:
    if posixpath.basename(path) == "index.json":
        return "mds"
    return _EXTENSIONS.get(os.path.splitext(path)[1].lower(), "files")


def _infer(paths: list[str], listed: list[int | None]) -> tuple[str, list[str], list[int | None]]:
    """The format of the paths, and the paths of that format: one known format among other
    files (a Spark ``_SUCCESS``, a ``dataset_info.json``) is that format, the others left out
    and logged; no known format: byte sizes of every file."""
    kinds = [_kind_of(p) for p in paths]
    known = sorted(set(kinds) - {"files"})
    if len(known) > 1:
        raise ValueError(
            f"the source mixes formats {known}: pass one kind of shard, or format= one of {FORMATS}"
        )
    if not known:
        return "files", paths, listed
    keep = [i for i, k in enumerate(kinds) if k == known[0]]
    if len(keep) < len(paths):
        other = [paths[i] for i, k in enumerate(kinds) if k != known[0]]
        logger.warning(
            "%s source: %d other files left out (%s)", known[0], len(other), ", ".join(other[:3])
        )
    return known[0], [paths[i] for i in keep], [listed[i] for i in keep]


def _mds_shards(path: str, column: str | None) -> list[Shard]:
    with _open(path) as fh:
        index = json.load(io.TextIOWrapper(fh, encoding="utf-8"))
    root = path.rsplit("/", 1)[0] if "/" in path else "."
    shards = []
    for k, info in enumerate(index.get("shards", [])):
        if info.get("format") != "mds":
            raise ValueError(
                f"{path} shard {k}: format {info.get('format')!r}; only 'mds' shards are sized"
            )
        variable: int | None = None
        fixed: int | None = None
        if column is not None:
            names, widths = info["column_names"], info["column_sizes"]
            if column not in names:
                raise ValueError(f"{path} has no column {column!r}; columns: {names}")
            j = names.index(column)
            fixed = widths[j]
            variable = None if fixed is not None else sum(w is None for w in widths[:j])
        raw = f"{root}/{info['raw_data']['basename']}"
        if "://" not in raw and not os.path.isfile(raw):
            raise ValueError(
                f"{raw} is absent (compressed shards are not sized): decompress the MDS shards first"
            )
        shards.append(Shard("mds", raw, (raw, int(info["samples"]), variable, fixed)))
    return shards


def plan_shards(
    source: Any, *, column: str | None, sizeof: Any, format: str | None, rows_per_shard: int
) -> tuple[str, str, list[Shard]]:
    """(format, description, shards) of a source; checks the options that fit the format.

    >>> plan_shards([1, 2], column=None, sizeof=None, format=None, rows_per_shard=10)
    Traceback (most recent call last):
    ...
    TypeError: source must be a path, glob or URL, a list of them, or a datasets.Dataset; got a list of int
    """
    if hasattr(source, "with_format") and hasattr(source, "num_rows"):
        kind = "dataset"
        desc = f"datasets.Dataset({source.num_rows} rows, columns {list(source.column_names)}, fingerprint {getattr(source, '_fingerprint', None)})"
        # only the sized column travels to the workers (a memory-mapped dataset pickles by path)
        only = source.select_columns(
            [_pick_column(list(source.column_names), column, "the dataset")]
        )
        shards = [
            Shard("dataset", f"rows[{a}:{b}]", (only, a, b))
            for a, b in _ranges(source.num_rows, rows_per_shard)
        ]
    else:
        items = [source] if isinstance(source, (str, os.PathLike)) else source
        if not isinstance(items, (list, tuple)) or not all(
            isinstance(p, (str, os.PathLike)) for p in items
        ):
            what = (
                f"a list of {type(items[0]).__name__}"
                if isinstance(items, (list, tuple)) and items
                else f"a {type(source).__name__}"
            )
            raise TypeError(
                f"source must be a path, glob or URL, a list of them, or a datasets.Dataset; got {what}"
            )
        paths, listed = _expand(items)
        if not paths:
            raise ValueError(f"no files at {source!r}")
        if format is None:
            kind, paths, listed = _infer(paths, listed)
        else:
            kind = format
        desc = f"{kind}: " + ", ".join(os.fspath(p) for p in items)
        shards = _path_shards(kind, paths, listed, column, rows_per_shard)
        if kind == "parquet" and column is None and shards:  # one column for every shard
            first = shards[0].name
            only = _pick_column(_parquet_columns(first), None, first)
            shards = [Shard("parquet", s.name, (s.args[0], only, first)) for s in shards]
    if column is not None:  # part of what is built: a resumed or finished build must match it
        desc += f"; column {column!r}"
    if sizeof is not None:
        desc += f"; sizeof {_function_name(sizeof)}"
    if format not in (None, kind):
        raise ValueError(f"format={format!r} does not apply to a datasets.Dataset")
    if sizeof is not None and kind not in ("parquet", "dataset"):
        raise ValueError(f"sizeof= applies to parquet and datasets sources, not to {kind}")
    if column is not None and kind in ("megatron", "files"):
        raise ValueError(f"column= does not apply to {kind} sources")
    return kind, desc, shards


def _function_name(fn: Any) -> str:
    """``module.qualname`` of ``fn``, and a digest of its code where it has Python code: two
    lambdas (one name) that count differently are two sources.

    >>> _function_name(len)
    'builtins.len'
    >>> _function_name(lambda row: 1) != _function_name(lambda row: 2)
    True
    """
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    code = getattr(fn, "__code__", None)
    if code is None:
        return name
    return f"{name} (code {hashlib.sha256(_code_bytes(code)).hexdigest()[:12]})"


def _code_bytes(code: Any) -> bytes:
    """What a code object computes, the same in every process (no addresses, no set order)."""
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        if hasattr(const, "co_code"):  # a nested function's code
            parts.append(_code_bytes(const))
        elif isinstance(const, frozenset):
            parts.append(repr(sorted(map(repr, const))).encode())
        else:
            parts.append(repr(const).encode())
    return b"\0".join(parts)


def _path_shards(
    kind: str, paths: list[str], listed: list[int | None], column: str | None, rows: int
) -> list[Shard]:
    if kind == "parquet":
        return [Shard("parquet", p, (p,)) for p in paths]
    if kind == "webdataset":
        return [Shard("webdataset", p, (p,)) for p in paths]
    if kind == "mds":
        return [s for p in paths for s in _mds_shards(p, column)]
    if kind == "megatron":
        shards = []
        for p in paths:
            with _open(p) as fh:
                n_seq, _ = megatron_header(fh.read(_MEGATRON_HEADER.size), p)
            shards += [
                Shard("megatron", f"{p}[{a}:{b}]", (p, a, b)) for a, b in _ranges(n_seq, rows)
            ]
        return shards
    if kind != "files":
        raise ValueError(f"unknown format {kind!r}; expected one of {FORMATS}")
    known = [list_files(p, progress=False)[1][0] if n is None else n for p, n in zip(paths, listed)]
    column_ = np.asarray(known, dtype=np.int64)  # a listing already holds every byte size
    return [
        Shard("array", f"{paths[a]}..{paths[b - 1]}", (column_[a:b],))
        for a, b in _ranges(len(paths), rows)
        if b > a
    ]


# ---------------------------------------------------------------------------- change detection

_REMOTE_STAMP_KEYS = ("mtime", "LastModified", "last_modified", "updated", "ETag", "etag", "md5Hash")


def _file_stamp(path: str) -> str:
    """``size:mtime`` of a file from its listing (remote: the size and what the store dates it by)."""
    if "://" in path and not path.startswith("file://"):
        fs, stripped = _url_to_fs(path, None)
        info = fs.info(stripped)
        dated = next((str(info[k]) for k in _REMOTE_STAMP_KEYS if info.get(k) is not None), "")
        return f"{info.get('size')}:{dated}"
    st = os.stat(path[7:] if path.startswith("file://") else path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def shard_stamps(shards: list[Shard]) -> list[str]:
    """What each shard's sizes depend on, beyond its name: its file's size and modification
    time (a listing's shard: a digest of the byte sizes it holds; a dataset's rows: nothing,
    its fingerprint is in the source's description). A shard whose stamp changed since its part
    was written is sized again; a finished index whose stamps changed is not reused.

    >>> shard_stamps([Shard("array", "a..b", (np.array([3, 4]),)), Shard("dataset", "rows[0:2]", ())])
    ['sizes:0aa375eeda9b0b37ecd97fc104c41612', '']
    """
    seen: dict[str, str] = {}
    out = []
    for shard in shards:
        if shard.kind == "array":
            data = np.ascontiguousarray(shard.args[0], dtype=np.int64).tobytes()
            out.append("sizes:" + hashlib.blake2b(data, digest_size=16).hexdigest())
        elif shard.kind in ("parquet", "webdataset", "megatron", "mds"):
            path = shard.args[0]
            if path not in seen:
                seen[path] = _file_stamp(path)
            out.append(seen[path])
        else:
            out.append("")
    return out
