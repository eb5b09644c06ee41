"""Byte sizes of files and objects from directory listings (local or fsspec), and their cache.

File and object sizes come from directory listings: one listing call per directory (an S3
"directory" is one paginated ``ListObjectsV2`` per prefix), never one request per object.
``fsspec`` and ``tqdm`` are imported inside the helpers that need them, never at import time.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.sizes._columns import _require

logger = logging.getLogger("fitbatch.sizes")  # one logger for every size source

CACHE_PREFIX = ".fitbatch-sizes"
_GLOB_CHARS = re.compile(r"[*?\[]")


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

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.mkdir(os.path.join(d, "sub"))
    >>> for name, n in [("b.tar", 10), ("a.tar", 3), ("sub/c.tar", 7), ("notes.txt", 1)]:
    ...     with open(os.path.join(d, name), "wb") as f:
    ...         _ = f.write(b"x" * n)
    >>> paths, sizes = list_files(os.path.join(d, "**.tar"))
    >>> [os.path.relpath(p, d) for p in paths], sizes.tolist()
    (['a.tar', 'b.tar', 'sub/c.tar'], [3, 10, 7])
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
