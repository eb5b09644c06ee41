"""Bounded batch shapes: the (rows, length) a batch is padded to, picked from a few allowed ones.

A compiled model (``torch.compile``, XLA) recompiles for every new input shape. With a small set
of allowed shapes -- what a plan's ``shapes`` holds, or any ``(k, 2)`` array of (rows, length) --
each batch is padded up to the smallest allowed shape it fits, so the model sees at most ``k``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def as_shapes(shapes: Any) -> np.ndarray:
    """``shapes`` as a sorted, duplicate-free ``(k, 2)`` int64 array of (rows, length).

    Sorted by length then rows, so the first fitting row is the one :func:`pick_shape` picks.

    >>> as_shapes([[4, 128], [2, 256], [4, 128]]).tolist()
    [[4, 128], [2, 256]]
    """
    arr = np.asarray(shapes)
    if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] == 0:
        raise ValueError(
            f"shapes must be a non-empty (k, 2) array of (rows, length), got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer) or (arr < 1).any():
        raise ValueError(f"shapes must hold ints >= 1 (rows, length), got {arr.tolist()[:5]}")
    unique = np.unique(arr.astype(np.int64), axis=0)
    return unique[np.lexsort((unique[:, 0], unique[:, 1]))]


def pick_shape(shapes: Any, rows: int, length: int) -> tuple[int, int]:
    """The allowed shape a batch of ``rows`` samples, the longest ``length`` long, is padded to.

    Among the shapes with at least ``rows`` rows and at least ``length`` positions, the one with
    the smallest length, then the fewest rows. Duplicates in ``shapes`` are allowed.

    Args:
        shapes: a ``(k, 2)`` array-like of (rows, length), for instance a plan's ``shapes``.
        rows: the batch's number of samples.
        length: the batch's longest sample.

    Returns:
        ``(rows, length)`` of the picked shape, as Python ints.

    Raises:
        ValueError: if ``shapes`` is not a ``(k, 2)`` array of ints >= 1, or no shape fits
            (the message names the batch and the largest shapes; add a larger shape).

    >>> pick_shape([[8, 64], [4, 128], [2, 512]], rows=3, length=100)
    (4, 128)
    >>> pick_shape([[8, 64], [4, 128], [2, 512]], rows=1, length=64)
    (8, 64)
    """
    for name, value in (("rows", rows), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    table = as_shapes(shapes)
    return _pick(table, int(rows), int(length))


def _pick(table: np.ndarray, rows: int, length: int) -> tuple[int, int]:
    """:func:`pick_shape` on a table from :func:`as_shapes` (sorted by length, then rows)."""
    fits = np.flatnonzero((table[:, 0] >= rows) & (table[:, 1] >= length))
    if fits.size == 0:
        raise ValueError(
            f"no allowed shape fits a batch of {rows} rows with its longest sample {length} long; "
            f"allowed (rows, length): {table.tolist()}; add a shape at least ({rows}, {length})"
        )
    r, n = table[fits[0]]
    return int(r), int(n)
