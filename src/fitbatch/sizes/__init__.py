"""Sizes: one number per sample (or one row of D numbers), validated once, and where they come from.

Two parts, each private, re-exported here:

* :mod:`fitbatch.sizes._coerce` — :func:`as_sizes` and :class:`Sizes`: the accepted forms of
  ``sizes`` (1-D array-like, ``(N, D)`` array, mapping, callable with ``n``), validated once;
* the size sources — :mod:`~fitbatch.sizes._columns` (numpy, ``pyarrow``, ``pandas`` and
  ``datasets`` columns, tokenizers), :mod:`~fitbatch.sizes._files` (byte sizes of files and
  objects from directory listings, and their cache) and :mod:`~fitbatch.sizes._readers` (files
  of sizes: ``.npy``, ``.txt``, ``.csv``, ``.parquet``, and the :func:`from_source` dispatch).

Every source returns a 1-D numpy array (int64 when every size is a whole number, else float64),
validated like :func:`as_sizes`. Optional libraries (``fsspec``, ``pyarrow``, ``pandas``,
``datasets``, ``tqdm``) are imported inside the helpers that need them, never at import time.

>>> as_sizes([3, 1, 2]).values
array([3., 1., 2.])
>>> from fitbatch.sizes import from_array, from_tokenizer  # (loaded on first use)
>>> from_array([3, 1, 2])
array([3, 1, 2])
>>> from_tokenizer(["a b c", "d"], lambda batch: [t.split() for t in batch])
array([3, 1])
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fitbatch._lazy import exports
from fitbatch.sizes._coerce import Sizes, SizesLike, as_sizes

if TYPE_CHECKING:  # the size sources load on first use: a plan needs only as_sizes
    from fitbatch.sizes._columns import from_array, from_dataset, from_tokenizer, to_numbers
    from fitbatch.sizes._files import CACHE_PREFIX, cache_path, from_files, list_files
    from fitbatch.sizes._readers import FILE_FORMATS, from_source

logger = logging.getLogger(__name__)  # the logger the size sources write to

_LAZY = {
    "CACHE_PREFIX": "fitbatch.sizes._files",
    "FILE_FORMATS": "fitbatch.sizes._readers",
    "cache_path": "fitbatch.sizes._files",
    "from_array": "fitbatch.sizes._columns",
    "from_dataset": "fitbatch.sizes._columns",
    "from_files": "fitbatch.sizes._files",
    "from_source": "fitbatch.sizes._readers",
    "from_tokenizer": "fitbatch.sizes._columns",
    "list_files": "fitbatch.sizes._files",
    "to_numbers": "fitbatch.sizes._columns",
}


__getattr__, __dir__ = exports(__name__, _LAZY, globals())  # hashlib and the file readers cost an import a plan never needs

__all__ = [
    "CACHE_PREFIX",
    "FILE_FORMATS",
    "Sizes",
    "SizesLike",
    "as_sizes",
    "cache_path",
    "from_array",
    "from_dataset",
    "from_files",
    "from_source",
    "from_tokenizer",
    "list_files",
    "to_numbers",
]
