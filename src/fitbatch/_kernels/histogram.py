"""First-fit decreasing on a histogram: sum-cost packing of whole-number sizes with few values.

First fit over a descending run of equal sizes ``v`` fills the open batches in opening order,
each with as many as fit (``room // v``, up to the count cap), then opens new ones holding
``budget // v`` each. So batches opened together and filled alike stay alike: they form a
*group* (a run of consecutive batches with the same room and count). Per distinct size a few
vectorised steps over the groups do what first fit does sample by sample, and each sample's
place follows from its rank among the samples of its size: the batches are the same as
:func:`fitbatch._kernels.packing.first_fit_laid` gives over the same descending segment, in
the same order, each holding its positions in the same order, for a cost that depends on the
number of distinct sizes and groups (hundreds) rather than on the samples (millions).

>>> import numpy as np
>>> laid = np.array([6, 5, 4, 3, 2, 2])
>>> dest, starts = histogram_first_fit(laid, 10.0)
>>> out = np.empty(6, np.int64); out[dest] = np.arange(6)
>>> [out[a:b].tolist() for a, b in zip(starts, [*starts[1:], 6])]
[[0, 2], [1, 3, 4], [5]]
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]

#: the histogram path pays off when a segment holds at least this many samples per distinct size
#: (measured on the shared sets, CPU time: 170-280 us per distinct size against 2.7-5.7 us per
#: sample for the first fit in Python and about 0.1 us compiled: functions at 1M, 895 sizes,
#: 161 ms on the histogram against 88 ms compiled). One rule whether numba is loaded or not: the
#: path decides the batches of more than a pool of samples.
SAMPLES_PER_SIZE = 2048


def pays(n: int, distinct: int) -> bool:
    """Whether :func:`histogram_first_fit` beats a per-sample first fit on ``n`` samples of
    ``distinct`` sizes (measured: a few vectorised steps per distinct size against about a
    tenth of a microsecond per sample compiled, a few in Python).

    >>> pays(16_000_000, 512), pays(20_000, 2_000)
    (True, False)
    """
    return n >= SAMPLES_PER_SIZE * max(distinct, 1)


def level_counts(level: NDArray[np.uint16], levels: int) -> IntArray:
    """Samples per level: ``np.bincount(level, minlength=levels)`` for 16-bit levels below
    ``levels``, compiled with the ``fast`` extra (numpy's copies the levels to int64 first: 8 B a
    sample, a tenth of a second at 16M).

    >>> level_counts(np.array([2, 0, 2], np.uint16), 4).tolist()
    [1, 0, 2, 0]
    """
    from fitbatch._kernels import pattern_layout  # (the compiled loops load with the layout's)

    loops = pattern_layout._loops(0) if level.dtype == np.uint16 and level.ndim == 1 else None
    if loops is None:
        return np.bincount(level, minlength=levels)
    out = np.zeros(1 << 16, dtype=np.int64)
    loops.count_levels(np.ascontiguousarray(level), out)
    present = np.flatnonzero(out)
    size = max(levels, int(present[-1]) + 1 if present.size else 0)
    return out[:size] if size <= out.size else np.concatenate([out, np.zeros(size - out.size, np.int64)])


Parts = tuple[IntArray, IntArray, IntArray, IntArray]  # per run of samples: first batch, batches, each, before


def histogram_first_fit(laid: NDArray[np.integer], budget: float, cap: int | None = None) -> tuple[IntArray, IntArray]:
    """First-fit decreasing over ``laid``, non-negative whole sizes in descending order.

    Returns ``dest`` (where each position goes in batch order: batches in the order they were
    opened, each holding its positions in the order they were placed) and the batch starts.
    A batch holds at most ``cap`` samples; a sample over the budget gets a batch of its own.
    The same batches as the per-sample first fit, as long as the budget and the sizes are
    exact in float64 (whole sizes below ``2**16``, a budget below ``2**52``).
    """
    n = int(laid.shape[0])
    parts, starts = histogram_plan(laid, budget, cap)
    dest = np.empty(n, dtype=np.int64)
    for a, b, d in placements(parts, starts, n):
        dest[a:b] = d
    return dest, starts


def histogram_plan(laid: NDArray[np.integer], budget: float, cap: int | None = None) -> tuple[Parts, IntArray]:
    """:func:`histogram_first_fit`'s batches as runs of samples (for :func:`placements`) and
    the batch starts."""
    n = int(laid.shape[0])
    if n == 0:
        empty = np.zeros(0, np.int64)
        return (empty, empty, empty, empty), empty
    limit = n if cap is None else max(1, min(int(cap), n))
    values, firsts = _runs(laid)
    counts = np.diff(np.append(firsts, n))
    # the groups, in batch order: first batch, batches, room left in each, samples in each
    g_first = np.zeros(0, np.int64)
    g_size = np.zeros(0, np.int64)
    g_room = np.zeros(0, np.float64)
    g_count = np.zeros(0, np.int64)
    opened = 0
    # where each run of samples goes: first batch, batches, samples per batch, samples before
    parts: list[Parts] = []
    smallest = float(values[-1])
    budget = float(budget)
    # Invariant: the groups hold every batch opened so far, in opening order, each with its room
    # and count as first fit leaves them after the samples of the sizes before ``v``.
    for v, c in zip(values.tolist(), counts.tolist()):
        if g_size.size:
            each = _fits(g_room, g_count, float(v), limit)
            load = each * g_size
            total = np.cumsum(load)
            if total[-1] >= c:  # the open batches take them all: the last one taking some splits
                j = int(np.searchsorted(total, c))
                before = int(total[j - 1]) if j else 0
                took = c - before
                full, rest = divmod(took, int(each[j]))
                used = np.flatnonzero(each[:j] > 0)
                parts.append((g_first[used], g_size[used], each[used], g_count[used]))
                g_room[:j] -= each[:j] * float(v)
                g_count[:j] += each[:j]
                g_first, g_size, g_room, g_count = _split(g_first, g_size, g_room, g_count, j, full, rest, int(each[j]), float(v), parts)
                c = 0
            else:
                used = np.flatnonzero(each > 0)
                parts.append((g_first[used], g_size[used], each[used], g_count[used]))
                g_room -= each * float(v)
                g_count += each
                c -= int(total[-1])
        if c:  # new batches, each taking as many as fit in a fresh one (one, when over the budget)
            per = limit if v == 0 else max(1, min(limit, math.floor(budget / v)))
            full, rest = divmod(c, per)
            new_first = np.array([opened, opened + full], dtype=np.int64)
            new_size = np.array([full, 1], dtype=np.int64)
            new_each = np.array([per, rest], dtype=np.int64)
            keep = new_size * new_each > 0
            parts.append((new_first[keep], new_size[keep], new_each[keep], np.zeros(int(keep.sum()), np.int64)))
            g_first = np.concatenate([g_first, new_first[keep]])
            g_size = np.concatenate([g_size, new_size[keep]])
            g_room = np.concatenate([g_room, budget - new_each[keep] * float(v)])
            g_count = np.concatenate([g_count, new_each[keep]])
            opened += full + (1 if rest else 0)
        # groups that can take nothing more (no room for the smallest size, or full) are let go
        alive = (g_room >= smallest) & (g_count < limit)
        if not alive.all():
            _close(g_first, g_size, g_count, ~alive, parts)
            g_first, g_size, g_room, g_count = g_first[alive], g_size[alive], g_room[alive], g_count[alive]
    _close(g_first, g_size, g_count, np.ones(g_size.size, bool), parts)
    return _runs_and_starts(parts, opened)


def run_sizes(runs: Parts, laid: NDArray[np.integer]) -> NDArray[np.float64]:
    """The size of each of :func:`histogram_plan`'s runs (float64): a run places samples of one
    size, that of its first sample in the descending sizes ``laid``.

    >>> laid = np.array([6, 5, 4, 3, 2, 2])
    >>> run_sizes(histogram_plan(laid, 10.0)[0], laid).tolist()
    [6.0, 5.0, 4.0, 3.0, 2.0, 2.0]
    """
    load = runs[1] * runs[2]
    at = np.cumsum(load)
    at -= load
    return laid[at].astype(np.float64)


def batch_measures(runs: Parts, value: NDArray[np.float64], batches: int) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    """Each batch's longest and total size (float64) from :func:`histogram_plan`'s runs and
    their sizes (:func:`run_sizes`), without reading a sample through the plan: a batch's
    longest is the size of the run that opened it (the one placing its first samples; the
    openers come in opening order, so their sizes repeated over their batches are the longest),
    its total the sum over its runs. Two per-batch arrays in all; ``None`` where the openers do
    not cover the batches once each in order (not a plan of :func:`histogram_plan`).

    >>> laid = np.array([6, 5, 4, 3, 2, 2])
    >>> runs, starts = histogram_plan(laid, 10.0)
    >>> [m.tolist() for m in batch_measures(runs, run_sizes(runs, laid), starts.size)]
    [[6.0, 5.0, 2.0], [10.0, 10.0, 2.0]]
    """
    first, size, each, before = runs
    opener = before == 0
    o_first, o_size = first[opener], size[opener]
    covered = np.cumsum(o_size)
    if covered.size and (covered[-1] != batches or o_first[0] != 0 or not np.array_equal(o_first[1:], covered[:-1])):
        return None
    longest = np.repeat(value[opener], o_size)
    # each run adds each * size to its batches: +w where they begin, -w past their end, summed
    # (whole sizes: every partial sum exact in float64)
    w = value * each
    total: NDArray[np.float64] = np.bincount(np.concatenate([first, first + size]), weights=np.concatenate([w, -w]), minlength=batches + 1).astype(np.float64, copy=False)
    np.cumsum(total, out=total)
    return longest, total[:batches]


def _runs(laid: NDArray[np.integer]) -> tuple[IntArray, IntArray]:
    """The distinct sizes of a descending array and where each run of them starts."""
    firsts = np.flatnonzero(np.diff(laid)) + 1
    firsts = np.concatenate([[0], firsts]).astype(np.int64)
    return laid[firsts].astype(np.int64), firsts


def _fits(room: NDArray[np.float64], count: IntArray, v: float, limit: int) -> IntArray:
    """Samples of size ``v`` each batch of a group takes, filled alone by first fit."""
    space = (limit - count).astype(np.float64)
    if v == 0:
        each = np.where(room >= 0, space, 0.0)
    else:
        each = np.minimum(np.floor_divide(np.maximum(room, 0.0), v), space)
    return each.astype(np.int64)


def _split(
    g_first: IntArray, g_size: IntArray, g_room: NDArray[np.float64], g_count: IntArray,
    j: int, full: int, rest: int, each: int, v: float, parts: list[Parts],
) -> tuple[IntArray, IntArray, NDArray[np.float64], IntArray]:
    """Group ``j`` after its first ``full`` batches took ``each`` and the next ``rest``: up to
    three groups in its place (the takers recorded in ``parts``)."""
    first, size, room, count = int(g_first[j]), int(g_size[j]), float(g_room[j]), int(g_count[j])
    pieces = [(first, full, room - each * v, count + each), (first + full, 1 if rest else 0, room - rest * v, count + rest)]
    taken = [(p[0], p[1], q, count) for p, q in zip(pieces, (each, rest)) if p[1] > 0 and q > 0]
    pieces.append((first + full + (1 if rest else 0), size - full - (1 if rest else 0), room, count))
    pieces = [p for p in pieces if p[1] > 0]
    if taken:
        t = np.array(taken, dtype=np.int64)
        parts.append((t[:, 0], t[:, 1], t[:, 2], t[:, 3]))
    ins = np.array(pieces, dtype=np.float64)
    return (
        np.concatenate([g_first[:j], ins[:, 0].astype(np.int64), g_first[j + 1 :]]),
        np.concatenate([g_size[:j], ins[:, 1].astype(np.int64), g_size[j + 1 :]]),
        np.concatenate([g_room[:j], ins[:, 2], g_room[j + 1 :]]),
        np.concatenate([g_count[:j], ins[:, 3].astype(np.int64), g_count[j + 1 :]]),
    )


def _close(
    g_first: IntArray, g_size: IntArray, g_count: IntArray, which: NDArray[np.bool_],
    parts: list[Parts],
) -> None:
    """Record the final counts of the groups ``which`` (a part of no samples that carries them)."""
    parts.append((g_first[which], g_size[which], np.zeros(int(which.sum()), np.int64), g_count[which]))


def _runs_and_starts(parts: list[Parts], batches: int) -> tuple[Parts, IntArray]:
    """The parts that place samples (in sample order) and the batch starts (from the closing
    parts, which carry every batch's final count)."""
    first = np.concatenate([p[0] for p in parts])
    size = np.concatenate([p[1] for p in parts])
    each = np.concatenate([p[2] for p in parts])
    before = np.concatenate([p[3] for p in parts])
    closing = each == 0
    runs = (first[~closing], size[~closing], each[~closing], before[~closing])
    c_first, c_size, c_before = first[closing], size[closing], before[closing]
    del first, size, each, before, closing
    # each batch's final count written at the next batch's place, then summed in place: the
    # starts in one per-batch array, the closing groups expanded a chunk of batches at a time
    starts = np.zeros(batches, np.int64)
    ends = np.cumsum(c_size)
    g, done = 0, 0
    while g < c_size.size:
        h = max(g + 1, int(np.searchsorted(ends, done + PLACE_CHUNK, side="right")))
        at = _expand(c_first[g:h], c_size[g:h])
        at += 1
        count = np.repeat(c_before[g:h], c_size[g:h])
        inside = at < batches
        starts[at[inside]] = count[inside]
        g, done = h, int(ends[h - 1])
    np.cumsum(starts, out=starts)
    return runs, starts


#: samples :func:`placements` places at a time (whole parts): its buffers stay this small
PLACE_CHUNK = 1 << 18


def placements(parts: Parts, starts: IntArray, n: int) -> Iterator[tuple[int, int, IntArray]]:
    """``(a, b, dest)``: where the samples ``a .. b - 1`` (in the descending order planned) go
    in batch order, whole parts of about :data:`PLACE_CHUNK` samples at a time."""
    first, size, each, before = parts
    load = size * each
    ends = np.cumsum(load)
    p, a = 0, 0
    while p < load.size:
        q = max(p + 1, int(np.searchsorted(ends, a + PLACE_CHUNK, side="right")))
        b = int(ends[q - 1])
        yield a, b, _place(first[p:q], size[p:q], each[p:q], before[p:q], starts, a, b)
        p, a = q, b


def _place(first: IntArray, size: IntArray, each: IntArray, before: IntArray, starts: IntArray, a: int, b: int) -> IntArray:
    """Batch-order places of the samples ``a .. b - 1``, placed by the given parts."""
    # one run per batch of a part: ``each`` samples into batch k after the ``before`` placed there
    batch = _expand(first, size)
    run_each = np.repeat(each, size)
    base = starts[batch]
    del batch
    base += np.repeat(before, size)
    # sample s of a run that begins at sample s0 (both counted from a) goes to base + (s - s0)
    s0 = np.cumsum(run_each)
    s0 -= run_each
    base -= s0
    del s0
    dest = np.repeat(base, run_each)
    del base, run_each
    dest += np.arange(b - a, dtype=np.int64)
    return dest


def _expand(first: IntArray, size: IntArray) -> IntArray:
    """The batches ``first[i] .. first[i] + size[i] - 1`` of every group, concatenated."""
    total = int(size.sum())
    offs = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(size) - size, size)
    return np.repeat(first, size) + offs
