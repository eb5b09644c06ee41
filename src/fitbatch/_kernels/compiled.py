"""numba-compiled greedy loops and layout sorts (imported by :mod:`fitbatch._kernels.jit` only when numba is installed).

Each loop is the in-order greedy of :func:`fitbatch._kernels.batches.greedy_starts` (or the prefix-sum
search of :func:`fitbatch._kernels.batches.sum_starts`) written as the plain per-sample loop, with
the same floating-point operations in the same order, so the batches are the same (one
exception: fractional sizes under a sum-based cost, where numpy's lock-step path, for many
batches, adds prefix sums; a batch can then end one sample apart where a running sum lands
within a rounding of the budget, both within the budget). numpy's
vectorised kernels pay a few numpy calls per chunk or a Python step per batch; here a sample costs
a few nanoseconds, which matters for short batches read from a stream in small chunks.
:func:`first_fit_in_place` is the first-fit loop of :func:`fitbatch._kernels.packing.first_fit_laid` (the
same tree, subtractions and comparisons), and :func:`shuffle_by_level` / :func:`shuffle_in_pools`
are the stable sorts of the shuffled layouts as counting sorts (a stable sort has one result).
"""

from __future__ import annotations

import numpy as np
from numba import njit

SUM, PADDED, POLYNOMIAL = 0, 1, 2


@njit(cache=True, nogil=True)
def _cost(kind: int, count: float, mx: float, sm: float, p: np.ndarray) -> float:  # pragma: no cover - compiled
    if kind == SUM:
        return sm
    if kind == PADDED:
        return count * mx
    # PaddedPolynomial.evaluate: fixed + count * (linear + L * (per_token + quadratic * L))
    return p[0] + count * (p[1] + mx * (p[2] + p[3] * mx))


@njit(cache=True, nogil=True)
def greedy(  # pragma: no cover - compiled; checked against the numpy kernel in tests/test_jit.py
    sizes: np.ndarray,
    budget: float,
    kind: int,
    params: np.ndarray,
    cap: float,
    force: np.ndarray,
    use_force: bool,
    count: float,
    mx: float,
    sm: float,
    order: np.ndarray,
    use_order: bool,
) -> tuple[np.ndarray, float, float, float]:
    """Starts of the greedy in order; (count, max, sum) is the batch open before position 0.
    With ``use_order`` position ``t`` holds ``sizes[order[t]]`` (read in place, not gathered)."""
    n = sizes.shape[0]
    # batch starts, grown as needed (batches hold many samples): room for a whole chunk of
    # positions is made before the chunk, so the scan itself never checks
    starts = np.empty(16 + (n >> 6), dtype=np.int64)
    k = 0
    for c0 in range(0, n, 4096):
        c1 = min(n, c0 + 4096)
        if k + (c1 - c0) > starts.shape[0]:
            grown = np.empty(max(2 * starts.shape[0], k + (c1 - c0)), dtype=np.int64)
            grown[:k] = starts[:k]
            starts = grown
        for t in range(c0, c1):
            x = sizes[order[t]] if use_order else sizes[t]
            new_count = count + 1.0
            new_max = mx if mx >= x else x
            if mx != mx or x != x:  # NaN propagates as in np.maximum
                new_max = x + mx
            new_sum = sm + x
            start = _cost(kind, new_count, new_max, new_sum, params) > budget or new_count > cap
            if use_force and force[t]:
                start = True
            if count == 0.0:
                start = True  # an empty batch takes its first sample
            if start:
                starts[k] = t
                k += 1
                count, mx, sm = 1.0, x, x
            else:
                count, mx, sm = new_count, new_max, new_sum
    return starts[:k].copy(), count, mx, sm


