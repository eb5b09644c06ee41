"""Compiled step partitioning (numba): :mod:`fitbatch.steps._pack`'s deal of one pool and
:mod:`fitbatch.steps._refine`'s passes, the same decisions in the same order as their numpy forms.

Importing this module imports numba; :mod:`fitbatch.steps._compiled` loads it (lazily, in the
background) and decides where it applies. Each loop below mirrors a numpy function, named in its
docstring: the same comparisons on the same float values, ties broken the same way (stable
sorts, first index), running sums taken in the same order. The one exception is the step time
(a sum over micro-steps, pairwise in numpy, in order here): the caller uses :func:`refine` only
where every load is a whole number below ``2**53``, so that each sum is exact in any order.

Cost kinds: 0 sum (``total``), 1 padded (``count * longest``), 2 polynomial
(``fixed + count * (linear + longest * (per_token + quadratic * longest))``, ``params`` in that
order), as :class:`~fitbatch.costs.SumCost`, :class:`~fitbatch.costs.PaddedCost` and
:class:`~fitbatch.costs.PaddedPolynomial` evaluate 1-D sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

# machine code cached next to this module (a fresh install compiles once, ~30 s of CPU on the
# shared 2-core VM; later processes load it in ~0.6 s); no GIL needed while a kernel runs
_OPTS: dict[str, Any] = {"cache": True, "nogil": True}


@njit(**_OPTS)
def _cost(kind: int, p: Any, c: float, lng: float, t: float) -> float:
    if kind == 0:
        return t
    if kind == 1:
        return c * lng
    return p[0] + c * (p[1] + lng * (p[2] + p[3] * lng))


@njit(**_OPTS)
def _stable(key: Any) -> Any:
    """Positions of ``key`` (floats, no NaN) sorted ascending, ties by position: numpy's
    ``argsort(kind="stable")`` (a stable order is unique); insertion for short arrays, else a
    radix sort of unsigned integers in the same order (``-0.0`` counts as ``0.0``, as numpy
    compares them): whole numbers as themselves (``~(-x)`` if none is positive), else the
    floats' bits."""
    n = key.size
    ascending = True  # already in order (a constant key, the heaviest-first bins' steps): as it stands
    for i in range(1, n):
        if key[i] < key[i - 1]:
            ascending = False
            break
    if ascending:
        return np.arange(n)
    if n <= 32:
        out = np.arange(n)
        for i in range(1, n):
            x = out[i]
            kx = key[x]
            j = i - 1
            while j >= 0 and key[out[j]] > kx:
                out[j + 1] = out[j]
                j -= 1
            out[j + 1] = x
        return out
    lo, hi, whole = np.inf, -np.inf, True
    for i in range(n):
        v = key[i]
        lo, hi = min(lo, v), max(hi, v)
        whole = whole and v == np.floor(v)
    k = np.empty(n, dtype=np.uint64)
    if whole and lo >= 0 and hi < 2.0**63:
        for i in range(n):
            k[i] = np.uint64(key[i])
    elif whole and hi <= 0 and lo > -(2.0**63):
        for i in range(n):
            k[i] = ~np.uint64(-key[i])
    else:
        bits = (key + 0.0).view(np.uint64)  # + 0.0: -0.0 becomes 0.0
        sign = np.uint64(1) << np.uint64(63)
        for i in range(n):
            b = bits[i]
            k[i] = ~b if b & sign else b | sign
    return _radix(k)


@njit(**_OPTS)
def _radix(k: Any) -> Any:
    """Positions of the unsigned keys ``k`` sorted ascending, ties by position (stable): a
    least-significant-byte radix sort, skipping the bytes every key shares."""
    n = k.size
    out = np.arange(n)
    if n == 0:
        return out
    every, some = k[0], k[0]  # the bits every key has, and those some key has
    for i in range(1, n):
        every &= k[i]
        some |= k[i]
    differ = every ^ some
    shifts = np.empty(8, dtype=np.int64)  # the bytes where keys differ (a byte they share: the pass keeps the order)
    nv = 0
    for byte in range(8):
        if (differ >> np.uint64(8 * byte)) & np.uint64(255):
            shifts[nv] = 8 * byte
            nv += 1
    count = np.zeros((nv, 257), dtype=np.int64)
    for i in range(n):
        x = k[i]
        for v in range(nv):
            count[v, ((x >> np.uint64(shifts[v])) & np.uint64(255)) + 1] += 1
    keys = k.copy()
    out2 = np.empty(n, dtype=np.int64)
    keys2 = np.empty(n, dtype=np.uint64)
    for v in range(nv):
        row = count[v]
        byte = shifts[v] // 8
        for d in range(256):
            row[d + 1] += row[d]
        shift = np.uint64(8 * byte)
        for i in range(n):
            x = keys[i]
            d = (x >> shift) & np.uint64(255)
            at = row[d]
            row[d] = at + 1
            out2[at] = out[i]
            keys2[at] = x
        out, out2 = out2, out
        keys, keys2 = keys2, keys
    return out


@njit(**_OPTS)
def _smallest(key: Any, k: int) -> Any:
    """``_stable(key)[:k]``: the ``k`` smallest keys' positions in order, ties by position. For
    a few of many, one scan keeps them in a sorted buffer (a key enters only below the last)."""
    n = key.size
    k = min(k, n)
    if k > 32 or k * 8 > n:
        return _stable(key)[:k]
    buf = np.empty(k, dtype=np.int64)
    held = 0
    for i in range(n):
        v = key[i]
        if held < k:
            j = held
            held += 1
        elif v < key[buf[k - 1]]:
            j = k - 1
        else:
            continue
        while j > 0 and key[buf[j - 1]] > v:
            buf[j] = buf[j - 1]
            j -= 1
        buf[j] = i
    return buf


@njit(**_OPTS)
def _then(order: Any, key: Any) -> Any:
    """``order`` stably re-sorted by ``key[order]`` (a lexsort's next, more significant key; float64
    keys: integer ones are passed as floats, one specialisation)."""
    return order[_stable(key[order])]


@njit(**_OPTS)
def argsort(key: Any) -> Any:
    """``np.argsort(key, kind="stable")`` of a 1-D float64 array without NaN (the same positions)."""
    return _stable(key)


