"""The on-disk layout of a size index: shard parts, the finalised column and its manifest.

A finished index is a directory::

    manifest.json   format, version, count, sum, min, max, dtype, integral, log2 histogram,
                    the source's description, and per shard: name, offset, count, sum, min,
                    max, histogram
    sizes.npy       one contiguous column (int32 when every size is a whole number below 2**31,
                    else int64, float64 when some size is fractional), memory-mapped on open

While it is built, each shard is written on its own to ``parts/part-NNNNNN.npy`` through a
temporary name and an atomic rename, so a crash never leaves half a shard that a re-run would
count; ``parts/build.json`` names the source and its shards, so a re-run resumes only the same
build. Finalising reads the parts in shard order, chooses the dtype, copies them at their
offsets into one pre-sized ``.npy`` (written under a temporary name too), writes the manifest
last and removes the parts. Every statistic is computed from the part files alone, so the same
sizes give the same bytes whichever engine (processes, Ray) computed them.

>>> import numpy as np
>>> log2_histogram(np.array([0, 1, 2, 3, 4, 1000])).tolist()
[1, 1, 2, 1, 0, 0, 0, 0, 0, 0, 1]
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger("fitbatch.index")

FORMAT = "fitbatch-size-index"
VERSION = 1
MANIFEST = "manifest.json"
COLUMN = "sizes.npy"
PARTS = "parts"
BUILD = "build.json"
#: histogram bins: 0 holds sizes below 1, bin k (1..63) holds [2**(k-1), 2**k), 64 the rest
N_BINS = 65
_CHUNK = 1 << 22  # elements per step of the chunked passes over a column


def log2_histogram(values: NDArray[Any]) -> NDArray[np.int64]:
    """Counts over fixed log2 bins, trailing empty bins trimmed; merge by adding (see :data:`N_BINS`).

    >>> log2_histogram(np.array([0.5, 7.9, 8])).tolist()
    [1, 0, 0, 1, 1]
    """
    arr = np.asarray(values)
    out = np.zeros(N_BINS, np.int64)
    for a in range(0, arr.shape[0], _CHUNK):
        chunk = arr[a : a + _CHUNK].astype(np.float64, copy=False)
        _, exp = np.frexp(
            chunk
        )  # chunk = m * 2**exp with m in [0.5, 1): 2**(exp-1) <= chunk < 2**exp
        bins = np.where(chunk < 1, 0, np.minimum(exp, N_BINS - 1))
        out += np.bincount(bins, minlength=N_BINS)
    return trim(out)


def trim(counts: NDArray[np.int64]) -> NDArray[np.int64]:
    nonzero = np.flatnonzero(counts)
    return counts[: nonzero[-1] + 1] if nonzero.size else counts[:0]


def merge_histograms(histograms: list[list[int]]) -> list[int]:
    """The histogram of the union of shards: their counts added bin by bin.

    >>> merge_histograms([[1, 2], [0, 0, 5], []])
    [1, 2, 5]
    """
    out = np.zeros(N_BINS, np.int64)
    for h in histograms:
        out[: len(h)] += np.asarray(h, dtype=np.int64)
    return trim(out).tolist()


def exact_sum(values: NDArray[Any]) -> int | float:
    """The sum of a shard: exact for integers (a Python int, never wrapping), float64 otherwise."""
    if values.dtype.kind == "f":
        return float(np.sum(values, dtype=np.float64))
    total = 0
    for a in range(0, values.shape[0], _CHUNK):
        chunk = values[a : a + _CHUNK].astype(np.int64, copy=False)
        # split at 2**32 so neither partial sum can overflow int64 (sizes are at most 2**53)
        high, low = chunk >> 32, chunk & 0xFFFFFFFF
        total += (int(high.sum()) << 32) + int(low.sum())
    return total


def _number(x: Any, integral: bool) -> int | float:
    return int(x) if integral else float(x)


def shard_stats(name: str, values: NDArray[Any]) -> dict[str, Any]:
    """Count, exact sum, min, max and histogram of one shard (validated sizes)."""
    integral = values.dtype.kind in "iu"
    empty = values.shape[0] == 0
    return {
        "name": name,
        "count": int(values.shape[0]),
        "sum": exact_sum(values),
        "min": None if empty else _number(values.min(), integral),
        "max": None if empty else _number(values.max(), integral),
        "histogram": log2_histogram(values).tolist(),
    }


def part_path(path: str, i: int) -> str:
    return os.path.join(path, PARTS, f"part-{i:06d}.npy")


def write_part(path: str, i: int, values: NDArray[Any]) -> None:
    """Write shard ``i`` atomically: a crash leaves a temporary file, never a counted part."""
    final = part_path(path, i)
    tmp = f"{final}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(values), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def done_parts(path: str, n_shards: int) -> list[int]:
    """The shards already written (complete parts), in order."""
    return [i for i in range(n_shards) if os.path.isfile(part_path(path, i))]


def start_build(path: str, source: str, shards: list[str], stamps: list[str] | None = None) -> None:
    """Create ``path/parts`` and record what is built, or check that a resumed build is the same one.

    ``stamps`` (one per shard, see :func:`fitbatch.index._sources.shard_stamps`): a part
    written while its shard had another stamp (the source file was rewritten since) is removed,
    so that the shard is sized again; a record without stamps (an older fitbatch) keeps none.

    Raises:
        ValueError: ``path`` holds parts of another source or another list of shards.
    """
    parts = os.path.join(path, PARTS)
    os.makedirs(parts, exist_ok=True)
    record = os.path.join(parts, BUILD)
    wanted: dict[str, Any] = {"source": source, "shards": shards}
    if stamps is not None:
        wanted["stamps"] = stamps
    if os.path.isfile(record):
        found = _read_json(record, f"{path} (an interrupted build)", "delete it to start again")
        if (found.get("source"), found.get("shards")) != (source, shards):
            raise ValueError(
                f"{path} holds a partial build of another source ({found.get('source')!r}, "
                f"{len(found.get('shards', []))} shards) than {source!r} ({len(shards)} shards): "
                "choose another path, or delete it to start again"
            )
        before = found.get("stamps")
        if stamps is None or before == stamps:
            return
        changed = [
            i for i in range(len(shards)) if before is None or i >= len(before) or before[i] != stamps[i]
        ]
        stale = [i for i in changed if os.path.isfile(part_path(path, i))]
        for i in stale:
            os.remove(part_path(path, i))
        if stale:
            logger.warning(
                "%s: %d shard(s) changed since their part was written (size or modification time), "
                "sized again: %s", path, len(stale), ", ".join(shards[i] for i in stale[:3])
            )
        _write_json(record, wanted)
        return
    for stale_file in os.listdir(parts):  # temporaries of an interrupted create()
        os.remove(os.path.join(parts, stale_file))
    _write_json(record, wanted)


def _read_json(target: str, what: str, way_out: str) -> dict[str, Any]:
    """A JSON object from ``target``, or a ``ValueError`` naming it, ``what`` it belongs to and the way out."""
    try:
        with open(target, encoding="utf-8") as fh:
            found = json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{target} is not valid JSON ({exc}): {what} is damaged; {way_out}") from None
    if not isinstance(found, dict):
        raise ValueError(f"{target} holds a {type(found).__name__}, not an object: {what} is damaged; {way_out}")
    return found


def _write_json(target: str, obj: Any) -> None:
    tmp = f"{target}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, target)


def _loaded_parts(path: str, n_shards: int) -> Iterator[NDArray[Any]]:
    for i in range(n_shards):
        yield np.load(part_path(path, i), mmap_mode="r", allow_pickle=False)


def column_dtype(integral: bool, maximum: float | int) -> np.dtype[Any]:
    """int32 when every size is whole and fits, int64 for larger whole sizes, else float64.

    >>> column_dtype(True, 2**31 - 1), column_dtype(True, 2**31), column_dtype(False, 1.5)
    (dtype('int32'), dtype('int64'), dtype('float64'))
    """
    if not integral:
        return np.dtype(np.float64)
    return np.dtype(np.int32) if maximum <= np.iinfo(np.int32).max else np.dtype(np.int64)


def finish_build(
    path: str, source: str, names: list[str], stamps: list[str] | None = None
) -> dict[str, Any]:
    """Turn complete parts into ``sizes.npy`` and ``manifest.json``; returns the manifest.

    ``stamps``: each shard's stamp, kept in the manifest so that a rewritten source is not
    taken for the one indexed.

    Raises:
        ValueError: no sizes at all (an empty source); the parts are removed, so the path is
            free for the next build.
    """
    shards: list[dict[str, Any]] = []
    offset = 0
    integral = True
    for k, (name, values) in enumerate(zip(names, _loaded_parts(path, len(names)))):
        stats = shard_stats(name, values)
        if stamps is not None:
            stats["stamp"] = stamps[k]
        stats["offset"] = offset
        offset += stats["count"]
        integral &= values.dtype.kind in "iu" or values.size == 0  # an empty shard has no type
        shards.append(stats)
    if offset == 0:
        shutil.rmtree(os.path.join(path, PARTS), ignore_errors=True)  # nothing to resume: free the path
        raise ValueError(
            f"{source}: no sizes (every shard is empty); an index needs at least one sample"
        )
    maximum = max(s["max"] for s in shards if s["count"])
    minimum = min(s["min"] for s in shards if s["count"])
    dtype = column_dtype(integral, maximum)
    if not integral:  # integral shards of a float index: their stats in float, like the column
        for s in shards:
            s.update({k: None if s[k] is None else float(s[k]) for k in ("sum", "min", "max")})
    tmp = os.path.join(path, f"{COLUMN}.tmp")
    column = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(offset,))
    digest = column_hasher(dtype, offset)  # hashed as copied: one pass over the sizes
    for s, values in zip(shards, _loaded_parts(path, len(names))):
        for a in range(0, s["count"], _CHUNK):
            chunk = np.ascontiguousarray(values[a : a + _CHUNK], dtype=dtype)
            column[s["offset"] + a : s["offset"] + a + chunk.shape[0]] = chunk
            digest.update(chunk.tobytes())
    column.flush()
    del column
    os.replace(tmp, os.path.join(path, COLUMN))
    total: int | float = (
        sum(s["sum"] for s in shards) if integral else math.fsum(s["sum"] for s in shards)
    )
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "file": COLUMN,
        "dtype": dtype.name,
        "integral": integral,
        "count": offset,
        "sum": total,
        "min": minimum,
        "max": maximum,
        "histogram": {"bins": "log2", "counts": merge_histograms([s["histogram"] for s in shards])},
        "digest": digest.hexdigest(),
        "source": source,
        "shards": shards,
    }
    _write_json(os.path.join(path, MANIFEST), manifest)
    shutil.rmtree(os.path.join(path, PARTS))
    logger.info("size index %s: %d sizes in %d shards, %s", path, offset, len(shards), dtype.name)
    return manifest


def column_hasher(dtype: np.dtype[Any], count: int) -> Any:
    """A blake2b (128 bits) keyed by the column's dtype and length; feed it the column's bytes in order.

    The manifest's ``digest``: a fingerprint of the sizes that a sampler's state carries, read
    from the manifest instead of hashing gigabytes on every resume.

    >>> h = column_hasher(np.dtype("int32"), 2)
    >>> h.update(np.array([3, 4], np.int32).tobytes())
    >>> len(h.hexdigest())
    32
    """
    return hashlib.blake2b(f"{dtype.name}:{count}".encode(), digest_size=16)


def column_digest(column: NDArray[Any]) -> str:
    """The manifest ``digest`` of a column (an index written before digests: hashed in chunks)."""
    h = column_hasher(column.dtype, column.shape[0])
    for a in range(0, column.shape[0], _CHUNK):
        h.update(np.ascontiguousarray(column[a : a + _CHUNK]).tobytes())
    return str(h.hexdigest())


#: what a manifest must hold, and what each shard entry must hold
MANIFEST_KEYS = ("format", "version", "file", "dtype", "integral", "count", "sum", "min", "max", "source", "shards")
SHARD_KEYS = ("name", "offset", "count")


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of a finished index, checked for its format, version and keys.

    Raises:
        FileNotFoundError: no finished index at ``path``.
        ValueError: not a fitbatch size index, a version this fitbatch cannot read, or a
            damaged manifest (not JSON, a key missing): the message names the index and says
            "rebuild it".
    """
    target = os.path.join(path, MANIFEST)
    if not os.path.isfile(target):
        hint = (
            " (a build was interrupted: run build_size_index again to finish it)"
            if os.path.isdir(os.path.join(path, PARTS))
            else ""
        )
        raise FileNotFoundError(f"no size index at {path!r}: {MANIFEST} is missing{hint}")
    manifest = _read_json(target, f"the size index {path}", "rebuild it")
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{target} is not a fitbatch size index (format {manifest.get('format')!r}, expected {FORMAT!r})"
        )
    if manifest.get("version") != VERSION:
        raise ValueError(
            f"{target} has version {manifest.get('version')!r}; this fitbatch reads version {VERSION}: rebuild it"
        )
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    shards = manifest.get("shards")
    if not missing and not (
        isinstance(shards, list)
        and all(isinstance(s, dict) and all(k in s for k in SHARD_KEYS) for s in shards)
    ):
        missing = [f"shards[].{k}" for k in SHARD_KEYS]
    if missing:
        raise ValueError(
            f"{target} lacks {', '.join(repr(k) for k in missing)}: the size index {path} is damaged, rebuild it"
        )
    return manifest


def is_index(path: str) -> bool:
    """Whether ``path`` is a directory holding a finished size index."""
    return os.path.isfile(os.path.join(path, MANIFEST))


def is_partial(path: str) -> bool:
    """Whether ``path`` holds an interrupted build (its record of what is built)."""
    return os.path.isfile(os.path.join(path, PARTS, BUILD))


def is_index_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a size index directory, finished or interrupted: the one test of
    "this is an index" (the CLI opens such a path with :meth:`SizeIndex.open`, which names an
    interrupted build, never reads it as a directory of files).

    >>> import tempfile
    >>> is_index_dir(tempfile.mkdtemp())
    False
    """
    where = os.fspath(path)
    return is_index(where) or is_partial(where)
