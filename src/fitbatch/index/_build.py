"""``build_size_index``: size every shard of a source in parallel (processes or Ray), resumably.

The driver plans the shards (:func:`~fitbatch.index._sources.plan_shards`), skips those already
written by an earlier run, and hands the rest to an engine: ``"local"`` (worker processes, loky
when installed, else :mod:`concurrent.futures`) or ``"ray"`` (one Ray task per shard, on the
cluster ``ray.init()`` connects to). Workers only compute sizes; the driver writes each shard's
part as its result arrives (atomically) and finalises the index in source order, so both engines
write the same bytes. At most ``2 * workers`` shards are in flight, which bounds the driver's
memory.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import choice, positive_int
from fitbatch.index import _format
from fitbatch.index._index import SizeIndex
from fitbatch.index._sources import FORMATS, Shard, plan_shards, read_shard, shard_stamps
from fitbatch.sizes._columns import _require

logger = logging.getLogger("fitbatch.index")

ENGINES = ("local", "ray")


def _sized(shard: Shard, column: str | None, sizeof: Any) -> NDArray[Any]:
    """A worker's job: the shard's sizes, or its error with the shard named (same type)."""
    try:
        values = read_shard(shard, column, sizeof)
    except Exception as exc:
        if str(shard.name) in str(exc):
            raise
        try:
            wrapped = type(exc)(f"shard {shard.name}: {exc}")
        except Exception:  # an exception type that takes other arguments
            raise exc from None
        raise wrapped from exc
    if values.dtype == np.int64 and values.size and values.max() <= np.iinfo(np.int32).max:
        return values.astype(np.int32)  # half the bytes back to the driver (and in the part file)
    return values


def _local(
    todo: list[tuple[int, Shard]], column: Any, sizeof: Any, workers: int
) -> Iterator[tuple[int, NDArray[Any]]]:
    if workers == 1 or len(todo) == 1:
        for i, shard in todo:
            yield i, _sized(shard, column, sizeof)
        return
    try:  # loky pickles lambdas (a sizeof=) and never forks a threaded parent
        from loky import ProcessPoolExecutor as Pool
    except ImportError:  # pragma: no cover - loky is in the test extra
        from concurrent.futures import ProcessPoolExecutor as Pool
    from concurrent.futures import FIRST_COMPLETED, wait

    with Pool(max_workers=workers) as pool:
        queue = iter(todo)
        pending: dict[Any, int] = {}
        for i, shard in queue:
            pending[pool.submit(_sized, shard, column, sizeof)] = i
            if len(pending) >= 2 * workers:
                break
        while pending:
            done, _ = wait(list(pending), timeout=None, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()
                nxt = next(queue, None)
                if nxt is not None:
                    pending[pool.submit(_sized, nxt[1], column, sizeof)] = nxt[0]


def _ray(
    todo: list[tuple[int, Shard]], column: Any, sizeof: Any, workers: int | None
) -> Iterator[tuple[int, NDArray[Any]]]:
    ray = _require("ray", "ray", "engine='ray'")
    started = not ray.is_initialized()
    queue = iter(todo)
    pending: dict[Any, int] = {}
    if started:  # a cluster named by RAY_ADDRESS, or a local one
        ray.init(include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(_sized)
        width = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        for i, shard in queue:
            pending[task.remote(shard, column, sizeof)] = i
            if len(pending) >= 2 * width:
                break
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    values = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the task's own exception, its message alone
                    raise _task_error(exc) from None
                yield i, values
                nxt = next(queue, None)
                if nxt is not None:
                    pending[task.remote(nxt[1], column, sizeof)] = nxt[0]
    finally:
        for ref in pending:  # after an error: stop the rest, and collect them so Ray logs nothing
            ray.cancel(ref)
        for ref in pending:
            try:
                ray.get(ref, timeout=60)
            except Exception:  # noqa: S110 - cancelled or failed: the first error is already raised
                pass
        if started:
            ray.shutdown()


def _task_error(exc: Any) -> BaseException:
    """The exception a Ray task raised, with its own message (Ray's wrapper carries the
    worker's whole traceback, colour codes included, in its text)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not type(cause).__module__.startswith("ray"):
        return cause.with_traceback(None)
    first = next((line for line in reversed(str(exc).splitlines()) if line.strip()), type(exc).__name__)
    return RuntimeError(f"a Ray task failed: {first}")


def _bar(enabled: bool | None, total: int, done: int) -> Any:
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return None
    try:
        import tqdm
    except ImportError:
        if enabled:
            _require("tqdm", "progress", "a progress bar")
        return None
    return tqdm.tqdm(total=total, initial=done, desc="sizing shards", unit=" shards", leave=False)


def _check_unchanged(where: str, shards: list[dict[str, Any]], stamps: list[str]) -> None:
    """Refuse a finished index whose source changed since (a shard's size or modification time);
    an index written before stamps has none to compare."""
    changed = [s["name"] for s, now in zip(shards, stamps) if "stamp" in s and s["stamp"] != now]
    if changed:
        raise ValueError(
            f"{where} was built from {len(changed)} shard(s) that changed since (size or modification "
            f"time): {', '.join(changed[:3])}: its sizes are stale; rebuild it (delete {where}, or "
            "choose another path)"
        )


def build_size_index(
    source: Any,
    path: str | os.PathLike[str],
    *,
    column: str | None = None,
    sizeof: Callable[[list[Any]], Any] | None = None,
    format: str | None = None,
    engine: str = "local",
    workers: int | None = None,
    rows_per_shard: int = 1_000_000,
    progress: bool | None = None,
) -> SizeIndex:
    """Size a sharded source in parallel into a :class:`SizeIndex` at ``path``, resumably.

    Shards are sized in parallel but stored in source order. A re-run after a crash or an
    interrupt sizes only the shards not yet written (a shard is written whole or not at all);
    a finished index of the same, unchanged source is opened as it is. A shard is known by its
    name and its file's size and modification time: a part of a shard rewritten since it was
    written is sized again, and a finished index of a rewritten source is refused.

    Args:
        source: parquet files, ``.tar`` (WebDataset) shards, Megatron ``.idx`` files, an MDS
            ``index.json`` (or its directory): a path, glob, directory or fsspec URL, or a list
            of them; any other files give their byte sizes; or a ``datasets.Dataset``. What
            size each takes: ``docs/scale.md``.
        path: the index directory.
        column: the parquet/dataset column (needed when there are several), the MDS column,
            or the WebDataset member extension (``"txt"``) to size.
        sizeof: parquet and datasets only: maps one shard's column values (a list) to sizes,
            e.g. a tokenizer's lengths.
        format: force one of ``"parquet"``, ``"dataset"``, ``"megatron"``, ``"mds"``,
            ``"webdataset"``, ``"files"`` (``None``: from the file extensions).
        engine: ``"local"`` (processes on this machine) or ``"ray"`` (Ray tasks; connects
            with ``ray.init()`` unless Ray is initialised already). Same index, byte for byte.
        workers: parallel shards (``None``: every CPU, or the Ray cluster's CPUs; 1: in this
            process).
        rows_per_shard: rows per shard of a dataset, a Megatron ``.idx`` or a file listing.
        progress: a tqdm bar over shards (``None``: when stderr is a terminal).

    Returns:
        The open index.

    Raises:
        ValueError: an unknown engine or format, an option that does not apply to the format,
            a bad size (its shard and row are named), a ``sizeof`` that does not return one
            size per row, parquet files without ``column=`` whose only columns differ,
            ``path`` holding another build, or a finished index at ``path`` whose source
            changed since (a shard's size or modification time; a resumed build sizes such
            shards again instead).
        ImportError: ``pyarrow``, ``datasets`` or ``ray`` is needed and missing.

    >>> import os, tempfile, numpy as np, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> for k, texts in enumerate([["a b", "abc"], ["hello"]]):
    ...     pq.write_table(pa.table({"text": texts}), os.path.join(d, f"part-{k}.parquet"))
    >>> index = build_size_index(os.path.join(d, "*.parquet"), os.path.join(d, "index"), workers=1)
    >>> index.sizes.tolist(), index.num_shards
    ([3, 3, 5], 2)
    """
    engine = choice("engine", engine, ENGINES)
    if format is not None:
        choice("format", format, FORMATS)
    n_workers = positive_int("workers", workers, allow_none=True)
    rows = int(positive_int("rows_per_shard", rows_per_shard) or 0)
    where = os.fspath(path)
    t0 = time.perf_counter()
    _kind, desc, shards = plan_shards(
        source, column=column, sizeof=sizeof, format=format, rows_per_shard=rows
    )
    names = [s.name for s in shards]
    stamps = shard_stamps(shards)  # each shard's file size and modification time
    if _format.is_index(where):
        found = _format.read_manifest(where)
        if found["source"] == desc and [s["name"] for s in found["shards"]] == names:
            _check_unchanged(where, found["shards"], stamps)
            logger.info("size index %s is already built from %s", where, desc)
            return SizeIndex.open(where)
        raise ValueError(
            f"{where} holds an index of another source ({found['source']!r}): choose another path, or delete it"
        )
    if os.path.isdir(where) and os.listdir(where) and not _format.is_partial(where):
        raise ValueError(
            f"{where} exists and holds no size index: choose another path, or an empty one"
        )
    _format.start_build(where, desc, names, stamps)
    done = set(_format.done_parts(where, len(shards)))
    todo = [(i, s) for i, s in enumerate(shards) if i not in done]
    if done:
        logger.info("resuming %s: %d of %d shards already written", where, len(done), len(shards))
    local_workers = n_workers or min(len(todo), os.cpu_count() or 1) or 1
    results = (
        _local(todo, column, sizeof, local_workers)
        if engine == "local"
        else _ray(todo, column, sizeof, n_workers)
    )
    bar = _bar(progress, len(shards), len(done))
    try:
        for i, values in results:
            _format.write_part(where, i, values)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    _format.finish_build(where, desc, names, stamps)
    logger.info(
        "built %s from %d shards (%s engine) in %.2f s",
        where,
        len(shards),
        engine,
        time.perf_counter() - t0,
    )
    return SizeIndex.open(where)
