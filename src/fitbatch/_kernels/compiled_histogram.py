"""numba-compiled loops of the histogram path: the patterns' epoch layout (imported by
:mod:`fitbatch._kernels.pattern_layout` only once :mod:`fitbatch._kernels.jit` found numba).

Each loop has a numpy twin in :mod:`fitbatch._kernels.pattern_layout` with the same result:
:func:`group_by_level` is a stable counting sort (a stable sort has one result),
:func:`shuffle_blocks` is numpy's ``Generator.shuffle`` of each block, draw for draw (its
Fisher-Yates loop and bounded draws, fed with the generator's raw outputs), and
:func:`lay_out_sequence` writes the batches in the drawn sequence, each place of a length taking
that length's next position (the numpy twin sorts the places by length, stably).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def group_by_level(level: np.ndarray, top: int, at: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[at[top - level[i]]++] = i`` for every position ``i`` in order: the positions grouped
    by descending level, in index order within a level (``at``: where each level starts, in
    descending order; advanced in place)."""
    for i in range(level.shape[0]):
        d = top - np.int64(level[i])
        p = at[d]
        at[d] = p + 1
        out[p] = i


@njit(cache=True, nogil=True)
def shuffle_blocks(x: np.ndarray, bounds: np.ndarray, words: np.ndarray, steps: np.ndarray) -> None:  # pragma: no cover - compiled
    """``Generator.shuffle(x[bounds[d]:bounds[d + 1]])`` for every block ``d`` in turn, in place,
    for a PCG64 generator whose state ``words`` holds: its 128-bit state and increment as
    (state high, state low, increment high, increment low) 64-bit words, then whether it kept a
    32-bit half of its last output and that half (updated in place: the generator's state after
    the shuffle, as numpy's would be).

    numpy's shuffle swaps ``x[i]`` with ``x[j]`` for ``i`` from the block's last position down to
    1, ``j`` uniform in ``[0, i]``: a 32-bit draw masked to the bits of ``i``, drawn again while
    over ``i`` (32-bit draws are the halves of the 64-bit outputs, low first, the high one kept
    for the next draw). The draws of up to ``len(steps)`` steps are found first without a branch
    on their values (a rejected draw leaves ``i`` as it is; the mask narrows as ``i`` crosses a
    power of two), then their swaps are made.
    """
    hi, lo, inc_hi, inc_lo = words[0], words[1], words[2], words[3]
    kept, half32 = words[4] != 0, words[5]
    low32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
    cap = steps.shape[0]
    for d in range(bounds.shape[0] - 1):
        a = bounds[d]
        i = bounds[d + 1] - a - 1
        # Invariant: x[a + i + 1 : bounds[d + 1]] hold their final values (numpy's order of swaps).
        while i > 0:
            first, stop = i, max(i - cap, 0)
            m = np.uint64(i)
            m |= m >> np.uint64(1)
            m |= m >> np.uint64(2)
            m |= m >> np.uint64(4)
            m |= m >> np.uint64(8)
            m |= m >> np.uint64(16)
            mask = np.int64(m)
            half = mask >> 1
            while i > stop:
                if kept:  # (alternates: predicted)
                    draw = half32
                else:
                    hi, lo, word = _pcg64_next(hi, lo, inc_hi, inc_lo)
                    draw, half32 = word & low32, word >> s32
                kept = not kept
                v = np.int64(draw) & mask
                steps[first - i] = v
                i -= np.int64(v <= i)
                narrow = np.int64(i <= half)
                mask >>= narrow
                half >>= narrow
            for k in range(first - i):
                s = a + first - k
                j = a + steps[k]
                t = x[s]
                x[s] = x[j]
                x[j] = t
    words[0], words[1] = hi, lo
    words[4], words[5] = np.uint64(1 if kept else 0), half32


