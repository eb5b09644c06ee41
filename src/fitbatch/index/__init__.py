"""Size indexes: sizes of a billion samples on disk, memory-mapped, built in parallel.

* :class:`SizeIndex` (:mod:`~fitbatch.index._index`) — an open index: ``len``, ``sizes`` (a
  numpy memmap), ``stats`` (the manifest), ``shard(i)``; accepted as ``sizes`` by every planner;
* :func:`build_size_index` (:mod:`~fitbatch.index._build`) — sizes from parquet files, a
  ``datasets.Dataset``, files, Megatron ``.idx``, MDS or WebDataset shards
  (:mod:`~fitbatch.index._sources`), on worker processes or Ray, resumable per shard;
* :mod:`~fitbatch.index._format` — the directory layout: shard parts, one column, the manifest.

>>> import tempfile, numpy as np
>>> index = SizeIndex.create(tempfile.mkdtemp() + "/idx", [np.arange(5), np.arange(3)])
>>> len(index), index.stats["count"], index.shard(1).tolist()
(8, 8, [0, 1, 2])
"""

from __future__ import annotations

from fitbatch.index._build import ENGINES, build_size_index
from fitbatch.index._index import SizeIndex
from fitbatch.index._sources import FORMATS

__all__ = ["ENGINES", "FORMATS", "SizeIndex", "build_size_index"]
