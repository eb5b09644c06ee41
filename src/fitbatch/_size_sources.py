"""Sizes from where data lives: array columns, ``datasets`` columns, tokenizers, files and objects.

A re-export of the size sources, which live in one private module per concept:

* :mod:`fitbatch._size_columns`: array columns (numpy, ``pyarrow``, ``pandas``), ``datasets``
  columns and tokenizers;
* :mod:`fitbatch._size_files`: byte sizes of files and objects from directory listings, and
  their cache;
* :mod:`fitbatch._size_readers`: files of sizes (``.npy``, ``.txt``, ``.csv``, ``.parquet``) and
  the :func:`from_source` dispatch.

Every helper returns a 1-D numpy array (int64 when every size is a whole number, else float64),
validated like :func:`fitbatch.as_sizes`. Optional libraries (``fsspec``, ``pyarrow``, ``pandas``,
``datasets``, ``tqdm``) are imported inside the helpers that need them, never at import time.
Users import these functions from :mod:`fitbatch.sizes`.

>>> from_array([3, 1, 2])
array([3, 1, 2])
>>> from_tokenizer(["a b c", "d"], lambda batch: [t.split() for t in batch])
array([3, 1])
"""

from __future__ import annotations

import logging

from fitbatch._size_columns import from_array, from_dataset, from_tokenizer, to_numbers
from fitbatch._size_files import CACHE_PREFIX, cache_path, from_files, list_files
from fitbatch._size_readers import FILE_FORMATS, from_source

logger = logging.getLogger(__name__)  # the logger the size sources write to

__all__ = [
    "CACHE_PREFIX",
    "FILE_FORMATS",
    "cache_path",
    "from_array",
    "from_dataset",
    "from_files",
    "from_source",
    "from_tokenizer",
    "list_files",
    "to_numbers",
]
