"""16-bit sort keys for sizes: millions of sizes sorted with numpy's O(n) radix sort.

A key is monotone in the size and comes with an upper edge (every size with key ``k`` is at most
``edges[k]``), so a planner may sort by key and plan against edges without exceeding a budget.

>>> import numpy as np
>>> keys, edges = size_keys(np.array([5.0, 1.0, 3.0]), integral=True)
>>> keys.tolist(), stable_argsort_u16(keys).tolist()
([5, 1, 3], [1, 2, 0])
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
KEY_LEVELS = 1 << 16
# the edges of keys that are the sizes themselves: one read-only array for every call (a new
# one is 512 KiB of fresh pages, 0.1 ms, more than the rest of a 20k-sample key)
_OWN_EDGES = np.arange(KEY_LEVELS, dtype=np.float64)
_OWN_EDGES.flags.writeable = False


def size_keys(values: FloatArray, integral: bool) -> tuple[NDArray[np.uint16], FloatArray]:
    """Monotone 16-bit sort keys for non-negative values, and an upper edge per key.

    Integers below 2**16 are their own key (an exact sort); integers below about 2**20 are exact
    below 32768 and binned linearly above it (bins of at most 16, under 0.05 % relative); anything
    else is binned on a ``log1p`` scale (about 1e-4 relative for a 1e4 range). ``edges[k]``
    bounds every value with key ``k``, so planning with edges never exceeds a budget.
    """
    if values.size == 0:
        return np.zeros(0, np.uint16), np.zeros(KEY_LEVELS)
    vmax = float(values.max())
    if integral and vmax < KEY_LEVELS:
        return values.astype(np.uint16), _OWN_EDGES
    half = KEY_LEVELS // 2
    if integral and vmax < half + (half << 4):
        shift = max(0, int(math.ceil(math.log2((vmax - half + 1) / half))))
        ints = values.astype(np.int32)
        big = ints >= half
        ints[big] = half + ((ints[big] - half) >> shift)
        keys = ints.astype(np.uint16)
        del ints, big
        k = np.arange(KEY_LEVELS, dtype=np.float64)
        edges = np.where(k < half, k, half + (k - half + 1) * (1 << shift) - 1)
        return keys, edges
    positive = values[values > 0]
    unit = float(positive.min()) if positive.size else 1.0
    top = math.log1p(vmax / unit)
    scale = (KEY_LEVELS - 1) / top if top > 0 else 1.0
    # float32 is ample for a 16-bit key; bins touched by rounding are widened below. Sizes or
    # ratios past float32's range (1e38: rare) take the log in float64 first.
    if max(vmax, vmax / unit, 1.0 / unit) < 1e38:
        t = np.multiply(values, 1.0 / unit, dtype=np.float32)
        np.log1p(t, out=t)
    else:
        t = np.log1p(values / unit).astype(np.float32)
    t *= np.float32(scale)
    np.minimum(t, np.float32(KEY_LEVELS - 1), out=t)
    keys = t.astype(np.uint16)
    del t
    with np.errstate(over="ignore"):  # all sizes 0 (scale 1): the unused top keys' edges are inf
        edges = unit * np.expm1(np.arange(1, KEY_LEVELS + 1, dtype=np.float64) / scale)
    edges[-1] = max(edges[-1], vmax)
    low = values > edges[keys]
    if low.any():
        np.maximum.at(edges, keys[low], values[low])
    # keys are monotone in values up to float32 rounding: make edges cover every lower key too
    return keys, np.maximum.accumulate(edges)


def keys_are_sizes(edges: FloatArray, integral: bool) -> bool:
    """Whether :func:`size_keys` gave every size as its own key (integers below ``2**16``).

    >>> keys_are_sizes(size_keys(np.array([5.0, 1.0]), True)[1], True)
    True
    >>> keys_are_sizes(size_keys(np.array([5.5, 1.0]), False)[1], False)
    False
    """
    # the binned integer edges end at 2**16 - 1 only without binning; logarithmic ones at >= max
    return integral and edges.size == KEY_LEVELS and float(edges[-1]) == KEY_LEVELS - 1


def stable_argsort_u16(keys: NDArray[np.uint16]) -> IntArray:
    """Stable argsort of 16-bit keys (numpy uses an O(n) radix sort for them)."""
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)


def counting_argsort(keys: NDArray[np.integer], top: int) -> IntArray:
    """Stable argsort of whole-number keys in ``[0, top]``, in O(n): numpy's radix sort over
    the narrowest unsigned type that holds ``top`` (one byte: one pass; two bytes: two), and
    for keys below ``2**32`` two such sorts, by the low 16 bits and then stably by the high 16.
    Wider keys take numpy's stable merge sort. A stable sort has one result: the order is
    ``np.argsort(keys, kind="stable")``'s.

    >>> counting_argsort(np.array([300, 2, 300, 1, 2]), 300).tolist()
    [3, 1, 4, 0, 2]
    """
    if top < 1 << 8:
        return np.argsort(keys.astype(np.uint8, copy=False), kind="stable").astype(np.int64, copy=False)
    if top < 1 << 16:
        return stable_argsort_u16(keys.astype(np.uint16, copy=False))
    if top < 1 << 32:
        wide = keys.astype(np.uint32, copy=False)
        idx = stable_argsort_u16((wide & 0xFFFF).astype(np.uint16))
        high = (wide >> 16).astype(np.uint16)[idx]
        return np.take(idx, stable_argsort_u16(high), out=idx, mode="clip") if idx.size else idx
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)


#: positions :func:`sort_within_segments` sorts at a time (whole segments): its buffers beside the output
SEGMENT_CHUNK = 1 << 20


def sort_within_segments(keys: NDArray[np.uint16], seg_len: int) -> IntArray:
    """Positions that sort consecutive segments of ``seg_len`` by key (stable), segment by segment."""
    n = keys.size
    if seg_len >= n:  # one segment: the argsort itself, no second array of n
        return stable_argsort_u16(keys)
    full = n // seg_len * seg_len
    out = np.empty(n, dtype=np.int64)
    # a few segments at a time: the sort's own buffers stay small beside ``out``
    step = max(1, SEGMENT_CHUNK // seg_len) * seg_len
    for a in range(0, full, step):
        b = min(a + step, full)
        rows = np.argsort(keys[a:b].reshape(-1, seg_len), axis=1, kind="stable")
        rows += np.arange(a, b, seg_len, dtype=np.int64)[:, None]
        out[a:b] = rows.ravel()
    if full < n:
        out[full:] = full + stable_argsort_u16(keys[full:])
    return out