@njit(cache=True, nogil=True)
def _pcg64_next(hi: np.uint64, lo: np.uint64, inc_hi: np.uint64, inc_lo: np.uint64) -> tuple[np.uint64, np.uint64, np.uint64]:  # pragma: no cover - compiled
    """numpy's PCG64 (XSL-RR) one step on: the state ``(hi, lo)`` becomes ``state * MULTIPLIER +
    increment`` (mod ``2**128``), and the output is its words xor-ed, rotated right by its top 6
    bits. Returns the new state's words and the output."""
    mul_hi, mul_lo = np.uint64(2549297995355413924), np.uint64(4865540595714422341)
    s58, s63, s64 = np.uint64(58), np.uint64(63), np.uint64(64)
    new_lo = lo * mul_lo
    new_hi = _mul_high(lo, mul_lo) + lo * mul_hi + hi * mul_lo
    lo = new_lo + inc_lo
    hi = new_hi + inc_hi + np.uint64(lo < inc_lo)
    x = hi ^ lo
    r = hi >> s58
    return hi, lo, (x >> r) | (x << ((s64 - r) & s63))


@njit(cache=True, nogil=True)
def _mul_high(a: np.uint64, b: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """The high 64 bits of ``a * b`` (128 bits) from 32-bit halves (numba has no 128-bit
    integers; LLVM makes it one multiply once inlined)."""
    low32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
    a0, a1, b0, b1 = a & low32, a >> s32, b & low32, b >> s32
    p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
    mid = (p00 >> s32) + (p01 & low32) + (p10 & low32)
    return a1 * b1 + (p01 >> s32) + (p10 >> s32) + (mid >> s32)


@njit(cache=True, nogil=True)
def lay_out_sequence(  # pragma: no cover - compiled
    labels: np.ndarray, by_length: np.ndarray, first_item: np.ndarray, item: np.ndarray, at: np.ndarray,
    order: np.ndarray, offsets: np.ndarray,
) -> None:
    """The batches in the sequence ``labels`` (one pattern per batch), written into ``order``:
    pattern ``p`` holds the lengths ``item[first_item[p]:first_item[p + 1]]``, and each place of
    length ``v`` takes the next position of that length, ``by_length[at[v]]`` (``at`` advanced in
    place). ``offsets`` (of ``len(labels) + 1``) receives where each batch starts, and the end.

    One step per place, without a branch where a batch ends (the batches hold one, two or more
    places in a drawn order: a loop per batch would mispredict its end about once a batch, and
    so would a conditional move that LLVM turns into a branch: the selects are arithmetic). The
    next batch's first place and end are read a batch ahead, off the chain from one place to
    the next.
    """
    m, n = labels.shape[0], order.shape[0]
    offsets[0] = 0
    if m == 0:
        return
    t, start = 0, 0
    p = labels[0]
    c, end = first_item[p], first_item[p + 1]
    q = labels[min(1, m - 1)]
    next_c, next_end = first_item[q], first_item[q + 1]
    # Invariant: order[:o] holds the batches before t and the places of batch t before c;
    # offsets[:t + 1] their starts; at[v] is the next position of length v; next_c and
    # next_end are batch t + 1's (the last batch's past the end).
    for o in range(n):
        v = item[c]
        k = at[v]
        order[o] = by_length[k]
        at[v] = k + 1
        c += 1
        done = np.int64(c == end)
        stay = 1 - done
        t += done
        start = stay * start + done * (o + 1)
        offsets[t] = start
        c = stay * c + done * next_c
        end = stay * end + done * next_end
        q = labels[min(t + 1, m - 1)]
        ahead_c, ahead_end = first_item[q], first_item[q + 1]
        next_c = stay * next_c + done * ahead_c
        next_end = stay * next_end + done * ahead_end


@njit(cache=True, nogil=True)
def count_levels(level: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[v] += 1`` for every ``v`` in ``level`` (``np.bincount`` without its int64 copy of
    the levels)."""
    for i in range(level.shape[0]):
        out[level[i]] += 1


@njit(cache=True, nogil=True)
def gather_kinds(kind: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[f, b] = values[f, kind[b]]`` for every batch ``b``: the per-batch arrays of batches
    of a few kinds, in one pass."""
    fields = values.shape[0]
    for b in range(kind.shape[0]):
        k = kind[b]
        for f in range(fields):
            out[f, b] = values[f, k]
