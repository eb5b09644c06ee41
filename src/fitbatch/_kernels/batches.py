"""Pure-numpy planning kernels: sizes in planning order + budget -> int64 batch start positions.

No torch and no per-sample Python loop lives here. The kernels share one contract — a batch
is a maximal run of consecutive positions whose cost fits the budget (greedy), never crossing a
segment start, a lone sample over budget forming a batch of its own:

* :func:`greedy_starts` — any order, any cost model (:mod:`fitbatch._kernels.greedy`, re-exported).
* :func:`descending_starts` — positions whose planning size (an upper bound of the true size) is
  non-increasing within each segment: the first sample of a batch bounds its max, so every
  position's batch length is known in closed form and only the chain of batch starts is walked
  (a per-batch, not per-sample, loop). Its two searches serve streams too: :func:`sum_starts`
  (the unweighted sum cost over one segment, by prefix sums) and :func:`edge_counts` (batch
  lengths for given size bounds; the one bisection for costs that use the sum).
(Sort keys live in :mod:`fitbatch._kernels.sorting`, bin packing for sum costs in
:mod:`fitbatch._kernels.packing`.)
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import jit as _jit
from fitbatch._kernels.greedy import OpenBatch as OpenBatch  # the any-order greedy, re-exported
from fitbatch._kernels.greedy import greedy_starts as greedy_starts
from fitbatch.costs import CostModel, SumCost

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
# Sum costs: past this many samples per batch on average, bisect once per batch instead of
# searching at every position (both give the same batches; this only picks the faster).
LONG_BATCH = 32
# batch_reduce gathers sizes in plan order this many positions at a time (bounded memory)
GATHER = 1 << 20


# --------------------------------------------------------------------------- sorted segments


def _as_starts(buffer: array[int]) -> IntArray:
    """Batch starts collected in an ``array("q")`` (8 bytes a start, where a list holds about 40:
    6.5 B per sample at 10M in 1.6M batches) as an int64 array over its memory (no copy)."""
    return np.frombuffer(buffer, dtype=np.int64)


def _prefix_sums(values: FloatArray) -> FloatArray:
    """``[0, v0, v0+v1, ...]`` (n + 1 entries) without a second n-length temporary."""
    out = np.empty(values.shape[0] + 1, dtype=np.float64)
    out[0] = 0.0
    np.cumsum(values, dtype=np.float64, out=out[1:])
    return out


def segment_ends(seg_starts: IntArray, n: int) -> IntArray:
    """For every position, the end (exclusive) of the segment that holds it."""
    bounds = np.append(seg_starts, n).astype(np.int64)
    return np.repeat(bounds[1:], np.diff(bounds))


def plain_sum(cost: CostModel) -> bool:
    """Whether ``cost`` is the unweighted sum of sizes (planned by prefix-sum search)."""
    return isinstance(cost, SumCost) and cost.weights is None


def _sum_counts(csum: FloatArray, budget: float, room: IntArray | int) -> IntArray:
    """Per position i, the most samples from i whose sum fits: the last j with
    ``csum[j] - csum[i] <= budget``, at least 1 and at most ``room`` (the sum-cost greedy).

    Compared as a difference, not as ``csum[j] <= csum[i] + budget``: far into a long order that
    sum rounds to the prefix's own precision, which can admit a batch over a (lowered) budget or
    leave one out, so a batch would depend on where the order started (a stream against the same
    sizes planned at once). The search finds the candidate; neighbours are then checked exactly.
    """
    first = np.arange(csum.size - 1, dtype=np.int64)
    reach = np.searchsorted(csum, csum[:-1] + budget, side="right")
    reach -= 1
    # whole sizes and a whole budget add exactly (the common case): nothing to settle
    exact = float(budget).is_integer() and csum[-1] + budget < 2.0**53 and np.array_equal(csum, np.floor(csum))
    if not exact:
        _settle(csum, first, reach, budget)
    reach -= first
    return np.clip(reach, 1, room, out=reach)


def _settle(csum: FloatArray, first: IntArray, reach: IntArray, budget: float) -> None:
    """Move each ``reach`` (in place) to the last j >= first with ``csum[j] - csum[first] <= budget``
    (sizes are >= 0, so the difference grows with j); the search put it within a rounding of it."""
    last = csum.size - 1
    while True:
        over = np.flatnonzero((reach > first) & (csum[reach] - csum[first] > budget))
        if not over.size:
            break
        reach[over] -= 1
    while True:
        nxt = np.minimum(reach + 1, last)
        under = np.flatnonzero((reach < last) & (csum[nxt] - csum[first] <= budget))
        if not under.size:
            break
        reach[under] += 1


def sum_starts(sizes: FloatArray, budget: float, cap: int | None) -> IntArray:
    """Greedy batch starts under an unweighted sum cost, one segment from a fresh batch.

    The sum-cost greedy of :func:`descending_starts` (a sum cost ignores the planning max):
    searched at every position at once when batches are short, bisected once per batch over
    the same ``csum`` when they are long (the same comparisons, so the same batches).
    """
    n = sizes.shape[0]
    room = n if cap is None else cap
    csum = _prefix_sums(sizes)
    if budget * n < LONG_BATCH * csum[-1]:
        return _walk_counts(np.zeros(1, np.int64), n, _sum_counts(csum, budget, room))
    view = csum.data
    out = array("q")
    add = out.append
    i = 0
    # Invariant: i is a batch start; the bisection finds its end within [i + 1, i + room].
    while i < n:
        add(i)
        end = i + min(n - i, room)  # the last csum index this batch may reach
        j = bisect.bisect_right(view, view[i] + budget, i + 1, end + 1) - 1
        # the same exact difference test as _sum_counts
        while j > i and view[j] - view[i] > budget:
            j -= 1
        while j < end and view[j + 1] - view[i] <= budget:
            j += 1
        i = j if j > i else i + 1
    return _as_starts(out)


def _largest_count(hi: IntArray, fits: Callable[[IntArray], NDArray[np.bool_]]) -> IntArray:
    """Per entry, the largest count in ``[1, hi]`` that ``fits`` (1 when none does), bisected.

    ``fits`` maps counts to whether they fit; it must hold up to some count and fail beyond.
    """
    lo = np.ones(hi.size, dtype=np.int64)  # always feasible (a lone sample)
    # Invariant: count lo fits (or is the forced minimum 1), count hi+1 does not or exceeds hi.
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi + 1) // 2
        ok = fits(mid)
        lo = np.where(open_ & ok, mid, lo)
        hi = np.where(open_ & ~ok, mid - 1, hi)


def _counts_by_search(
    level: NDArray[Any], edges: FloatArray, sizes: FloatArray, room: IntArray, budget: float, cost: CostModel
) -> IntArray:
    """Largest count per position whose cost (max = its level's edge, real sum) fits.

    A vectorised bisection; for the unweighted sum cost a single search of the prefix sums.
    """
    if plain_sum(cost):
        return _sum_counts(_prefix_sums(sizes), budget, room)
    csum = _prefix_sums(sizes)
    edge = edges[level]
    pos = np.arange(edge.size, dtype=np.int64)
    return _largest_count(room, lambda m: cost.evaluate(m.astype(np.float64), edge, csum[pos + m] - csum[pos]) <= budget)


def level_counts(edges: FloatArray, budget: float, cost: CostModel, cap: int | None) -> IntArray | None:
    """Greedy batch length for batches whose max is each level's edge (cost not using the sum).

    Returns ``None`` when the cost depends on the sum of sizes.
    """
    limit = cost.max_count(edges, budget)
    if limit is None:
        return None
    hi = float(cap) if cap is not None else 2.0**62
    counts = np.clip(np.floor(np.minimum(limit, hi)), 1, hi).astype(np.int64)
    # Guard against a floor that float rounding pushed one over the budget.
    over = cost.evaluate(counts.astype(np.float64), edges, edges * counts) > budget
    return np.where(over & (counts > 1), counts - 1, counts)


def edge_counts(edges: FloatArray, budget: float, cost: CostModel, cap: int | None) -> IntArray:
    """Batch length for batches whose every size is at most ``edges[b]`` (at least 1).

    :func:`level_counts` where the cost has a closed form; otherwise the cost uses the sum too,
    which ``count * edge`` bounds, and the count is bisected.
    """
    counts = level_counts(edges, budget, cost, cap)
    if counts is not None:
        return counts
    hi = np.full(edges.size, cap if cap is not None else 1 << 40, dtype=np.int64)
    return _largest_count(hi, lambda m: cost.evaluate(m.astype(np.float64), edges, m * edges) <= budget)


def _walk_counts(seg_starts: IntArray, n: int, counts: IntArray) -> IntArray:
    """Batch starts following ``i += counts[i]`` (counts never reach past their segment's end)."""
    view = counts.data
    out = array("q")
    add = out.append
    bounds = seg_starts.tolist() + [n]
    for a, end in zip(bounds[:-1], bounds[1:]):
        i = a
        while i < end:
            add(i)
            i += view[i]
    return _as_starts(out)


def _runs(seg_starts: IntArray, n: int, level: NDArray[Any]) -> tuple[IntArray, NDArray[np.bool_]]:
    """The first position of every run of one level inside a segment (ascending), and which
    runs start a segment."""
    if seg_starts.size == 1 and seg_starts[0] == 0:  # one segment: its start, then the changes
        change = np.flatnonzero(level[1:] != level[:-1])  # one bool per position, no int64 copies
        change += 1
        cuts = np.concatenate([seg_starts, change])
    else:  # the level changes and the segment starts, marked on one bool per position (no sort)
        mark = np.zeros(n + 1, dtype=bool)
        np.not_equal(level[1:], level[:-1], out=mark[1:n])
        mark[seg_starts] = True
        cuts = np.flatnonzero(mark)
    is_seg = np.zeros(cuts.size, dtype=bool)
    is_seg[np.searchsorted(cuts, seg_starts)] = True
    return cuts, is_seg


def _walk_table(
    seg_starts: IntArray, n: int, cuts: IntArray, is_seg: NDArray[np.bool_], tab: IntArray, cut_tab: IntArray
) -> IntArray:
    """The common walk over the runs of one level (:func:`_runs`): a batch starting in run
    ``r`` holds ``tab[r]`` positions, cut back to ``cut_tab[r]`` unless it reaches the end of
    its segment (the last batch is not cut).

    Positions of one level form runs (levels are non-increasing in a segment), and inside a
    run every batch has the same length, so each run is stepped through with one ``range``.
    The runs are read :data:`WALK_BLOCK` at a time (Python lists of a block, not of every run).
    """
    run_end = np.append(cuts[1:], n)
    seg_end = np.append(seg_starts, n)[np.searchsorted(seg_starts, cuts, side="right")]
    compiled = _jit.walk_runs(cuts, run_end, is_seg, seg_end, tab, cut_tab)
    if compiled is not None:
        return compiled
    out, i = array("q"), 0
    extend = out.extend
    for r0 in range(0, cuts.size, WALK_BLOCK):
        r1 = r0 + WALK_BLOCK
        # Invariant: i is the next batch start (>= the current run's first position, so a
        # batch starting in [a, b) starts at run r's level).
        for a, b, new_seg, end, length, c in zip(
            cuts[r0:r1].tolist(), run_end[r0:r1].tolist(), is_seg[r0:r1].tolist(), seg_end[r0:r1].tolist(),
            tab[r0:r1].tolist(), cut_tab[r0:r1].tolist(),
        ):
            if new_seg:
                i = a
            if i >= b:
                continue
            stop = min(b, end - length)  # a batch starting at or after `stop` reaches the segment end
            if i < stop:
                extend(range(i, stop, c))
                i += c * (-(-(stop - i) // c))
            if i < b:
                out.append(i)
                i = end
    return _as_starts(out)


WALK_BLOCK = 1 << 15  # runs of one level walked per block


def descending_starts(
    level: NDArray[Any],
    edges: FloatArray,
    sizes: FloatArray,
    seg_starts: IntArray,
    budget: float,
    cost: CostModel,
    *,
    cap: int | None = None,
    multiple: int = 1,
) -> IntArray:
    """Greedy batch starts when the planning max ``edges[level]`` is non-increasing per segment.

    ``edges[level[i]]`` bounds the size of position ``i`` and of every later position of its
    segment, so it bounds the max of a batch starting at ``i``: the batch length is known at
    once. For costs with a closed form (padded, polynomial) lengths come from one small table
    per level; otherwise from a vectorised search over the real sums.
    """
    n = level.size
    if n == 0:
        return np.zeros(0, np.int64)
    # the table for the runs of one level only (a full one costs ~2 ms for 65,536 keys)
    table = None if cost.max_count(edges[:1], budget) is None else _runs(seg_starts, n, level)
    if table is not None:
        cuts, is_seg = table
        counts = level_counts(edges[level[np.minimum(cuts, n - 1)]], budget, cost, cap)  # (an empty last segment starts at n)
        if counts is not None:
            cut = np.where(counts >= multiple, counts - counts % multiple, counts) if multiple > 1 else counts
            return _walk_table(seg_starts, n, cuts, is_seg, counts, cut)
    # the cost uses the sum: one length per position, searched
    to_end = segment_ends(seg_starts, n)
    to_end -= np.arange(n, dtype=np.int64)
    room = to_end if cap is None else np.minimum(to_end, cap)
    per_pos = _counts_by_search(level, edges, sizes, room, budget, cost)
    if multiple > 1:  # the last batch of a segment is not cut
        cut = (per_pos >= multiple) & (per_pos < to_end)
        per_pos = np.where(cut, per_pos - per_pos % multiple, per_pos)
    return _walk_counts(seg_starts, n, per_pos)


def _concat_ranges(firsts: IntArray, lengths: IntArray) -> IntArray:
    """concatenate(arange(f, f + l) for f, l in zip(firsts, lengths)), vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    keep = lengths > 0
    firsts, lengths = firsts[keep], lengths[keep]
    steps = np.ones(total, dtype=np.int64)
    heads = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    steps[heads[0]] = firsts[0]
    steps[heads[1:]] = firsts[1:] - (firsts[:-1] + lengths[:-1] - 1)
    return np.cumsum(steps, out=steps)


# --------------------------------------------------------------------------- per-batch reductions


def batch_reduce(sizes: FloatArray, offsets: IntArray, order: IntArray | None = None) -> tuple[IntArray, FloatArray, FloatArray]:
    """(count, max, sum) of each batch of ``sizes[order]`` (``None``: ``sizes``, in plan order) cut at ``offsets``.

    ``sizes[order]`` is gathered ``GATHER`` positions at a time (whole batches), not at once.
    """
    counts = np.diff(offsets)
    if counts.size == 0:
        empty = np.zeros((0, *sizes.shape[1:]))
        return counts, empty, empty.copy()
    if not counts.all():  # reduceat would give an empty batch the next one's first size
        mx, sm = np.zeros((counts.size, *sizes.shape[1:])), np.zeros((counts.size, *sizes.shape[1:]))
        full = np.flatnonzero(counts)
        if full.size:
            _, mx[full], sm[full] = batch_reduce(sizes, np.append(offsets[:-1][full], offsets[-1]), order)
        return counts, mx, sm
    heads = offsets[:-1]
    if order is None or order.size <= GATHER:
        laid = sizes if order is None else sizes[order]
        return counts, np.maximum.reduceat(laid, heads, axis=0), np.add.reduceat(laid, heads, axis=0)
    mx, sm = np.empty((counts.size, *sizes.shape[1:])), np.empty((counts.size, *sizes.shape[1:]))
    cuts = np.unique(np.searchsorted(heads, np.arange(0, order.size, GATHER), side="right") - 1).tolist()
    for b, e in zip(cuts, [*cuts[1:], counts.size]):  # the same batches, so the same sums
        laid, local = sizes[order[heads[b] : offsets[e]]], heads[b:e] - heads[b]
        np.maximum.reduceat(laid, local, axis=0, out=mx[b:e])
        np.add.reduceat(laid, local, axis=0, out=sm[b:e])
    return counts, mx, sm