@njit(cache=True, nogil=True)
def greedy_rows(  # pragma: no cover - compiled; checked against the numpy kernel in tests/test_limits.py
    sizes: np.ndarray,
    budget: float,
    kinds: np.ndarray,
    params: np.ndarray,
    budgets: np.ndarray,
    cap: float,
    force: np.ndarray,
    use_force: bool,
    count: float,
    mx: np.ndarray,
    sm: np.ndarray,
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """:func:`greedy` over ``(n, D)`` rows under several limits (:class:`fitbatch.costs.Limits`):
    a batch's cost is its largest column cost / that column's budget."""
    n, d = sizes.shape
    starts = np.empty(n, dtype=np.int64)
    mx, sm = mx.copy(), sm.copy()
    new_max, new_sum = np.empty(d), np.empty(d)
    k = 0
    for t in range(n):
        new_count = count + 1.0
        fill = 0.0
        for j in range(d):
            x = sizes[t, j]
            new_max[j] = mx[j] if mx[j] >= x else x
            new_sum[j] = sm[j] + x
            f = _cost(kinds[j], new_count, new_max[j], new_sum[j], params[j]) / budgets[j]
            if f > fill:
                fill = f
        start = fill > budget or new_count > cap
        if (use_force and force[t]) or count == 0.0:
            start = True  # a segment start, or an empty batch taking its first sample
        if start:
            starts[k] = t
            k += 1
            count = 1.0
            mx[:] = sizes[t]
            sm[:] = sizes[t]
        else:
            count = new_count
            mx[:] = new_max
            sm[:] = new_sum
    return starts[:k].copy(), count, mx, sm


@njit(cache=True, nogil=True)
def prefix_sum_starts(sizes: np.ndarray, budget: float, room: int) -> np.ndarray:  # pragma: no cover - compiled
    """Batch starts where the batch at i ends after the last j with csum[j] - csum[i] <= budget.

    ``csum`` is the running sum ``[0, s0, s0 + s1, ...]`` added in order, as ``np.cumsum`` does.
    """
    n = sizes.shape[0]
    csum = np.empty(n + 1, dtype=np.float64)
    csum[0] = 0.0
    acc = 0.0
    for i in range(n):
        acc += sizes[i]
        csum[i + 1] = acc
    starts = np.empty(n, dtype=np.int64)
    k = 0
    i = 0
    while i < n:
        starts[k] = i
        k += 1
        base = csum[i]
        stop = i + room if room < n - i else n
        j = i + 1
        while j < stop and csum[j + 1] - base <= budget:
            j += 1
        i = j
    return starts[:k].copy()


@njit(cache=True, nogil=True)
def run_totals(  # pragma: no cover - compiled; checked against numpy in tests/test_jit.py
    sizes: np.ndarray,
    cuts: np.ndarray,
    kind: int,
    params: np.ndarray,
    budget: float,
    emitted: int,
    real: float,
    padded: float,
    over: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Running totals after each batch ``sizes[cuts[b]:cuts[b + 1]]``, from the given totals."""
    m = cuts.shape[0] - 1
    out_e = np.empty(m, dtype=np.int64)
    out_r = np.empty(m, dtype=np.float64)
    out_p = np.empty(m, dtype=np.float64)
    out_o = np.empty(m, dtype=np.int64)
    for b in range(m):
        a, z = cuts[b], cuts[b + 1]
        s = 0.0
        top = sizes[a]
        for i in range(a, z):
            x = sizes[i]
            s += x
            if x > top:
                top = x
        count = z - a
        emitted += count
        real += s
        padded += count * top
        if _cost(kind, float(count), top, s, params) > budget:
            over += 1
        out_e[b], out_r[b], out_p[b], out_o[b] = emitted, real, padded, over
    return out_e, out_r, out_p, out_o


@njit(cache=True, nogil=True)
def batch_reduce(  # pragma: no cover - compiled; checked against numpy in tests/test_jit.py
    sizes: np.ndarray, order: np.ndarray, use_order: bool, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Max and sum of each batch ``sizes[order[offsets[b]:offsets[b + 1]]]`` (of
    ``sizes[offsets[b]:offsets[b + 1]]`` without ``use_order``), read in place, no gather.

    The sizes must be whole numbers. The flag says whether every sum is exact (below 2**53)
    and no batch is empty or holds -0.0: then numpy's ``reduceat``, which adds pairwise, makes
    the same floats; else the caller asks numpy.
    """
    m = offsets.shape[0] - 1
    mx = np.empty(m, dtype=np.float64)
    sm = np.empty(m, dtype=np.float64)
    for b in range(m):
        a, z = offsets[b], offsets[b + 1]
        if z <= a:
            return mx, sm, False
        top = sizes[order[a]] if use_order else sizes[a]
        s = 0.0
        for i in range(a, z):
            x = sizes[order[i]] if use_order else sizes[i]
            if x == 0.0 and np.signbit(x):
                return mx, sm, False
            s += x
            if x > top:
                top = x
        if not s < 9007199254740992.0:  # 2**53: above it a sum may round
            return mx, sm, False
        mx[b] = top
        sm[b] = s
    return mx, sm, True


@njit(cache=True, nogil=True)
def all_integral(sizes: np.ndarray) -> bool:  # pragma: no cover - compiled; checked in tests/test_jit.py
    """Whether ``sizes == floor(sizes)`` everywhere, as numpy compares (NaN is not whole)."""
    for x in sizes:
        if not x == np.floor(x):
            return False
    return True


@njit(cache=True, nogil=True)
def shuffle_by_level(  # pragma: no cover - compiled; checked against numpy's sorts in tests/test_jit.py
    draws: np.ndarray, level: np.ndarray, top: int
) -> np.ndarray:
    """Positions stably sorted by their 16-bit random draw (a shuffle), then stably by
    descending ``level`` (``top - level``, in ``[0, top]``, ``top < 2**16``; under ``2**32`` positions).

    That is one sort by (``top - level``, draw, position): see :func:`_by_level_compact`. One
    array of n int64 in all, and at most one byte a position more while it runs.
    """
    return _by_level_compact(draws, level, top, draws[:0])


@njit(cache=True, nogil=True)
def _by_level_compact(  # pragma: no cover - compiled
    draws: np.ndarray, level: np.ndarray, top: int, laid_keys: np.ndarray
) -> np.ndarray:
    """:func:`shuffle_by_level`; ``laid_keys`` (of n, else empty) receives each position's level.

    A counting sort by level (positions in order, so ties stay by position) writes each position
    and its draw side by side (the 32-bit positions in the int64 output's first half, the draws
    in its second): the draws are read in sequence, not through the positions. Each level of at
    most n / :data:`LEVEL_WORDS_FROM` positions (or 65,536) is then sorted by
    ``draw << 32 | position`` in a buffer of its own (two byte passes, in cache), read and
    written back in sequence; a larger level is sorted in place afterwards (two byte passes of
    the positions by the draw's bytes, the second half as scratch), when the draws written beside
    the positions are needed no more. The positions are widened in place at the end.
    """
    n = draws.shape[0]
    out = np.empty(n, dtype=np.int64)
    half = out.view(np.uint32)
    a, b = half[:n], half[n:]
    beside = b.view(np.uint16)[:n]  # each position's draw, beside it (b's first half)
    bounds = _level_bounds(level, top)  # level d holds [bounds[d], bounds[d + 1]) (descending levels)
    at = bounds[:-1].copy()
    for i in range(n):
        d = top - level[i]
        p = at[d]
        at[d] = p + 1
        a[p] = i
        beside[p] = draws[i]
    limit = max(1 << 16, n // LEVEL_WORDS_FROM)  # the largest level sorted in a buffer
    widest = 0
    for d in range(top + 1):
        m = bounds[d + 1] - bounds[d]
        if widest < m <= limit:
            widest = m
    words = np.empty(widest, dtype=np.uint64)
    spare = np.empty(widest, dtype=np.uint64)
    count = np.empty(256, dtype=np.int64)
    shift = np.uint64(32)
    low = np.uint64(0xFFFFFFFF)
    for d in range(top + 1):
        s, e = bounds[d], bounds[d + 1]
        if 1 < e - s <= limit:
            for j in range(s, e):
                words[j - s] = (np.uint64(beside[j]) << shift) | np.uint64(a[j])
            _byte_pass(words, spare, 0, e - s, shift, count)
            _byte_pass(spare, words, 0, e - s, np.uint64(40), count)
            for j in range(s, e):
                a[j] = np.uint32(words[j - s] & low)
    for d in range(top + 1):  # (the draws beside the positions are read no more)
        s, e = bounds[d], bounds[d + 1]
        if e - s > limit:
            _byte_pass16(a, b, s, e, draws, 0, False, count)
            _byte_pass16(b, a, s, e, draws, 8, False, count)
    if laid_keys.shape[0] == n:
        for d in range(top + 1):
            for j in range(bounds[d], bounds[d + 1]):
                laid_keys[j] = top - d
    _widen(out, half, n)
    return out


#: :func:`_by_level_compact` sorts a level in a buffer of its own (16 B a position) when it
#: holds at most this fraction of the positions (or 65,536): at most 1 B a position more
LEVEL_WORDS_FROM = 16


@njit(cache=True, nogil=True)
def shuffle_in_pools(  # pragma: no cover - compiled; checked against numpy's sorts in tests/test_jit.py
    draws: np.ndarray, keys: np.ndarray, pool: int, laid_keys: np.ndarray
) -> np.ndarray:
    """Positions stably sorted by their 16-bit random draw (a shuffle), cut into pools of
    ``pool``, each pool stably sorted by descending 16-bit ``keys`` (under ``2**32`` positions);
    ``laid_keys`` (of n, else empty) receives the keys in that order.

    The shuffle is a two-pass radix sort of the positions (in order, so ties stay by position)
    by the draw's low byte, then its high byte; each pool then takes two passes by the bytes of
    ``65535 - key``. The 32-bit positions live in the int64 output itself (its two halves),
    widened in place at the end: one array of n int64 in all. One pool (``pool >= n``) is the
    sort by levels of :func:`_by_level_compact` (the same order: keys, then draws, then positions).
    """
    n = draws.shape[0]
    if pool >= n:  # one pool: the sort by (65535 - key, draw, position) of the levels
        return _by_level_compact(draws, keys, 65535, laid_keys)
    out = np.empty(n, dtype=np.int64)
    half = out.view(np.uint32)
    a, b = half[:n], half[n:]
    for i in range(n):
        b[i] = i
    count = np.empty(256, dtype=np.int64)
    _byte_pass16(b, a, 0, n, draws, 0, False, count)
    _byte_pass16(a, b, 0, n, draws, 8, False, count)
    for s in range(0, n, pool):
        e = min(n, s + pool)
        _byte_pass16(b, a, s, e, keys, 0, True, count)
        _byte_pass16(a, b, s, e, keys, 8, True, count)
    for j in range(n):
        a[j] = b[j]
    if laid_keys.shape[0] == n:
        for j in range(n):
            laid_keys[j] = keys[a[j]]
    _widen(out, half, n)
    return out


@njit(cache=True, nogil=True)
def _level_bounds(level: np.ndarray, top: int) -> np.ndarray:  # pragma: no cover - compiled
    """Where each level's positions start in the descending order of levels (``top - level``),
    and the end: ``top + 2`` bounds."""
    bounds = np.zeros(top + 2, dtype=np.int64)
    for i in range(level.shape[0]):
        bounds[top - level[i] + 1] += 1
    for d in range(top + 1):
        bounds[d + 1] += bounds[d]
    return bounds


@njit(cache=True, nogil=True)
def _starts(count: np.ndarray, s: int) -> None:  # pragma: no cover - compiled
    """A counting sort's 256 bucket counts turned, in place, into where each bucket starts from ``s``."""
    acc = s
    for k in range(256):
        c = count[k]
        count[k] = acc
        acc += c


@njit(cache=True, nogil=True)
def _byte_pass16(  # pragma: no cover - compiled
    src: np.ndarray, dst: np.ndarray, s: int, e: int, values: np.ndarray, shift: int, descending: bool,
    count: np.ndarray,
) -> None:
    """Positions ``src[s:e]`` stably sorted by the byte at ``shift`` of their 16-bit value (of
    ``65535 - value`` when ``descending``) into ``dst[s:e]``: one pass of a radix sort."""
    flip = 65535 if descending else 0
    sign = -1 if descending else 1
    count[:] = 0
    for j in range(s, e):
        count[((flip + sign * np.int64(values[src[j]])) >> shift) & 255] += 1
    _starts(count, s)
    for j in range(s, e):
        i = src[j]
        q = ((flip + sign * np.int64(values[i])) >> shift) & 255
        p = count[q]
        count[q] = p + 1
        dst[p] = i


@njit(cache=True, nogil=True)
def _widen(out: np.ndarray, half: np.ndarray, n: int) -> None:  # pragma: no cover - compiled
    """``out[j] = half[j]`` for every j, in place (``half`` views ``out``): from the end, so that
    writing ``out[j]`` (``half[2j:2j + 2]``) never overwrites an unread ``half[i]``, ``i < j``."""
    for j in range(n - 1, -1, -1):
        out[j] = np.int64(half[j])


@njit(cache=True, nogil=True)
def shuffle_by_level_wide(  # pragma: no cover - compiled; checked against numpy's sorts in tests/test_jit.py
    draws: np.ndarray, level: np.ndarray, top: int
) -> np.ndarray:
    """:func:`shuffle_by_level` with two arrays of n uint64 (draw and position packed, read in
    sequence): faster, 8 B a position more at the peak; for sets under ``jit.COMPACT_AT``.

    Positions stably sorted by their 16-bit random draw (a shuffle), then stably by
    descending ``level`` (``top - level``, in ``[0, top]``, ``top < 2**16``; under ``2**32`` positions).

    That is one sort by (``top - level``, draw, position): a counting sort by level (positions
    in order, so ties stay by position), then inside each level a two-pass radix sort of
    ``draw * 2**32 + position`` by the draw's low byte and its high byte (both stable).
    """
    n = draws.shape[0]
    bounds = _level_bounds(level, top)  # level d holds [bounds[d], bounds[d + 1]) (descending levels)
    at = bounds[:-1].copy()
    a = np.empty(n, dtype=np.uint64)
    shift = np.uint64(32)
    for i in range(n):
        d = top - level[i]
        p = at[d]
        at[d] = p + 1
        a[p] = (np.uint64(draws[i]) << shift) | np.uint64(i)
    b = np.empty(n, dtype=np.uint64)
    count = np.empty(256, dtype=np.int64)
    for d in range(top + 1):
        s, e = bounds[d], bounds[d + 1]
        if e - s > 1:
            _byte_pass(a, b, s, e, np.uint64(32), count)
            _byte_pass(b, a, s, e, np.uint64(40), count)
    out = b.view(np.int64)
    positions = np.uint64(0xFFFFFFFF)
    for j in range(n):
        out[j] = np.int64(a[j] & positions)
    return out


@njit(cache=True, nogil=True)
def shuffle_in_pools_wide(  # pragma: no cover - compiled; checked against numpy's sorts in tests/test_jit.py
    draws: np.ndarray, keys: np.ndarray, pool: int, laid_keys: np.ndarray
) -> np.ndarray:
    """:func:`shuffle_in_pools` with two arrays of n uint64 (key, draw and position packed in
    one word, ``(65535 - key) << 48 | draw << 32 | position``, read in sequence): faster, 8 B a
    position more at the peak; for sets under ``jit.COMPACT_AT``.

    The shuffle is a counting sort by the draw's high byte (positions in order, so ties stay
    by position), then a pass by its low byte inside each of those runs; each pool then takes
    two passes by the bytes of ``65535 - key``, cache-sized like the runs. The keys and draws
    are read once, in order, as the words are made: no pass reads them through the positions.
    """
    n = draws.shape[0]
    bounds = np.zeros(257, dtype=np.int64)
    for i in range(n):
        bounds[(draws[i] >> 8) + 1] += 1
    for d in range(256):
        bounds[d + 1] += bounds[d]
    at = bounds[:-1].copy()
    a = np.empty(n, dtype=np.uint64)
    for i in range(n):
        d = draws[i] >> 8
        p = at[d]
        at[d] = p + 1
        a[p] = (np.uint64(65535 - keys[i]) << _KEY_AT) | (np.uint64(draws[i]) << np.uint64(32)) | np.uint64(i)
    b = np.empty(n, dtype=np.uint64)
    count = np.empty(256, dtype=np.int64)
    for d in range(256):  # the draw's low byte, inside each run of its high byte
        if bounds[d + 1] - bounds[d] > 1:
            _byte_pass(a, b, bounds[d], bounds[d + 1], np.uint64(32), count)
        else:
            for j in range(bounds[d], bounds[d + 1]):
                b[j] = a[j]
    # pool by pool, two passes by the bytes of 65535 - key; the second writes the positions
    # (and the laid keys) as it places them, into b's memory (b[s:e] is read by the first only)
    out = b.view(np.int64)
    for s in range(0, n, pool):
        e = min(n, s + pool)
        _byte_pass(b, a, s, e, _KEY_AT, count)
        _byte_pass_as(a, out, s, e, _KEY_AT + np.uint64(8), count, _POSITIONS, laid_keys)
    return out


@njit(cache=True, nogil=True)
def _byte_pass(  # pragma: no cover - compiled
    src: np.ndarray, dst: np.ndarray, s: int, e: int, shift: np.uint64, count: np.ndarray
) -> None:
    """``src[s:e]`` stably sorted by the byte at ``shift`` into ``dst[s:e]`` (a counting sort)."""
    _byte_pass_as(src, dst, s, e, shift, count, _COPY, dst.view(np.uint16))


_COPY, _POSITIONS = 0, 1
#: where :func:`shuffle_in_pools_wide`'s words hold ``65535 - key`` (their top 16 bits)
_KEY_AT = np.uint64(48)


@njit(cache=True, nogil=True)
def _byte_pass_as(  # pragma: no cover - compiled
    src: np.ndarray, dst: np.ndarray, s: int, e: int, shift: np.uint64, count: np.ndarray, what: int,
    laid_keys: np.ndarray,
) -> None:
    """One pass of a radix sort: ``src[s:e]``'s words (their low 32 bits a position) stably
    sorted by the byte at ``shift``, each written to its place in ``dst`` as ``what`` says:

    - ``_COPY``: the word itself;
    - ``_POSITIONS``: the position (``dst`` int64), and its key ``65535 - (word >> 48)`` (see
      :func:`shuffle_in_pools_wide`) into ``laid_keys`` when that is as long as ``dst``.
    """
    byte = np.uint64(255)
    positions = np.uint64(0xFFFFFFFF)
    lay = laid_keys.shape[0] == dst.shape[0]
    count[:] = 0
    for j in range(s, e):
        count[(src[j] >> shift) & byte] += 1
    _starts(count, s)
    for j in range(s, e):
        c = src[j]
        q = (c >> shift) & byte
        p = count[q]
        count[q] = p + 1
        if what == _COPY:
            dst[p] = c
        else:
            dst[p] = c & positions
            if lay:
                laid_keys[p] = 65535 - (c >> _KEY_AT)


@njit(cache=True, nogil=True)
def walk_runs(  # pragma: no cover - compiled; checked against the Python walk in tests/test_jit.py
    cuts: np.ndarray, run_end: np.ndarray, is_seg: np.ndarray, seg_end: np.ndarray, tab: np.ndarray, cut_tab: np.ndarray
) -> np.ndarray:
    """The walk of :func:`fitbatch._kernels.batches._walk_table` over the runs of one level
    (the same integer steps): the batch starts.

    Two passes: the first counts the starts (whole runs at a time), so the second fills one
    array of exactly that many (no grown buffer, nor a trimmed copy, beside it)."""
    k = 0
    i = 0
    for r in range(cuts.shape[0]):
        a, b, end, length, c = cuts[r], run_end[r], seg_end[r], tab[r], cut_tab[r]
        if is_seg[r]:
            i = a
        if i >= b:
            continue
        stop = min(b, end - length)
        if i < stop:
            steps = (stop - i + c - 1) // c
            k += steps
            i += c * steps
        if i < b:
            k += 1
            i = end
    out = np.empty(k, dtype=np.int64)
    k = 0
    i = 0
    for r in range(cuts.shape[0]):
        a, b, end, length, c = cuts[r], run_end[r], seg_end[r], tab[r], cut_tab[r]
        if is_seg[r]:
            i = a
        if i >= b:
            continue
        stop = min(b, end - length)
        while i < stop:
            out[k] = i
            k += 1
            i += c
        if i < b:
            out[k] = i
            k += 1
            i = end
    return out


@njit(cache=True, nogil=True)
def _grown(room: np.ndarray, count: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """The room tree of :func:`_first_fit_segment` with twice the leaves (the new ones hold no room)."""
    grown = np.full(4 * size, -np.inf)
    grown[2 * size : 3 * size] = room[size : 2 * size]
    for node in range(2 * size - 1, 0, -1):
        left = grown[2 * node]
        right = grown[2 * node + 1]
        grown[node] = left if left >= right else right
    more = np.zeros(2 * size, dtype=np.int64)
    more[:size] = count
    return grown, more


@njit(cache=True, nogil=True)
def _first_fit_segment(  # pragma: no cover - compiled
    sizes: np.ndarray, a: int, b: int, budget: float, cap: int, batch: np.ndarray
) -> int:
    """The batch of every position of the segment ``[a, b)`` within it (numbered in opening
    order) written to ``batch[: b - a]``, and the segment's number of batches: the loop of
    :func:`fitbatch._kernels.packing._first_fit_batches` over one segment (``cap``: at most ``n``),
    with the same tree of remaining room and the same subtractions and comparisons in the same
    order. ``sizes`` are float64, or whole sizes as uint16 (each read as the float64 it equals)."""
    size = 64  # leaves (batches) in the tree; doubled when they run out
    room = np.full(2 * size, -np.inf)  # a node holds the most room of the open batches under it
    count = np.zeros(size, dtype=np.int64)
    used = 0
    last = np.nan  # the size placed last, and where: the batches before it lack room for it
    leaf = 0
    for i in range(a, b):
        x = np.float64(sizes[i])
        if x == last and room[leaf + size] >= x:
            node = leaf + size
        elif room[1] >= x:
            node = 1
            while node < size:  # the first open batch (leaf) with room for x
                node = 2 * node if room[2 * node] >= x else 2 * node + 1
            leaf = node - size
        else:  # no open batch has room: open the next
            if used == size:
                room, count = _grown(room, count, size)
                size *= 2
            leaf = used
            node = leaf + size
            used += 1
            room[node] = budget
        batch[i - a] = leaf
        last = x
        count[leaf] += 1
        room[node] = room[node] - x if count[leaf] < cap else -np.inf
        node //= 2
        while node >= 1:
            left = room[2 * node]
            right = room[2 * node + 1]
            most = left if left >= right else right
            if room[node] == most:  # the ancestors keep their most room too
                break
            room[node] = most
            node //= 2
    return used


@njit(cache=True, nogil=True)
def first_fit_in_place(  # pragma: no cover - compiled; checked against the Python loop in tests/test_jit.py
    sizes: np.ndarray, positions: np.ndarray, seg_starts: np.ndarray, budget: float, cap: int, batch: np.ndarray
) -> np.ndarray:
    """:func:`fitbatch._kernels.packing.first_fit_laid` compiled: the batches of
    :func:`_first_fit_segment`, segment by segment, with ``sizes`` and ``positions`` rearranged
    in place into batch order; returns the batch starts.

    ``sizes`` are float64, or whole sizes as uint16 (the 16-bit keys laid out by the pool sort:
    2 B a sample where float64 sizes are 8). ``batch`` is a buffer of integers (int32) as long
    as the longest segment, for each of its positions' batch: a segment's batches stay within
    it, so each segment goes through buffers of its length: no array of n.
    """
    n = sizes.shape[0]
    m = seg_starts.shape[0]
    longest = batch.shape[0]
    held_sizes = np.empty_like(sizes[:longest])
    held_positions = np.empty(longest, dtype=np.int64)
    fill = np.empty(longest, dtype=np.int64)  # per batch of the segment: its count, then where its next sample goes
    starts = np.empty(64, dtype=np.int64)  # grown by doubling, trimmed at the end
    total = 0  # batches of the segments done
    for s in range(m):
        a = seg_starts[s]
        b = seg_starts[s + 1] if s + 1 < m else n
        if b <= a:
            continue
        used = _first_fit_segment(sizes, a, b, budget, cap, batch)
        fill[:used] = 0
        for i in range(b - a):
            fill[batch[i]] += 1
        if total + used > starts.shape[0]:
            grown = np.empty(max(2 * starts.shape[0], total + used), dtype=np.int64)
            grown[:total] = starts[:total]
            starts = grown
        at = 0  # batch k of the segment starts after the segment's samples of batches < k
        for k in range(used):
            c = fill[k]
            fill[k] = at
            starts[total + k] = a + at
            at += c
        for i in range(a, b):
            k = batch[i - a]
            to = fill[k]
            fill[k] += 1
            held_sizes[to] = sizes[i]
            held_positions[to] = positions[i]
        sizes[a:b] = held_sizes[: b - a]
        positions[a:b] = held_positions[: b - a]
        total += used
    return starts[:total].copy()