@njit(**_OPTS)
def argsort_int(key: Any) -> Any:
    """``np.argsort(key, kind="stable")`` of a 1-D int64 array of values >= 0 (the same positions)."""
    return _radix(key.view(np.uint64))


@njit(**_OPTS)
def _search(a: Any, v: float, lo: int, hi: int) -> int:
    """``np.searchsorted(a, v)`` (left) within ``a[lo:hi]`` (``a`` sorted)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


# --------------------------------------------------------------------------- pack (one pool)

#: a round of the deal takes up to this many bins from the heap, more by a sort of every bin
HEAP_WIDTH = 32


@njit(**_OPTS)
def pack_pool(order: Any, alone: Any, w: Any, c: Any, lg: Any, t: Any, m: int, budget: float, kind: int,
              params: Any, exact_rounds: int) -> Any:
    """:func:`fitbatch.steps._pack.pack` of one row: (load, count, longest, total, bin_of, failed)."""
    nu = w.size
    load, bc, bl, bt = np.zeros(m), np.zeros(m), np.zeros(m), np.zeros(m)
    bin_of = np.full(nu, -1, dtype=np.int64)
    failed = np.zeros(1, dtype=np.bool_)
    for j in range(alone.size):
        u = alone[j]
        if u >= 0:
            load[j], bc[j], bl[j], bt[j] = w[u], c[u], lg[u], t[u]
            bin_of[u] = j
    k = order.size
    n = np.int64(0)  # typed int64 from the start (not a literal: one specialisation of the callees)
    for j in range(k):
        if order[j] >= 0:
            n += 1
    done = np.int64(0)
    rounds = 0
    # the bins in a binary heap by (load, bin): popped lightest first, ties by bin, the order of
    # the stable sort the numpy form takes (a round pops only the bins it deals to)
    hk, hb = np.empty(m), np.empty(m, dtype=np.int64)
    state = np.zeros(2, dtype=np.int64)  # whether the heap holds every bin's load; the last round's width
    # invariant: the first `done` units of order are each in one bin (unless the row failed),
    # every bin's cost is <= budget, load holds each bin's weight and the heap every bin's load
    while done < n and not failed[0]:
        middle = (n - done) // m - exact_rounds
        if rounds >= exact_rounds and middle > 1:
            width = max(1, middle // 4) * m
            if _deal_block(order, done, width, w, c, lg, t, load, bc, bl, bt, bin_of, budget, kind, params):
                done += width
                state[0] = 0
                continue
        done = _deal_round(order, done, n, w, c, lg, t, load, bc, bl, bt, bin_of, failed, budget, kind, params, hk, hb,
                           state)
        rounds += 1
    return load, bc, bl, bt, bin_of, failed[0]


@njit(**_OPTS)
def _heapify(load: Any, hk: Any, hb: Any) -> None:
    """Every bin into the heap ``(hk, hb)`` (its load, its index), ordered by (load, index)."""
    m = load.size
    for b in range(m):
        hk[b], hb[b] = load[b], b
    for pos in range(m // 2 - 1, -1, -1):
        _sift_down(hk, hb, m, pos)


@njit(**_OPTS)
def _sift_down(hk: Any, hb: Any, size: int, pos: int) -> None:
    while True:
        s = 2 * pos + 1
        if s >= size:
            return
        r = s + 1
        if r < size and (hk[r] < hk[s] or hk[r] == hk[s] and hb[r] < hb[s]):
            s = r
        if hk[s] < hk[pos] or hk[s] == hk[pos] and hb[s] < hb[pos]:
            hk[s], hk[pos] = hk[pos], hk[s]
            hb[s], hb[pos] = hb[pos], hb[s]
            pos = s
        else:
            return


@njit(**_OPTS)
def _sift_up(hk: Any, hb: Any, pos: int) -> None:
    while pos > 0:
        p = (pos - 1) // 2
        if hk[pos] < hk[p] or hk[pos] == hk[p] and hb[pos] < hb[p]:
            hk[p], hk[pos] = hk[pos], hk[p]
            hb[p], hb[pos] = hb[pos], hb[p]
            pos = p
        else:
            return


@njit(**_OPTS)
def _deal_round(order: Any, d: int, n: int, w: Any, c: Any, lg: Any, t: Any, load: Any, bc: Any, bl: Any, bt: Any,
                bin_of: Any, failed: Any, budget: float, kind: int, params: Any, hk: Any, hb: Any, state: Any) -> int:
    """``_deal_round_one``: the i-th heaviest next unit to the i-th lightest bin; the new ``done``.

    The bins below the lightest load plus the next unit's weight (at least one; every bin for a
    unit of weight 0), at most the units left, are popped from the heap lightest first, ties by
    bin (the stable sort's first ``width``), and pushed back with their new loads. A round of
    more than ``HEAP_WIDTH`` bins (or one after such a round) counts and sorts them as the numpy
    form does (the same bins in the same order); the heap is built again when next needed.
    ``state``: whether the heap holds every bin's load, the last round's width."""
    m, k = load.size, order.size
    first = w[max(order[min(d, k - 1)], 0)]
    limit = min(m, n - d)
    width = 0
    size = m
    wide = state[1] > HEAP_WIDTH
    if not wide and not state[0]:
        _heapify(load, hk, hb)
        state[0] = 1
    low = (load.min() if wide else hk[0]) + first
    lightest = np.empty(limit, dtype=np.int64)
    while not wide and width < min(limit, HEAP_WIDTH) and (first <= 0 or width == 0 or hk[0] < low):
        lightest[width] = hb[0]
        width += 1
        size -= 1
        if size > 0:
            hk[0], hb[0] = hk[size], hb[size]
            _sift_down(hk, hb, size, 0)
    wide = wide or width == HEAP_WIDTH and limit > HEAP_WIDTH and (first <= 0 or hk[0] < low)
    if wide:  # more to come: count and sort all of them
        state[0] = 0
        below = 0
        if first > 0:
            for b in range(m):
                if load[b] < low:
                    below += 1
            width = min(max(below, 1), n - d)
        else:
            width = limit
        if 0 < below < m and width > 32:  # the bins below `low` are the lightest: sort only them
            some = np.empty(below, dtype=np.int64)
            i = 0
            for b in range(m):
                if load[b] < low:
                    some[i] = b
                    i += 1
            lightest = some[_stable(load[some])][:width]
        else:
            lightest = _smallest(load, width)
    nc, nl, nt = np.empty(width), np.empty(width), np.empty(width)
    ok = np.empty(width, dtype=np.bool_)
    us = np.empty(width, dtype=np.int64)
    for j in range(width):
        u = max(order[min(d + j, k - 1)], 0)
        b = lightest[j]
        us[j] = u
        nc[j], nl[j], nt[j] = bc[b] + c[u], max(bl[b], lg[u]), bt[b] + t[u]
        ok[j] = _cost(kind, params, nc[j], nl[j], nt[j]) <= budget
    bad = 0
    for j in range(width):
        if ok[j]:
            b, u = lightest[j], us[j]
            load[b] += w[u]
            bc[b], bl[b], bt[b] = nc[j], nl[j], nt[j]
            bin_of[u] = b
        else:
            bad += 1
    if bad:
        rest = np.empty(bad, dtype=np.int64)
        i = 0
        for j in range(width):
            if not ok[j]:
                rest[i] = us[j]
                i += 1
        _place_rest(rest, w, c, lg, t, load, bc, bl, bt, bin_of, failed, budget, kind, params)
        state[0], state[1] = 0, width  # any bin may have changed
        return d + width
    state[1] = width
    if wide:
        return d + width
    for j in range(width):
        b = lightest[j]
        hk[size], hb[size] = load[b], b
        _sift_up(hk, hb, size)
        size += 1
    return d + width


@njit(**_OPTS)
def _place_rest(rest: Any, w: Any, c: Any, lg: Any, t: Any, load: Any, bc: Any, bl: Any, bt: Any, bin_of: Any,
                failed: Any, budget: float, kind: int, params: Any) -> None:
    """``_place_rest`` of one row: units that fit no bin fail the row; the others paired with
    the cheapest bins (``_place_roomiest``), then one by one into the lightest bin they fit."""
    m = load.size
    cmin, lmin, tmin = bc.min(), bl.min(), bt.min()
    keep = np.ones(rest.size, dtype=np.bool_)
    for i in range(rest.size):
        u = rest[i]
        if _cost(kind, params, cmin + c[u], max(lmin, lg[u]), tmin + t[u]) > budget:
            keep[i] = False
            failed[0] = True
    units = rest[keep]
    for _ in range(8):  # _place_roomiest's passes
        if units.size == 0:
            break
        cost = np.empty(m)
        for b in range(m):
            cost[b] = _cost(kind, params, bc[b], bl[b], bt[b])
        nu = units.size
        cheapest = _smallest(cost, min(nu, m))  # the i-th unit's bin: the i-th cheapest, i < m
        ok = np.zeros(nu, dtype=np.bool_)
        bs = np.empty(nu, dtype=np.int64)
        nc, nl, nt = np.empty(nu), np.empty(nu), np.empty(nu)
        for i in range(nu):
            u = units[i]
            if i >= m:  # no bin of its own this pass (numpy pairs it with the m-th, then drops it)
                bs[i] = -1
                continue
            b = cheapest[i]
            bs[i] = b
            nc[i], nl[i], nt[i] = bc[b] + c[u], max(bl[b], lg[u]), bt[b] + t[u]
            ok[i] = _cost(kind, params, nc[i], nl[i], nt[i]) <= budget
        if not ok.any():
            break
        for i in range(nu):
            if ok[i]:
                b, u = bs[i], units[i]
                load[b] += w[u]
                bc[b], bl[b], bt[b] = nc[i], nl[i], nt[i]
                bin_of[u] = b
        units = units[~ok]
    for i in range(units.size):  # _place_alone
        if failed[0]:
            return
        u = units[i]
        best, at = np.inf, -1
        for b in range(m):
            if _cost(kind, params, bc[b] + c[u], max(bl[b], lg[u]), bt[b] + t[u]) <= budget and (
                    at < 0 or load[b] < best):
                best, at = load[b], b
        if at < 0:
            failed[0] = True
            return
        load[at] += w[u]
        bc[at], bl[at], bt[at] = bc[at] + c[u], max(bl[at], lg[u]), bt[at] + t[u]
        bin_of[u] = at


@njit(**_OPTS)
def _deal_block(order: Any, d: int, width: int, w: Any, c: Any, lg: Any, t: Any, load: Any, bc: Any, bl: Any,
                bt: Any, bin_of: Any, budget: float, kind: int, params: Any) -> bool:
    """``_deal_block`` of one row: the next ``width`` units in snake order over the bins,
    lightest first, applied only if no bin breaks the cap."""
    m, k = load.size, order.size
    lightest = _stable(load)
    target = np.empty(width, dtype=np.int64)
    us = np.empty(width, dtype=np.int64)
    add_c, add_t, new_l = np.zeros(m), np.zeros(m), bl.copy()
    for j in range(width):
        pos = j % m if (j // m) % 2 == 0 else m - 1 - j % m
        b = lightest[pos]
        u = order[min(d + j, k - 1)]
        target[j], us[j] = b, u
        add_c[b] += c[u]
        add_t[b] += t[u]
        new_l[b] = max(new_l[b], lg[u])
    new_c, new_t = bc + add_c, bt + add_t
    for b in range(m):
        if not _cost(kind, params, new_c[b], new_l[b], new_t[b]) <= budget:
            return False
    add_w = np.zeros(m)
    for j in range(width):
        add_w[target[j]] += w[us[j]]
    load += add_w
    bc[:], bl[:], bt[:] = new_c, new_l, new_t
    for j in range(width):
        bin_of[us[j]] = target[j]
    return True


# --------------------------------------------------------------------------- refine


@njit(**_OPTS)
def _steps_of(load: Any, rows: int, nb: int, pooled: bool, world: int) -> Any:
    """``steps_of``, flat: each bin's micro-step."""
    return _steps_heaviest(load, rows, nb, pooled, world)[0]


@njit(**_OPTS)
def _steps_heaviest(load: Any, rows: int, nb: int, pooled: bool, world: int) -> Any:
    """``steps_of``, flat, and each row's bins heaviest first (``(rows, nb)``: positions in the
    row, the stable order the micro-steps come from)."""
    step = np.empty(load.size, dtype=np.int64)
    order = np.empty((rows, nb), dtype=np.int64)
    for r in range(rows):
        heaviest = _stable(-load[r * nb:(r + 1) * nb])
        order[r] = heaviest
        for p in range(nb):
            step[r * nb + heaviest[p]] = p // world if pooled else p
    return step, order


@njit(**_OPTS)
def _slowest(load: Any, step: Any) -> Any:
    slowest = np.zeros(step.max() + 1)
    for i in range(load.size):
        if load[i] > slowest[step[i]]:
            slowest[step[i]] = load[i]
    return slowest


@njit(**_OPTS)
def step_time(load: Any, rows: int, nb: int, pooled: bool, world: int) -> float:
    """``step_time`` of flat loads (in-order sum: exact for whole-number loads below 2**53)."""
    if load.size == 0:
        return 0.0
    return _slowest(load, _steps_of(load, rows, nb, pooled, world)).sum()


@njit(**_OPTS)
def _pairs(load: Any, rows: int, nb: int, pooled: bool, world: int, mode: int, wide: int) -> Any:
    """``_pairs`` (mode 0 balance, 1 wide, 2 narrow): give, take, room, best, same, step time."""
    size = load.size
    row = np.arange(size) // nb
    step, heaviest = _steps_heaviest(load, rows, nb, pooled, world)
    slowest = _slowest(load, step)
    slack = np.empty(size)
    for i in range(size):
        slack[i] = slowest[step[i]] - load[i]
    now = slowest.sum()
    if mode == 0 or mode == 1:
        half = nb // 2 if mode == 0 else max(1, nb // wide)
        give = np.empty(rows * half, dtype=np.int64)
        take = np.empty(rows * half, dtype=np.int64)
        for r in range(rows):
            order = heaviest[r]  # _stable(-load) of the row, as _steps_heaviest sorted it
            if mode == 1:
                order = _then(order, slack[r * nb:(r + 1) * nb])
            for j in range(half):
                give[r * half + j] = r * nb + order[j]
                take[r * half + j] = r * nb + order[nb - 1 - j]
        if mode == 0:
            keep = load[give] > load[take]
            give, take = give[keep], take[keep]
            room = load[give] - load[take]
            return give, take, np.nextafter(room, 0.0), room / 2, np.ones(give.size, dtype=np.bool_), now
    else:
        by_step = _then(heaviest[0] if rows == 1 else _stable(-load), step.astype(np.float64))
        first = np.ones(size, dtype=np.bool_)
        for i in range(1, size):
            first[i] = step[by_step[i]] != step[by_step[i - 1]]
        give = by_step[first]
        give = give[_then(_stable(-load[give]), row[give].astype(np.float64))]
        free = np.ones(size, dtype=np.bool_)
        free[give] = False
        cand = np.flatnonzero(free)
        cand = cand[_then(_stable(-slack[cand]), row[cand].astype(np.float64))]
        g_row, c_row = row[give].astype(np.float64), row[cand].astype(np.float64)  # whole: compared exactly
        zero = np.int64(0)
        keep = np.zeros(give.size, dtype=np.bool_)
        at = np.zeros(give.size, dtype=np.int64)
        for i in range(give.size):
            nth = i - _search(g_row, g_row[i], zero, give.size)
            start = _search(c_row, g_row[i], zero, cand.size)
            end = _search(c_row, g_row[i] + 1, zero, cand.size)
            at[i] = start + nth
            keep[i] = at[i] < end
        give, take = give[keep], cand[at[keep]]
    keep = np.empty(give.size, dtype=np.bool_)
    for i in range(give.size):
        keep[i] = slack[give[i]] < slack[take[i]] and load[give[i]] > 0
    give, take = give[keep], take[keep]
    same = step[give] == step[take]
    room = np.where(same, load[give] - load[take], slack[take])
    best = np.where(same, room / 2, room)
    return give, take, np.where(same, np.nextafter(room, 0.0), room), best, same, now


@njit(**_OPTS)
def _second_longest(u: Any, flat: Any, lg: Any, n_bins: int) -> Any:
    """``_second_longest`` in one scan: the unit holding each bin's longest size (the last of
    ``u`` among equals, as the stable sort there leaves it), and the bin's longest without it
    (the next in that order: the second largest size, equal to the longest on a tie; 0 alone)."""
    top_id = np.full(n_bins, -1, dtype=np.int64)
    top = np.zeros(n_bins)
    second = np.zeros(n_bins)
    for i in range(u.size):
        x = u[i]
        b, v = flat[x], lg[x]
        if top_id[b] < 0:
            top_id[b], top[b] = x, v
        elif v >= top[b]:
            second[b], top[b], top_id[b] = top[b], v, x
        elif v > second[b]:
            second[b] = v
    return top_id, second


@njit(**_OPTS)
def _by_pair(pos: Any, pair: Any, key: Any, n_pairs: int) -> Any:
    """``pos[np.argsort(key[pos], kind="stable")]`` where ``key`` orders by ``pair`` first:
    a counting sort by pair, then each pair's run sorted stably by key (insertion: short runs; where
    that is more work than one sort of them all, one stable sort: the same order)."""
    start = np.zeros(n_pairs + 1, dtype=np.int64)
    for i in range(pos.size):
        start[pair[pos[i]] + 1] += 1
    for p in range(n_pairs):
        start[p + 1] += start[p]
    fill = start[:-1].copy()
    out = np.empty(pos.size, dtype=np.int64)
    for i in range(pos.size):
        p = pair[pos[i]]
        out[fill[p]] = pos[i]
        fill[p] += 1
    work = 0  # an insertion sort's work on the runs, about; above a sort of all of them, one sort
    for p in range(n_pairs):
        k = start[p + 1] - start[p]
        work += k * k
    if work > 64 * pos.size + 4096:  # key orders by pair first: one stable sort is each run's
        return out[_stable(key[out])]
    ko = key[out]  # the keys beside the positions: the insertion compares neighbours in memory
    for p in range(n_pairs):
        lo, hi = start[p], start[p + 1]
        for i in range(lo + 1, hi):
            x = out[i]
            kx = ko[i]
            j = i - 1
            while j >= lo and ko[j] > kx:
                out[j + 1] = out[j]
                ko[j + 1] = ko[j]
                j -= 1
            out[j + 1] = x
            ko[j + 1] = kx
    return out


@njit(**_OPTS)
def _one_pass(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, placed: Any, w: Any, c: Any, lg: Any, t: Any,
              budget: float, kind: int, params: Any, uses_max: bool, rows: int, nb: int, pooled: bool, world: int,
              mode: int, wide: int, paired: int, n_rounds: int) -> Any:
    """``_one_pass``: exchanges between the pairs of bins of :func:`_pairs`; (step time before, units worked on)."""
    h, l_, room, best, same, now = _pairs(load, rows, nb, pooled, world, mode, wide)
    n_pairs = h.size
    if n_pairs == 0:
        return now, 0
    n_bins = load.size
    pair_of = np.full(n_bins, -1, dtype=np.int64)
    for i in range(n_pairs):
        pair_of[h[i]] = i
        pair_of[l_[i]] = i
    u = placed[pair_of[flat[placed]] >= 0]
    pair = pair_of[flat[u]]
    give = flat[u] == h[pair]
    if uses_max:
        top_id, second = _second_longest(u, flat, lg, n_bins)
    else:
        top_id, second = np.full(n_bins, -1, dtype=np.int64), bl  # a model blind to the longest
    cu, v1, v2, cp, delta, in_c, in_t, in_l = _candidates(u, pair, give, flat, pair_of, w, c, lg, t, room, best,
                                                          n_pairs, mode, paired)
    _exchange(load, bc, bl, bt, flat, w, c, lg, t, budget, kind, params, h, l_, room, best, same, top_id, second,
              cu, v1, v2, cp, delta, in_c, in_t, in_l, n_rounds)
    return now, u.size


@njit(**_OPTS)
def _candidates(u: Any, pair: Any, give: Any, flat: Any, pair_of: Any, w: Any, c: Any, lg: Any, t: Any, room: Any,
                best: Any, n_pairs: int, mode: int, paired: int) -> Any:
    """A pass's candidate exchanges (``_one_pass`` up to its rounds): the given unit, the one
    or two units coming back (-1: none), the pair, the weight passed, and what comes back's
    count, total and longest; those that pass a positive weight within the pair's room."""
    wu = w[u]
    scale = w.max() + 1.0
    key = 2.0 * pair + wu / scale
    take = np.flatnonzero(~give)
    g = np.flatnonzero(give)
    take, g = _by_pair(take, pair, key, n_pairs), _by_pair(g, pair, key, n_pairs)
    t_key, gp, gw = key[take], pair[g], wu[g]
    take, g = u[take], u[g]
    n_take = np.zeros(n_pairs, dtype=np.int64)
    for i in range(take.size):
        n_take[pair_of[flat[take[i]]]] += 1
    hi = np.cumsum(n_take)
    lo = hi - n_take
    ng = g.size
    at = np.empty(ng, dtype=np.int64)
    # a search key 2 * p + x (0 <= x < 1: the weight passed is under the scale) lies above every
    # key of the pairs before p and below every key of those after: searching the pair's own
    # partners finds the position a search of all of them finds (fewer, unpredictable, steps)
    for i in range(ng):
        at[i] = _search(t_key, 2.0 * gp[i] + max(gw[i] - best[gp[i]], 0.0) / scale, lo[gp[i]], hi[gp[i]])
    # candidates: the given unit for none, for the partner unit at `at`, for the one before it
    n_above, n_below = 0, 0
    for i in range(ng):
        n_above += at[i] < hi[gp[i]]
        n_below += at[i] > lo[gp[i]]
    n_heavy_reps = 0
    if mode == 2 and take.size:
        n_give = np.zeros(n_pairs, dtype=np.int64)
        for i in range(ng):
            n_give[gp[i]] += 1
        c_give = np.cumsum(n_give)
        for i in range(ng):
            if i >= c_give[gp[i]] - paired:
                n_heavy_reps += n_take[gp[i]]
    total = ng + n_above + n_below + n_heavy_reps
    cu = np.empty(total, dtype=np.int64)
    v1 = np.full(total, -1, dtype=np.int64)
    v2 = np.full(total, -1, dtype=np.int64)
    cp = np.empty(total, dtype=np.int64)
    x = 0
    for i in range(ng):
        cu[x], cp[x] = g[i], gp[i]
        x += 1
    last = max(take.size - 1, 0)
    for i in range(ng):
        if at[i] < hi[gp[i]]:
            cu[x], v1[x], cp[x] = g[i], take[min(at[i], last)], gp[i]
            x += 1
    for i in range(ng):
        if at[i] > lo[gp[i]]:
            cu[x], v1[x], cp[x] = g[i], take[at[i] - 1], gp[i]
            x += 1
    if n_heavy_reps:  # one for two: the PAIRED heaviest given units of a pair, each partner unit
        for i in range(ng):
            p = gp[i]
            if i < c_give[p] - paired:
                continue
            for i1 in range(lo[p], hi[p]):
                need = w[g[i]] - best[p] - w[take[i1]]
                i2 = _search(t_key, 2.0 * p + max(need, 0.0) / scale, lo[p], hi[p])
                if i2 == i1:
                    i2 += 1
                if i2 < hi[p]:
                    cu[x], v1[x], v2[x], cp[x] = g[i], take[i1], take[i2], p
                    x += 1
    delta = np.empty(x)
    kept = 0
    for i in range(x):  # those that fit, compacted in place (in order: kept <= i)
        d = w[cu[i]] - (w[v1[i]] if v1[i] >= 0 else 0.0) - (w[v2[i]] if v2[i] >= 0 else 0.0)
        if d > 0 and d <= room[cp[i]]:
            cu[kept], v1[kept], v2[kept], cp[kept], delta[kept] = cu[i], v1[i], v2[i], cp[i], d
            kept += 1
    x = kept
    cu, v1, v2, cp, delta = cu[:x], v1[:x], v2[:x], cp[:x], delta[:x]
    in_c, in_t, in_l = np.zeros(x), np.zeros(x), np.zeros(x)
    for i in range(x):
        a, b = v1[i], v2[i]
        ca, ta, la = (c[a], t[a], lg[a]) if a >= 0 else (0.0, 0.0, 0.0)
        cb, tb, lb_ = (c[b], t[b], lg[b]) if b >= 0 else (0.0, 0.0, 0.0)
        in_c[i], in_t[i], in_l[i] = ca + cb, ta + tb, max(la, lb_)
    return cu, v1, v2, cp, delta, in_c, in_t, in_l


@njit(**_OPTS)
def _exchange(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, w: Any, c: Any, lg: Any, t: Any, budget: float,
              kind: int, params: Any, h: Any, l_: Any, room: Any, best: Any, same: Any, top_id: Any, second: Any,
              cu: Any, v1: Any, v2: Any, cp: Any, delta: Any, in_c: Any, in_t: Any, in_l: Any, n_rounds: int) -> None:
    """``_one_pass``'s rounds: in each, every pair's best exchange whose two bins stay under the
    budget (the first of equal scores), each unit moved at most once a pass."""
    nu, n_bins, n_pairs = w.size, load.size, h.size
    used = np.zeros(nu, dtype=np.bool_)  # units moved in this pass
    touched = np.zeros(n_bins, dtype=np.bool_)  # bins changed in this pass (their longest an upper bound)
    x = cu.size
    live = np.arange(x)  # candidates still possible (numpy drops the others from its arrays), in order
    n_live = x
    pick = np.empty(n_pairs, dtype=np.int64)
    score = np.empty(n_pairs)
    new = np.empty((n_pairs, 6))  # the chosen exchange's giving and taking bins' count, total, longest
    # a pair with no exchange in a round has none later: only its own exchanges change its two
    # bins, their units and its room, so its candidates are dropped (the same choices, less work)
    dead = np.zeros(n_pairs, dtype=np.bool_)
    for _ in range(n_rounds):  # invariant: each taking bin <= its step's slowest at the pass's start
        pick[:] = -1
        kept = 0
        for q in range(n_live):
            i = live[q]
            p = cp[i]
            if dead[p] or used[cu[i]] or (v1[i] >= 0 and used[v1[i]]) or (v2[i] >= 0 and used[v2[i]]) or not delta[i] <= room[p]:
                continue
            live[kept] = i
            kept += 1
            hb, lb = h[p], l_[p]
            hc = bc[hb] - c[cu[i]] + in_c[i]
            ht = bt[hb] - t[cu[i]] + in_t[i]
            hl = max(second[hb] if top_id[hb] == cu[i] and not touched[hb] else bl[hb], in_l[i])
            if not _cost(kind, params, hc, hl, ht) <= budget:
                continue
            lc = bc[lb] + c[cu[i]] - in_c[i]
            lt = bt[lb] + t[cu[i]] - in_t[i]
            one_only = v1[i] >= 0 and v2[i] < 0
            keep_l = second[lb] if one_only and top_id[lb] == v1[i] and not touched[lb] else bl[lb]
            ll = max(keep_l, lg[cu[i]])
            if not _cost(kind, params, lc, ll, lt) <= budget:
                continue
            sc = min(delta[i], 2 * best[p] - delta[i])
            if pick[p] < 0 or sc > score[p]:  # the best exchange of each pair, the first of equals
                pick[p], score[p] = i, sc
                new[p, 0], new[p, 1], new[p, 2], new[p, 3], new[p, 4], new[p, 5] = hc, ht, hl, lc, lt, ll
        n_live = kept
        if kept == 0:
            break
        moved = False
        for p in range(n_pairs):  # distinct pairs: distinct bins and units
            i = pick[p]
            if i < 0:
                dead[p] = True
                continue
            moved = True
            hb, lb, d = h[p], l_[p], delta[i]
            load[hb] -= d
            load[lb] += d
            bc[hb], bt[hb], bl[hb] = new[p, 0], new[p, 1], new[p, 2]
            bc[lb], bt[lb], bl[lb] = new[p, 3], new[p, 4], new[p, 5]
            flat[cu[i]] = lb
            used[cu[i]] = True
            if v1[i] >= 0:
                flat[v1[i]] = hb
                used[v1[i]] = True
            if v2[i] >= 0:
                flat[v2[i]] = hb
                used[v2[i]] = True
            touched[hb] = touched[lb] = True
            room[p] -= 2 * d if same[p] else d
            best[p] = room[p] / 2 if same[p] else room[p]
        if not moved:
            break


@njit(**_OPTS)
def refine(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, placed: Any, w: Any, c: Any, lg: Any, t: Any,
           budget: float, kind: int, params: Any, uses_max: bool, rows: int, nb: int, pooled: bool, world: int,
           ideal: float, most: int, balance: bool, consts: Any) -> None:
    """``refine``'s passes on flat bins, in place (``consts``: VISITS, GAIN, GAIN_B, WIDE, PAIRED, ROUNDS)."""
    visits, gain, gain_b = consts[0], consts[1], consts[2]
    wide, paired, n_rounds = int(consts[3]), int(consts[4]), int(consts[5])
    times = np.empty(most)
    n_times = 0
    balance_mode = np.int64(0)  # not a literal: one specialisation of _one_pass
    work = 0
    for _ in range(most):  # balance passes while they gain, then the others
        if balance:  # not bound to the micro-steps' slowest bins: undone if the step got slower
            kept = (load.copy(), bc.copy(), bl.copy(), bt.copy(), flat.copy())
            before, done = _one_pass(load, bc, bl, bt, flat, placed, w, c, lg, t, budget, kind, params, uses_max,
                                     rows, nb, pooled, world, balance_mode, wide, paired, n_rounds)
            after = step_time(load, rows, nb, pooled, world)
            if after > before:
                load[:], bc[:], bl[:], bt[:], flat[:] = kept
            balance = after < before * (1 - gain_b) and after > ideal
        else:
            now, done = _one_pass(load, bc, bl, bt, flat, placed, w, c, lg, t, budget, kind, params, uses_max,
                                  rows, nb, pooled, world, 1 + n_times % 2, wide, paired, n_rounds)
            times[n_times] = now
            n_times += 1
            if now <= ideal or n_times >= 3 and now > times[n_times - 3] * (1 - gain):
                break
        work += done
        if work >= visits:
            break


# --------------------------------------------------------------------------- the partition's layout


@njit(**_OPTS)
def lay_out_pool(load: Any, bin_of: Any, unit_of: Any, kept: Any, m: int, world: int, sizes: Any,
                 loss: Any) -> Any:
    """``by_step`` of one pool of ``world * m`` bins and the per-sequence part of ``_Plan.result``:
    the order (kept sequences by rank, micro-step, index), the offsets, the micro-steps' sample
    counts, tokens and loss tokens (summed in index order, as ``np.bincount``), the ``(world,
    m)`` workloads and the empty micro-batches. The bins' micro-steps come from the same stable
    sort of their loads, heaviest first; the order from a counting sort (stable: ascending
    indices within a micro-batch, as ``argsort(kind="stable")`` of the keys)."""
    nb = load.size
    heaviest = _stable(-load)
    key_of_bin = np.empty(nb, dtype=np.int64)
    step_of_bin = np.empty(nb, dtype=np.int64)
    workload = np.zeros((world, m))
    for p in range(nb):  # the heaviest world bins make micro-step 0, ..., ranks in snake order
        b = heaviest[p]
        step, lane = p // world, p % world
        rank = lane if step % 2 == 0 else world - 1 - lane
        key_of_bin[b] = rank * m + step
        step_of_bin[b] = step
        workload[rank, step] = load[b]
    n = unit_of.size
    offsets = np.zeros(world * m + 1, dtype=np.int64)
    samples = np.zeros(m, dtype=np.int64)
    tokens = np.zeros(m)
    loss_tokens = np.zeros(m)
    for s in range(n):  # invariant: offsets[k + 1] counts the kept sequences of key k before s
        if kept[s]:
            b = bin_of[unit_of[s]]
            offsets[key_of_bin[b] + 1] += 1
            step = step_of_bin[b]
            samples[step] += 1
            tokens[step] += sizes[s]
            loss_tokens[step] += loss[s]
    n_empty = 0
    for k in range(world * m):
        if offsets[k + 1] == 0:
            n_empty += 1
        offsets[k + 1] += offsets[k]
    fill = offsets[:-1].copy()
    order = np.empty(offsets[-1], dtype=np.int64)
    for s in range(n):  # ascending indices within each micro-batch
        if kept[s]:
            k = key_of_bin[bin_of[unit_of[s]]]
            order[fill[k]] = s
            fill[k] += 1
    return order, offsets, samples, tokens, loss_tokens, workload, n_empty


@njit(**_OPTS)
def bound_terms(w: Any, extra: Any, big: Any, any_big: bool, superadditive: bool, room: float,
                per_step: int) -> Any:
    """``_Plan._efficiency_bound``'s terms ``(w[i] - w[i + 1]) * steps[i]`` (``w`` heaviest
    first, ``extra`` the units' marginal costs, ``big`` the oversized): the running sums in
    order, as ``np.cumsum``; the caller sums the terms (pairwise, in numpy)."""
    n = w.size
    terms = np.empty(n)
    acc, half, n_big, normal = 0.0, 0, 0, 0
    for i in range(n):
        if any_big and big[i]:
            n_big += 1
        else:
            normal += 1
            acc += extra[i]
            if extra[i] > room / 2:
                half += 1
        if not superadditive:
            need = 0.0
        elif room > 0:
            need = max(np.ceil(acc / room * (1 - 1e-12)), float(half))
        else:
            need = float(normal)
        bins = n_big + max(need, 1.0 if normal > 0 else 0.0)
        steps = np.ceil(bins / per_step)
        nxt = w[i + 1] if i + 1 < n else 0.0
        terms[i] = (w[i] - nxt) * steps
    return terms


# --------------------------------------------------------------------------- the whole pooled partition


@njit(**_OPTS)
def _pairwise(a: Any, lo: int, n: int) -> float:
    """numpy's pairwise sum of ``a[lo:lo + n]`` (float64, contiguous): ``np.sum``'s value."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = 8
        while i < n - n % 8:
            j = lo + i
            r0 += a[j]
            r1 += a[j + 1]
            r2 += a[j + 2]
            r3 += a[j + 3]
            r4 += a[j + 4]
            r5 += a[j + 5]
            r6 += a[j + 6]
            r7 += a[j + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[lo + i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


@njit(**_OPTS)
def _np_sum(a: Any) -> float:
    """``np.sum`` of a 1-D contiguous float64 array, the same value (numpy's pairwise sum)."""
    return 0.0 + _pairwise(a, np.int64(0), a.size)


@njit(**_OPTS)
def _whole_below(a: Any, limit: float) -> bool:
    """Every value a whole number >= 0 and their sum below ``limit`` (then every sum of them is exact;
    NaN fails)."""
    acc = 0.0
    for i in range(a.size):
        if not a[i] >= 0 or a[i] != np.floor(a[i]):
            return False
        acc += a[i]
    return acc < limit


@njit(**_OPTS)
def partition_pool(sizes: Any, weight: Any, loss: Any, budget: float, kind: int, params: Any, uses_max: bool,
                   step: int, floor: int, world: int, exact_rounds: int, consts: Any, tune: Any) -> Any:
    """:func:`fitbatch.steps.partition` of one pool without groups, skips or oversized sequences, under a
    built-in cost, with whole weights and marginal costs whose totals are below ``2**52``: the calls
    the numpy form makes, in its order, on the same values (``_Plan.build`` and ``micro_rows`` of a
    pool, ``_bound``, ``settle`` where the first packing fits, ``_balanced``, ``refine``, the layout
    and ``finish``). ``tune``: SPREAD, MORE, FULL, CLOSE, PASSES, PASSES_SMALL, UNITS_PER_PASS,
    BALANCED_UP_TO, EXACT_BELOW.

    Returns (status, m, order + offsets + samples (int64, one array), tokens + loss tokens +
    workload (float64, one array: fewer arrays to hand back), n_empty, lower bound, efficiency,
    efficiency bound); status 0: done, 1: a case this does not cover (a unit over the budget
    alone, weights not whole numbers >= 0 or marginal costs not whole, a packing that needs more
    than the lower bound): the caller runs the general form (and raises what is bad)."""
    spread, more_gap, full, close = tune[0], tune[1], tune[2], tune[3]
    passes, passes_small, per_pass = int(tune[4]), int(tune[5]), int(tune[6])
    balanced_up_to, exact_below = int(tune[7]), tune[8]
    n = sizes.size
    one, yes, no = np.int64(1), np.bool_(True), np.bool_(False)  # not literals: the callees' one specialisation
    e_i = np.zeros(0, dtype=np.int64)
    e_f = np.zeros(0)
    fail = (1, 0, e_i, e_f, 0, 0, 0.0, 0.0)
    if n == 0:
        return fail
    fixed = _cost(kind, params, 0.0, 0.0, 0.0)
    ones = np.ones(n)
    extra = np.empty(n)
    for i in range(n):
        alone = _cost(kind, params, 1.0, sizes[i], sizes[i])
        if alone > budget:
            return fail
        extra[i] = max(alone - fixed, 0.0)
    if not _whole_below(weight, exact_below) or not _whole_below(extra, exact_below):
        return fail
    heaviest = _stable(-weight)
    room = budget - fixed
    if room <= 0:
        bound = n
    else:
        half = 0
        for i in range(n):
            if extra[i] > room / 2:
                half += 1
        by_sum = int(np.ceil(extra.sum() / room * (1 - 1e-12)))
        bound = max(1, by_sum, half)
    bound_p = (bound + world - 1) // world
    m = -(-max(bound_p, floor) // step) * step
    alone_row = np.full(0, -1, dtype=np.int64)
    load, bc, bl, bt, bin_of, failed = pack_pool(heaviest, alone_row, weight, ones, sizes, sizes, m * world, budget,
                                                 kind, params, exact_rounds)
    if failed:
        return fail
    nb = m * world
    terms = bound_terms(weight[heaviest], extra[heaviest], np.zeros(n, dtype=np.bool_), no, yes, room, world)
    least = _np_sum(terms)  # _Plan.least_time: no split runs faster
    first = step_time(load, one, nb, yes, world)
    if first * world > load.sum() * (1 + spread) and first > least and m > max(bound_p, 1) and (step > 1 or floor > 0):
        f_load, f_bc, f_bl, f_bt, f_bin, f_failed = pack_pool(heaviest, alone_row, weight, ones, sizes, sizes,
                                                              bound_p * world, budget, kind, params, exact_rounds)
        if f_failed:
            return fail
        if bound_p < m:
            p_load, p_bc, p_bl, p_bt = np.zeros(nb), np.zeros(nb), np.zeros(nb), np.zeros(nb)
            k = f_load.size
            p_load[:k], p_bc[:k], p_bl[:k], p_bt[:k] = f_load, f_bc, f_bl, f_bt
            padded = step_time(p_load, one, nb, yes, world)
            if padded < first:
                load, bc, bl, bt, bin_of = p_load, p_bc, p_bl, p_bt, f_bin
                first = padded  # the step time of `load` (each taken once: the same values)
    placed = np.arange(n)
    balance = n <= balanced_up_to
    most = min(passes, max(passes_small, n // per_pass))
    now = first
    if world > 1 and first > least:
        refine(load, bc, bl, bt, bin_of, placed, weight, ones, sizes, sizes, budget, kind, params, uses_max, one, nb,
               yes, world, load.sum() / world * (1 + close), most, balance, consts)
        now = step_time(load, one, nb, yes, world)
    if now > least and now > load.sum() / world * (1 + more_gap) and m <= -(-max(bound_p, floor, 1) // step) * step:
        cost = np.empty(nb)
        for b in range(nb):
            cost[b] = min(_cost(kind, params, bc[b], bl[b], bt[b]), budget)
        if _np_sum(cost) / (nb * budget) >= full:  # full to the cap: one more micro-step, if faster
            more = m + step
            w_load, w_bc, w_bl, w_bt, w_bin, w_failed = pack_pool(heaviest, alone_row, weight, ones, sizes, sizes,
                                                                  more * world, budget, kind, params, exact_rounds)
            if not w_failed:
                wider = step_time(w_load, one, more * world, yes, world)
                if world > 1 and wider > least:
                    refine(w_load, w_bc, w_bl, w_bt, w_bin, placed, weight, ones, sizes, sizes, budget, kind, params,
                           uses_max, one, more * world, yes, world, w_load.sum() / world * (1 + close), most, balance,
                           consts)
                    wider = step_time(w_load, one, more * world, yes, world)
                if wider < now:
                    m, load, bin_of = more, w_load, w_bin
    order, offsets, samples, tokens, loss_tokens, workload, n_empty = lay_out_pool(
        load, bin_of, placed, np.ones(n, dtype=np.bool_), m, world, sizes, loss)
    slowest, total = 0.0, 0.0
    for j in range(m):
        top = workload[0, j]
        for r in range(1, world):
            top = max(top, workload[r, j])
        slowest += top
    for r in range(world):
        for j in range(m):
            total += workload[r, j]
    lower = -(-max(bound_p, floor) // step) * step
    efficiency = total / world / slowest if slowest > 0 else 1.0
    mean = total / world
    eff_bound = mean / max(least, mean) if mean > 0 else 1.0
    ints = np.empty(order.size + offsets.size + m, dtype=np.int64)
    ints[:order.size] = order
    ints[order.size:order.size + offsets.size] = offsets
    ints[order.size + offsets.size:] = samples
    floats = np.empty(2 * m + world * m)
    floats[:m] = tokens
    floats[m:2 * m] = loss_tokens
    floats[2 * m:] = workload.ravel()
    return 0, m, ints, floats, n_empty, lower, efficiency, eff_bound
