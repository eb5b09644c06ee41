"""Bin packing for costs that grow with the sum of sizes (the ``packed`` strategy's kernel).

Each batch takes the largest remaining samples of its segment, then fills what is left of the
budget with the smallest ones: near the lower bound when small samples are plentiful, and a
Python step per batch (two bounded binary searches), not per sample.
"""

from __future__ import annotations

import bisect

import numpy as np

from fitbatch import _jit
from fitbatch._kernels import FloatArray, IntArray, _concat_ranges, _prefix_sums


def two_ended_starts(
    sizes: FloatArray,
    seg_starts: IntArray,
    budget: float,
    cap: int | None = None,
) -> tuple[IntArray, IntArray]:
    """Pack sum-cost batches from descending segments: largest first, then the smallest.

    Returns (order, starts) where ``order`` rearranges positions so that each batch is
    contiguous: a batch is a run of the largest remaining samples followed by a run of the
    smallest remaining ones of its segment.
    """
    compiled = _jit.two_ended(sizes, seg_starts, budget, cap)
    if compiled is not None:
        return compiled
    n = sizes.size
    csum = _prefix_sums(sizes)
    capn = n if cap is None else cap
    bounds = seg_starts.tolist() + [n]
    view = csum.data
    runs: list[int] = []  # per batch: hi, big_end, small_start, lo
    add = runs.extend
    # Invariant: positions [hi, lo) of the current segment are not yet in any batch.
    sizes_view = sizes.data
    for s0, s1 in zip(bounds[:-1], bounds[1:]):
        hi, lo = s0, s1
        while hi < lo:
            # no batch holds more than budget / (smallest remaining size) samples
            smallest = sizes_view[lo - 1]
            reach = lo if smallest <= 0 else min(lo, hi + int(budget / smallest) + 2)
            big_end = bisect.bisect_right(view, view[hi] + budget, hi, reach + 1) - 1
            big_end = max(hi + 1, min(big_end, lo, hi + capn))
            left = budget - (view[big_end] - view[hi])
            small_start = lo
            if left > 0 and big_end < lo and big_end - hi < capn:
                # the smallest items sit at the segment's end: take the longest suffix that fits
                small_start = bisect.bisect_left(view, view[lo] - left, big_end, lo)
                small_start = max(small_start, lo - (capn - (big_end - hi)))
            add((hi, big_end, small_start, lo))
            hi, lo = big_end, small_start
    del view, sizes_view, csum  # free the prefix sums before the order is built
    r = np.asarray(runs, dtype=np.int64).reshape(-1, 4)
    lengths = np.stack([r[:, 1] - r[:, 0], r[:, 3] - r[:, 2]], axis=1).ravel()
    firsts = np.stack([r[:, 0], r[:, 2]], axis=1).ravel()
    order = _concat_ranges(firsts, lengths)
    starts = np.concatenate([[0], np.cumsum(lengths[0::2] + lengths[1::2])[:-1]]).astype(np.int64)
    return order, starts if r.size else np.zeros(0, np.int64)
