"""``SizeIndex``: sizes on disk, memory-mapped, accepted as ``sizes`` by every planner.

The planner works on float64 sizes (:class:`fitbatch.Sizes`). An index hands it over in the
cheapest way: a float64 column *is* the memory map (no copy at all); an int32/int64 column is
converted chunk by chunk into one float64 array, the only array of N values the planner needs,
computed once per open index. Validation is the manifest's: the sizes were checked when the
index was built, so an index opened with ``trust=True`` (the default) is not checked again;
``trust=False`` re-checks it in chunks (non-negative, finite, and count, sum and max equal to the
manifest's) without copying the column.
"""

from __future__ import annotations

import math
import numbers
import os
import shutil
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import format_offenders
from fitbatch.index import _format
from fitbatch.sizes._coerce import Sizes
from fitbatch.sizes._columns import _finish


class SizeIndex:
    """An on-disk, memory-mapped size index: one size per sample, in sharded source order.

    Build one with :meth:`create` (from arrays) or :func:`fitbatch.build_size_index` (from
    parquet files, a ``datasets.Dataset``, files, Megatron ``.idx``, MDS or WebDataset shards),
    open it with :meth:`open`, and pass it wherever ``sizes`` is accepted: ``plan_batches``,
    the samplers, ``fitbatch plan PATH``. ``docs/scale.md`` describes the layout.

    Attributes:
        path: the index directory.

    >>> import tempfile, numpy as np, fitbatch
    >>> path = tempfile.mkdtemp() + "/idx"
    >>> index = fitbatch.SizeIndex.create(path, [np.array([12, 3, 7]), np.array([9, 4, 15])])
    >>> len(index), index.sizes.dtype, index.num_shards, index.shard(1).tolist()
    (6, dtype('int32'), 2, [9, 4, 15])
    >>> index.stats["sum"], index.stats["max"], index.stats["histogram"]["counts"]
    (50, 15, [0, 0, 1, 2, 3])
    >>> fitbatch.plan_batches(fitbatch.SizeIndex.open(path), 24, cost="padded", strategy="sorted").to_lists()
    [[1, 4, 2], [3, 0], [5]]
    """

    def __init__(
        self, path: str, manifest: dict[str, Any], column: NDArray[Any], trust: bool
    ) -> None:
        self.path = path
        self._manifest = manifest
        self._column = column
        self._trust = trust
        self._sizes: Sizes | None = None

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, trust: bool = True) -> SizeIndex:
        """Open a finished index; its column is memory-mapped, not read.

        Args:
            path: the index directory.
            trust: take the manifest's word that the sizes are valid (they were checked when
                the index was built); ``False`` re-checks them in chunks when first planned.

        Raises:
            FileNotFoundError: no finished index at ``path`` (or its column is missing).
            ValueError: not a size index, another format version, a damaged manifest (not
                JSON, a key missing), or a column that is not a readable ``.npy`` or does not
                match its manifest (length or dtype); each names the index and says "rebuild it".

        >>> import tempfile, numpy as np
        >>> path = tempfile.mkdtemp() + "/idx"
        >>> _ = SizeIndex.create(path, [np.array([0.5, 2.25])])
        >>> SizeIndex.open(path, trust=False).sizes
        memmap([0.5 , 2.25])
        """
        where = os.fspath(path)
        manifest = _format.read_manifest(where)
        target = os.path.join(where, str(manifest["file"]))
        try:
            column = np.load(target, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{target} is missing: the size index {where} is damaged, rebuild it"
            ) from None
        except (ValueError, OSError, EOFError) as exc:  # truncated, garbage, not an .npy
            raise ValueError(
                f"{target} is not a readable .npy column ({' '.join(str(exc).split())}): "
                f"the size index {where} is damaged, rebuild it"
            ) from None
        if not isinstance(column, np.ndarray) or (
            column.ndim != 1
            or column.shape[0] != manifest["count"]
            or column.dtype.name != manifest["dtype"]
        ):
            raise ValueError(
                f"{where}: the column holds {column.shape} {column.dtype} but the manifest says "
                f"({manifest['count']},) {manifest['dtype']}: the index is damaged, rebuild it"
            )
        return cls(where, manifest, column, bool(trust))

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        chunks: Iterable[Any],
        *,
        source: str = "arrays",
        overwrite: bool = False,
    ) -> SizeIndex:
        """Write an index from an iterable of 1-D arrays, one shard each, and open it.

        Each chunk is validated like :func:`fitbatch.as_sizes` and written on its own, so the
        chunks may come from a generator larger than memory.

        Args:
            path: the directory to create.
            chunks: 1-D array-likes of non-negative finite sizes (one shard each).
            source: a description of where the sizes come from, kept in the manifest.
            overwrite: replace an index already at ``path`` (else ``FileExistsError``).

        Raises:
            TypeError: ``chunks`` is not an iterable of arrays (a bare array or number).
            FileExistsError: ``path`` exists and is not empty, without ``overwrite``.
            ValueError: a bad size (the shard and row are named), or no sizes at all.

        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/idx"
        >>> SizeIndex.create(path, [[1, 2], [2**40]]).sizes.dtype
        dtype('int64')
        >>> SizeIndex.create(path, [[1, -2]], overwrite=True)
        Traceback (most recent call last):
        ...
        ValueError: shard 0: sizes must be non-negative and finite; 1 bad value: index 1 (size -2.0)
        """
        where = os.fspath(path)
        if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Iterable) or len(getattr(chunks, "shape", (0, 0))) < 2:
            raise TypeError(
                f"chunks must be an iterable of 1-D arrays, one shard each (e.g. [sizes] for one shard), "
                f"got {type(chunks).__name__}"
            )
        if os.path.exists(where) and os.listdir(where):
            if not overwrite:
                raise FileExistsError(
                    f"{where} exists and is not empty: pass overwrite=True to replace it"
                )
            shutil.rmtree(where)
        names: list[str] = []
        _format.start_build(where, source, names)  # an empty record: create() never resumes
        try:
            for i, chunk in enumerate(chunks):
                arr = np.asarray(chunk.detach().cpu().numpy() if hasattr(chunk, "detach") else chunk)
                _format.write_part(where, i, _finish(arr, f"shard {i}"))
                names.append(f"{source}[{i}]")
            _format.finish_build(where, source, names)
        except (TypeError, ValueError):  # bad sizes, or none at all: no half-built index is left
            shutil.rmtree(where, ignore_errors=True)
            raise
        return cls.open(where)

    def __len__(self) -> int:
        return int(self._manifest["count"])

    def __repr__(self) -> str:
        return f"SizeIndex({self.path!r}, count={len(self)}, dtype={self._manifest['dtype']}, shards={self.num_shards})"

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled by path (DataLoader workers, spawned processes): reopened, not copied
        return (_reopen, (self.path, self._trust))

    @property
    def sizes(self) -> NDArray[Any]:
        """The whole column as a read-only numpy memmap (nothing is read until used)."""
        return self._column

    @property
    def stats(self) -> dict[str, Any]:
        """The manifest: count, sum, min, max, dtype, histogram, source and per-shard stats (a copy)."""
        import copy

        return copy.deepcopy(self._manifest)

    @property
    def digest(self) -> str:
        """A fingerprint of the column (blake2b, 128 bits): the manifest's, else hashed once in chunks.

        What a sampler's state carries when it plans in windows (:mod:`fitbatch.sampler._budget`): reading it costs
        nothing on an index built by this release.
        """
        if "digest" not in self._manifest:  # an index written before digests
            self._manifest["digest"] = _format.column_digest(self._column)
        return str(self._manifest["digest"])

    @property
    def integral(self) -> bool:
        """Whether every size is a whole number."""
        return bool(self._manifest["integral"])

    @property
    def num_shards(self) -> int:
        """How many shards the index was built from."""
        return len(self._manifest["shards"])

    def shard(self, i: int) -> NDArray[Any]:
        """The sizes of shard ``i`` (a view of the memmap; negative ``i`` counts from the end).

        Raises:
            TypeError: ``i`` is not an int.
            IndexError: no shard ``i``.
        """
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"shard index must be an int, got {i!r} ({type(i).__name__})")
        i = int(i)
        n = self.num_shards
        if not -n <= i < n:
            raise IndexError(f"shard {i} out of range: the index has {n} shards (0..{n - 1})")
        s = self._manifest["shards"][i % n]
        return self._column[s["offset"] : s["offset"] + s["count"]]

    def __fitbatch_sizes__(self) -> Sizes:
        """The sizes as the planner takes them (see the module docstring); computed once."""
        if self._sizes is None:
            if not self._trust:
                self._verify()
            column = self._column
            if column.dtype == np.float64:
                values: NDArray[np.float64] = column
            else:
                values = np.empty(column.shape[0], dtype=np.float64)
                for a in range(0, column.shape[0], _format._CHUNK):
                    values[a : a + _format._CHUNK] = column[a : a + _format._CHUNK]
            self._sizes = Sizes(values, bool(self._manifest["integral"]))
        return self._sizes

    def _verify(self) -> None:
        column, m = self._column, self._manifest
        for a in range(0, column.shape[0], _format._CHUNK):
            chunk = column[a : a + _format._CHUNK]
            ok = chunk >= 0 if chunk.dtype.kind in "iu" else np.isfinite(chunk) & (chunk >= 0)
            if not ok.all():
                bad = np.flatnonzero(~ok)
                raise ValueError(
                    f"{self.path}: sizes must be non-negative and finite; "
                    f"{format_offenders(bad + a, chunk[bad])}: the index is damaged, rebuild it"
                )
        total, top = _format.exact_sum(column), column.max().item()
        same_sum = (
            total == m["sum"]
            if column.dtype.kind in "iu"
            else math.isclose(total, m["sum"], rel_tol=1e-9)
        )
        if not same_sum or top != m["max"]:
            found, wanted = {"sum": total, "max": top}, {"sum": m["sum"], "max": m["max"]}
            raise ValueError(
                f"{self.path}: the column has {found} but the manifest says {wanted}: the index is damaged, rebuild it"
            )


def _reopen(path: str, trust: bool) -> SizeIndex:
    return SizeIndex.open(path, trust=trust)
