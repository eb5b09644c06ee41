"""Bin packing for costs that grow with the sum of sizes (the ``packed`` strategy's kernel).

First-fit decreasing: each sample of a descending segment goes into the first batch of that
segment with room for it (a new batch when none has), found in a tree that keeps the most room
under each node, so a sample costs about ``2 log2(batches)`` steps. On the standard library's
file token counts it lands within 0.03 % of the Martello–Toth lower bound where taking the
largest samples then the smallest (the earlier walk) stayed 1–7 % above it.

With the ``fast`` extra the loop is compiled (:func:`fitbatch._kernels.jit.first_fit_in_place`); without
it the same loop runs in Python (:func:`_first_fit_batches`), with the same subtractions and
comparisons, so the batches are the same either way (a few microseconds per sample: install the
extra for millions).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import jit as _jit
from fitbatch._kernels.batches import FloatArray, IntArray


def first_fit_laid(
    sizes: FloatArray,
    positions: IntArray,
    seg_starts: IntArray,
    budget: float,
    cap: int | None = None,
) -> tuple[IntArray, IntArray, FloatArray]:
    """:func:`first_fit_starts` over ``sizes`` laid out at ``positions``: returns the positions
    in batch order, the batch starts and the sizes in batch order.

    May rearrange ``sizes`` and ``positions`` (contiguous float64 and int64) in place and return
    them: compiled, each segment goes through a buffer of its length instead of two gathers of n.

    >>> import numpy as np
    >>> positions, starts, laid = first_fit_laid(np.array([6.0, 5, 4, 3]), np.array([7, 5, 3, 1]), np.zeros(1, np.int64), 10.0)
    >>> positions.tolist(), starts.tolist(), laid.tolist()
    ([7, 3, 5, 1], [0, 2], [6.0, 4.0, 5.0, 3.0])
    """
    n = sizes.shape[0]
    room_cap = n if cap is None else min(int(cap), n)
    if sizes.dtype == np.float64 and positions.dtype == np.int64 and sizes.flags.c_contiguous and positions.flags.c_contiguous:
        starts = _jit.first_fit_in_place(sizes, positions, seg_starts, budget, room_cap)
        if starts is not None:
            return positions, starts, sizes
    batch, total = _first_fit_batches(sizes, seg_starts, float(budget), room_cap)
    inner = np.argsort(batch, kind="stable")
    starts = np.zeros(total, dtype=np.int64)
    if total:
        np.cumsum(np.bincount(batch, minlength=total)[:-1], out=starts[1:])
    return positions[inner], starts, sizes[inner]


def first_fit_keys(
    keys: NDArray[np.uint16],
    positions: IntArray,
    seg_starts: IntArray,
    budget: float,
    cap: int | None = None,
) -> tuple[IntArray, IntArray, NDArray[np.uint16]]:
    """:func:`first_fit_laid` over whole sizes given as 16-bit keys (each key is its size) laid
    out at ``positions``: returns the positions in batch order, the batch starts and the keys in
    batch order, the same batches as :func:`first_fit_laid` over ``keys.astype(np.float64)``.

    Compiled, the loop reads the keys (2 B a sample) where :func:`first_fit_laid` reads float64
    sizes (8 B), and rearranges ``keys`` and ``positions`` (contiguous uint16 and int64) in place
    and returns them; no float64 sizes in batch order are made (read them through the positions).

    >>> import numpy as np
    >>> positions, starts, laid = first_fit_keys(np.array([6, 5, 4, 3], np.uint16), np.array([7, 5, 3, 1]), np.zeros(1, np.int64), 10.0)
    >>> positions.tolist(), starts.tolist(), laid.tolist()
    ([7, 3, 5, 1], [0, 2], [6, 4, 5, 3])
    """
    n = keys.shape[0]
    room_cap = n if cap is None else min(int(cap), n)
    if keys.dtype == np.uint16 and positions.dtype == np.int64 and keys.flags.c_contiguous and positions.flags.c_contiguous:
        starts = _jit.first_fit_in_place(keys, positions, seg_starts, budget, room_cap)
        if starts is not None:
            return positions, starts, keys
    order, starts, laid = first_fit_laid(keys.astype(np.float64), positions, seg_starts, budget, cap)
    return order, starts, laid.astype(np.uint16)


def batch_loads(laid_keys: NDArray[np.uint16], starts: IntArray) -> FloatArray:
    """Each batch's sum of the whole sizes ``laid_keys`` (in batch order, cut at ``starts``) as
    float64: the sums of :func:`numpy.add.reduceat` over the float64 sizes (exact, being whole
    below ``2**53``), with the keys widened ``LOAD_CHUNK`` samples at a time (whole batches),
    not all at once (8 B a sample).

    >>> batch_loads(np.array([6, 4, 5, 3], np.uint16), np.array([0, 2])).tolist()
    [10.0, 8.0]
    """
    n, m = laid_keys.shape[0], starts.shape[0]
    loads = np.empty(m, dtype=np.float64)
    b = 0
    while b < m:
        e = max(int(np.searchsorted(starts, starts[b] + LOAD_CHUNK, side="right")), b + 1)  # batches [b, e)
        a, end = int(starts[b]), (int(starts[e]) if e < m else n)
        np.add.reduceat(laid_keys[a:end].astype(np.float64), starts[b:e] - a, out=loads[b:e])
        b = e
    return loads


LOAD_CHUNK = 1 << 18  # batch_loads: samples widened to float64 at a time


def first_fit_starts(
    sizes: FloatArray,
    seg_starts: IntArray,
    budget: float,
    cap: int | None = None,
) -> tuple[IntArray, IntArray]:
    """Pack sum-cost batches first-fit within each descending segment.

    Returns (order, starts) where ``order`` rearranges positions so that each batch is
    contiguous: batches in the order they were opened, segment by segment, each holding its
    positions in the order they were placed (descending). A batch holds at most ``cap`` samples;
    a sample over the budget gets a batch of its own.

    >>> import numpy as np
    >>> order, starts = first_fit_starts(np.array([6.0, 5, 4, 3, 2, 2]), np.zeros(1, np.int64), 10.0)
    >>> [order[a:b].tolist() for a, b in zip(starts, [*starts[1:], 6])]
    [[0, 2], [1, 3, 4], [5]]
    """
    n = sizes.shape[0]
    # a copy of the sizes to rearrange, and the positions themselves
    order, starts, _ = first_fit_laid(np.array(sizes, dtype=np.float64), np.arange(n, dtype=np.int64), seg_starts, budget, cap)
    return order, starts


def _first_fit_batches(sizes: FloatArray, seg_starts: IntArray, budget: float, cap: int) -> tuple[IntArray, int]:
    """The batch of every position (numbered in opening order) and the number of batches; a
    batch holds at most ``cap`` samples (at most ``n``). The compiled twin is
    :func:`fitbatch._kernels.compiled._first_fit_segment` (one segment at a time)."""
    n = sizes.shape[0]
    batch = np.empty(n, dtype=np.int64)
    values = sizes.tolist()
    bounds = [*seg_starts.tolist(), n]
    total = 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        size = 64  # leaves (batches) in the tree; doubled when they run out
        room = [-np.inf] * (2 * size)  # a node holds the most room of the open batches under it
        count = [0] * size
        used = 0
        placed: list[int] = []
        add = placed.append
        # Invariant: positions before x's hold batches; leaves [0, used) are the open batches.
        last = np.nan  # the size placed last, and where: the batches before it lack room for it
        leaf = 0
        for x in values[a:b]:
            if x == last and room[leaf + size] >= x:
                node = leaf + size
            elif room[1] >= x:
                node = 1
                while node < size:  # the first open batch (leaf) with room for x
                    node = 2 * node if room[2 * node] >= x else 2 * node + 1
                leaf = node - size
            else:  # no open batch has room: open the next
                if used == size:
                    room = _grown(room, size)
                    count += [0] * size
                    size *= 2
                leaf = used
                node = leaf + size
                used += 1
                room[node] = budget
            add(leaf)
            last = x
            count[leaf] += 1
            room[node] = room[node] - x if count[leaf] < cap else -np.inf
            node >>= 1
            while node:
                left, right = room[2 * node], room[2 * node + 1]
                most = left if left >= right else right
                if room[node] == most:  # the ancestors keep their most room too
                    break
                room[node] = most
                node >>= 1
        batch[a:b] = np.asarray(placed, dtype=np.int64) + total
        total += used
    return batch, total


def _grown(room: list[float], size: int) -> list[float]:
    """The room tree with twice the leaves (the new ones hold no room)."""
    grown = [-np.inf] * (4 * size)
    grown[2 * size : 3 * size] = room[size : 2 * size]
    for node in range(2 * size - 1, 0, -1):
        left, right = grown[2 * node], grown[2 * node + 1]
        grown[node] = left if left >= right else right
    return grown
