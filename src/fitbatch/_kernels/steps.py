"""Compiled step partitioning (numba): :mod:`fitbatch.steps._pack`'s deal of one pool, the
pool's layout, the efficiency bound's terms and the whole pooled partition in one call, the same
decisions in the same order as their numpy forms; the refinement's passes are in
:mod:`fitbatch._kernels.steps_refine`, the sorts and cost kinds they share in
:mod:`fitbatch._kernels.steps_common`.

Importing this module imports numba; :mod:`fitbatch.steps._compiled` loads it (lazily, in the
background) and decides where it applies. Its public names are the loops the library calls (an
ahead-of-time cache exports exactly those, :mod:`fitbatch._kernels.aot`). Each loop mirrors a
numpy function, named in its docstring: the same comparisons on the same float values, ties broken
the same way (stable sorts, first index), running sums taken in the same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from fitbatch._kernels.steps_common import (
    OPTS,
    _cost,
    _smallest,
    _stable,
    _stable_spread,
    argsort,
    argsort_int,
)
from fitbatch._kernels.steps_refine import _heaviest_time, _passes, refine, step_time

# the loops the library calls (the ahead-of-time cache exports exactly these)
__all__ = ["argsort", "argsort_int", "bound_terms", "lay_out_pool", "pack_pool", "partition_pool", "refine", "step_time"]

# --------------------------------------------------------------------------- pack (one pool)

#: a round of the deal takes up to this many bins from the heap, more by a sort of those below its
#: limit (the same bins in the same order: a sort of 17-32 costs less than their pops and pushes)
HEAP_WIDTH = 16
#: from this many units :func:`partition_pool`'s passes take them from its sort by weight (made from
#: the heaviest-first order it has already: no sort of its own, unlike ``steps_refine.PRESORT_FROM``'s)
PRESORTED_FROM = 256


@njit(**OPTS)
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
    # a round's room (it deals to at most m bins): its bins, the bins below its limit, the units that
    # do not fit; those bins' loads
    ints = np.empty((3, m), dtype=np.int64)
    keys = np.empty(m)
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
                           state, ints, keys)
        rounds += 1
    return load, bc, bl, bt, bin_of, failed[0]


@njit(**OPTS)
def _heapify(load: Any, hk: Any, hb: Any) -> None:
    """Every bin into the heap ``(hk, hb)`` (its load, its index), ordered by (load, index)."""
    m = load.size
    for b in range(m):
        hk[b], hb[b] = load[b], b
    for pos in range(m // 2 - 1, -1, -1):
        _sift_down(hk, hb, m, pos)


@njit(**OPTS)
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


@njit(**OPTS)
def _sift_up(hk: Any, hb: Any, pos: int) -> None:
    while pos > 0:
        p = (pos - 1) // 2
        if hk[pos] < hk[p] or hk[pos] == hk[p] and hb[pos] < hb[p]:
            hk[p], hk[pos] = hk[pos], hk[p]
            hb[p], hb[pos] = hb[pos], hb[p]
            pos = p
        else:
            return


@njit(**OPTS)
def _deal_round(order: Any, d: int, n: int, w: Any, c: Any, lg: Any, t: Any, load: Any, bc: Any, bl: Any, bt: Any,
                bin_of: Any, failed: Any, budget: float, kind: int, params: Any, hk: Any, hb: Any, state: Any,
                ints: Any, keys: Any) -> int:
    """``_deal_round_one``: the i-th heaviest next unit to the i-th lightest bin; the new ``done``.

    The bins below the lightest load plus the next unit's weight (at least one; every bin for a
    unit of weight 0), at most the units left, are popped from the heap lightest first, ties by
    bin (the stable sort's first ``width``), and pushed back with their new loads. A round of
    more than ``HEAP_WIDTH`` bins (or one after such a round) counts and sorts them as the numpy
    form does (the same bins in the same order); the heap is built again when next needed.
    ``state``: whether the heap holds every bin's load, the last round's width; ``ints``, ``keys``:
    room for the round's arrays (:func:`pack_pool`'s, one allocation for all rounds)."""
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
    lightest = ints[0, :limit]
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
        if 0 < below < m and width > HEAP_WIDTH:  # the bins below `low` are the lightest: sort only them
            some, key = ints[1, :below], keys[:below]
            i = 0
            for b in range(m):
                if load[b] < low:
                    some[i], key[i] = b, load[b]
                    i += 1
            by_load = _stable_spread(key)
            lightest = ints[0, :width]
            for j in range(width):
                lightest[j] = some[by_load[j]]
        elif width > HEAP_WIDTH:
            lightest = _stable_spread(load)[:width]
        else:
            lightest = _smallest(load, width)
    rest = ints[2]  # the units that do not fit their bin, in order
    bad = 0
    for j in range(width):  # distinct bins: a unit placed does not change another's test
        u = max(order[min(d + j, k - 1)], 0)
        b = lightest[j]
        nc, nl, nt = bc[b] + c[u], max(bl[b], lg[u]), bt[b] + t[u]
        if _cost(kind, params, nc, nl, nt) <= budget:
            load[b] += w[u]
            bc[b], bl[b], bt[b] = nc, nl, nt
            bin_of[u] = b
        else:
            rest[bad] = u
            bad += 1
    if bad:
        rest = rest[:bad]
        touched = np.zeros(m, dtype=np.bool_)
        _place_rest(rest, w, c, lg, t, load, bc, bl, bt, bin_of, failed, budget, kind, params, touched)
        state[1] = width
        if wide or failed[0]:
            state[0] = 0  # any bin may have changed
            return d + width
        pos = 0
        while pos < size:  # the bins in the heap that took a unit: their loads only grew, sunk one by one
            b = hb[pos]
            if touched[b]:  # (positions before pos keep their bins; the one moved up into pos is looked at next)
                touched[b] = False
                hk[pos] = load[b]
                _sift_down(hk, hb, size, pos)
            else:
                pos += 1
    else:
        state[1] = width
        if wide:
            return d + width
    for j in range(width):
        b = lightest[j]
        hk[size], hb[size] = load[b], b
        _sift_up(hk, hb, size)
        size += 1
    return d + width


@njit(**OPTS)
def _place_rest(rest: Any, w: Any, c: Any, lg: Any, t: Any, load: Any, bc: Any, bl: Any, bt: Any, bin_of: Any,
                failed: Any, budget: float, kind: int, params: Any, touched: Any) -> None:
    """``_place_rest`` of one row: units that fit no bin fail the row; the others paired with
    the cheapest bins (``_place_roomiest``), then one by one into the lightest bin they fit
    (``touched``: each bin that took one)."""
    m = load.size
    cmin, lmin, tmin = bc[0], bl[0], bt[0]  # the three least in one scan
    for b in range(1, m):
        cmin, lmin, tmin = min(cmin, bc[b]), min(lmin, bl[b]), min(tmin, bt[b])
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
                touched[b] = True
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
        touched[at] = True


@njit(**OPTS)
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


# --------------------------------------------------------------------------- the partition's layout


@njit(**OPTS)
def lay_out_pool(load: Any, bin_of: Any, unit_of: Any, kept: Any, m: int, world: int, sizes: Any,
                 loss: Any) -> Any:
    """``by_step`` of one pool of ``world * m`` bins and the per-sequence part of ``_Plan.result``:
    the order (kept sequences by rank, micro-step, index), the offsets, the micro-steps' sample
    counts, tokens and loss tokens (summed in index order, as ``np.bincount``), the ``(world,
    m)`` workloads and the empty micro-batches. The bins' micro-steps come from the same stable
    sort of their loads, heaviest first; the order from a counting sort (stable: ascending
    indices within a micro-batch, as ``argsort(kind="stable")`` of the keys)."""
    return _lay_out(load, _stable(-load), bin_of, unit_of, kept, m, world, sizes, loss)


@njit(**OPTS)
def _lay_out(load: Any, heaviest: Any, bin_of: Any, unit_of: Any, kept: Any, m: int, world: int, sizes: Any,
             loss: Any) -> Any:
    """:func:`lay_out_pool` with the bins heaviest first (``_stable(-load)``) given."""
    nb = load.size
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


@njit(**OPTS)
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


@njit(**OPTS)
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


@njit(**OPTS)
def _np_sum(a: Any) -> float:
    """``np.sum`` of a 1-D contiguous float64 array, the same value (numpy's pairwise sum)."""
    return 0.0 + _pairwise(a, np.int64(0), a.size)


@njit(**OPTS)
def _whole_below(a: Any, limit: float) -> bool:
    """Every value a whole number >= 0 and their sum below ``limit`` (then every sum of them is exact;
    NaN fails)."""
    acc = 0.0
    for i in range(a.size):
        if not a[i] >= 0 or a[i] != np.floor(a[i]):
            return False
        acc += a[i]
    return acc < limit


@njit(**OPTS)
def _lightest_first(heaviest: Any, key: Any) -> Any:
    """``_stable(key)`` from ``heaviest = _stable(-key)``: that order reversed, each run of equal
    keys turned back (ties by position)."""
    n = heaviest.size
    out = heaviest[::-1].copy()
    lo = 0
    while lo < n:
        hi = lo + 1
        while hi < n and key[out[hi]] == key[out[lo]]:
            hi += 1
        i, j = lo, hi - 1
        while i < j:
            out[i], out[j] = out[j], out[i]
            i += 1
            j -= 1
        lo = hi
    return out


@njit(**OPTS)
def _padded(load: Any, bc: Any, bl: Any, bt: Any, nb: int) -> Any:
    """``Bins.padded`` of one row: these bins, then empty ones up to ``nb``."""
    p_load, p_bc, p_bl, p_bt = np.zeros(nb), np.zeros(nb), np.zeros(nb), np.zeros(nb)
    k = load.size
    p_load[:k], p_bc[:k], p_bl[:k], p_bt[:k] = load, bc, bl, bt
    return p_load, p_bc, p_bl, p_bt


@njit(**OPTS)
def _spread_and_full(t: float, least: float, load: Any, bc: Any, bl: Any, bt: Any, budget: float, kind: int,
                     params: Any, world: int, m: int, top: int, more_gap: float, full: float) -> bool:
    """``_balanced``'s test for one more micro-step at a step time ``t`` of these bins: slower than
    the least time and than the mean by ``MORE``, at most the least count, ``FULL`` of the cap."""
    if not (t > least and t > load.sum() / world * (1 + more_gap) and m <= top):
        return False
    nb = load.size
    cost = np.empty(nb)
    for b in range(nb):
        cost[b] = min(_cost(kind, params, bc[b], bl[b], bt[b]), budget)
    return _np_sum(cost) / (nb * budget) >= full


@njit(**OPTS)
def _wider(heaviest: Any, alone_row: Any, weight: Any, ones: Any, sizes: Any, budget: float, kind: int, params: Any,
           uses_max: bool, nb: int, world: int, exact_rounds: int, least: float, close: float, most: int,
           balance: bool, consts: Any, placed: Any, by_w: Any, have: Any) -> Any:
    """``_balanced``'s packing into one more micro-step (``nb`` bins), refined where slower than the
    least time: (fits, its step time, loads, bin of each unit)."""
    one, yes = np.int64(1), np.bool_(True)
    w_load, w_bc, w_bl, w_bt, w_bin, w_failed = pack_pool(heaviest, alone_row, weight, ones, sizes, sizes, nb, budget,
                                                          kind, params, exact_rounds)
    if w_failed:
        return False, 0.0, w_load, w_bin
    wider, known = _heaviest_time(w_load, world)
    if world > 1 and wider > least:
        _passes(w_load, w_bc, w_bl, w_bt, w_bin, placed, weight, ones, sizes, sizes, budget, kind, params, uses_max,
                one, nb, yes, world, w_load.sum() / world * (1 + close), most, balance, consts, by_w, have, known)
        wider = step_time(w_load, one, nb, yes, world)
    return True, wider, w_load, w_bin


@njit(**OPTS)
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
    efficiency bound); status 0: done, 1: a case this does not cover (a size not in ``[0,
    MAX_EXACT)``, a unit over the budget alone, weights not whole numbers >= 0 or marginal costs not whole, a packing that needs more
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
    size_below = tune[9]
    for i in range(n):
        if not (sizes[i] >= 0.0 and sizes[i] < size_below):  # NaN fails: the general form checks the sizes
            return fail
        alone = _cost(kind, params, 1.0, sizes[i], sizes[i])
        if alone > budget:
            return fail
        extra[i] = max(alone - fixed, 0.0)
    if not _whole_below(weight, exact_below) or not _whole_below(extra, exact_below):
        return fail
    heaviest = _stable_spread(-weight)
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
    nb = m * world
    terms = bound_terms(weight[heaviest], extra[heaviest], np.zeros(n, dtype=np.bool_), no, yes, room, world)
    least = _np_sum(terms)  # _Plan.least_time: no split runs faster
    forced = m > max(bound_p, 1) and (step > 1 or floor > 0)
    early = forced and least * world > _np_sum(weight) * (1 + spread)
    tried = False  # the fewest micro-batches packed (`_balanced`'s early packing)
    p_load, p_bc, p_bl, p_bt, f_bin = e_f, e_f, e_f, e_f, e_i
    padded = 0.0
    h_pad = e_i  # the padded bins heaviest first (the stable order their step time comes from)
    padded_start = False
    if early:  # heavy units set the least time: the fewest micro-batches first, taken padded at it
        f_load, f_bc, f_bl, f_bt, f_bin, f_failed = pack_pool(heaviest, alone_row, weight, ones, sizes, sizes,
                                                              bound_p * world, budget, kind, params, exact_rounds)
        if f_failed:
            return fail
        tried = True
        p_load, p_bc, p_bl, p_bt = _padded(f_load, f_bc, f_bl, f_bt, nb)
        padded, h_pad = _heaviest_time(p_load, world)
    if early and padded <= least:
        load, bc, bl, bt, bin_of = p_load, p_bc, p_bl, p_bt, f_bin
        first, known = padded, h_pad
    else:
        load, bc, bl, bt, bin_of, failed = pack_pool(heaviest, alone_row, weight, ones, sizes, sizes, nb, budget,
                                                     kind, params, exact_rounds)
        if failed:
            return fail
        first, known = _heaviest_time(load, world)  # `known`: the bins of `load` heaviest first
        if first * world > load.sum() * (1 + spread) and first > least and forced:
            if not tried:
                f_load, f_bc, f_bl, f_bt, f_bin, f_failed = pack_pool(heaviest, alone_row, weight, ones, sizes, sizes,
                                                                      bound_p * world, budget, kind, params,
                                                                      exact_rounds)
                if f_failed:
                    return fail
                p_load, p_bc, p_bl, p_bt = _padded(f_load, f_bc, f_bl, f_bt, nb)
                padded, h_pad = _heaviest_time(p_load, world)
            if padded < first:
                load, bc, bl, bt, bin_of = p_load, p_bc, p_bl, p_bt, f_bin
                first, known = padded, h_pad  # the step time of `load` (each taken once: the same values)
                padded_start = True
    placed = np.arange(n)
    balance = n <= balanced_up_to and not padded_start  # `_balanced`: no balance passes on a padded start
    most = min(passes, max(passes_small, n // per_pass))
    now = first
    # the units by weight, ties by unit (`placed` is every unit, in order), for the passes of both
    # refinements (the same units and weights): the heaviest-first order turned round, no sort
    by_w = _lightest_first(heaviest, weight) if n >= PRESORTED_FROM else e_i
    have = np.ones(1, dtype=np.bool_)
    top = -(-max(bound_p, floor, 1) // step) * step
    more = m + step
    tried, fits, wider = False, False, 0.0  # one more micro-step: packed, fits, its (refined) step time
    w_load, w_bin = e_f, e_i
    if not padded_start and _spread_and_full(first, least, load, bc, bl, bt, budget, kind, params, world, m, top,
                                             more_gap, full):
        # already spread and full to the cap as packed: one more micro-step first; one within MORE
        # of its mean is kept without refining this count (its refinement could gain at most that)
        tried = True
        fits, wider, w_load, w_bin = _wider(heaviest, alone_row, weight, ones, sizes, budget, kind, params,
                                            uses_max, more * world, world, exact_rounds, least, close, most,
                                            n <= balanced_up_to, consts, placed, by_w, have)
        if fits and wider <= load.sum() / world * (1 + more_gap):
            now = -1.0  # taken: no refinement of this count
    if now >= 0 and world > 1 and first > least:
        _passes(load, bc, bl, bt, bin_of, placed, weight, ones, sizes, sizes, budget, kind, params, uses_max, one, nb,
                yes, world, load.sum() / world * (1 + close), most, balance, consts, by_w, have, known)
        now, known = _heaviest_time(load, world)
    if now < 0:
        m, load, bin_of, known = more, w_load, w_bin, e_i
    elif _spread_and_full(now, least, load, bc, bl, bt, budget, kind, params, world, m, top, more_gap, full):
        # still spread after refining at the least count, micro-batches full to the cap: no room
        # to even out; one more micro-step (micro_multiple more) is kept if it runs faster
        if not tried:
            fits, wider, w_load, w_bin = _wider(heaviest, alone_row, weight, ones, sizes, budget, kind, params,
                                                uses_max, more * world, world, exact_rounds, least, close, most,
                                                n <= balanced_up_to, consts, placed, by_w, have)
        if fits and wider < now:
            m, load, bin_of, known = more, w_load, w_bin, e_i
    if known.size != load.size:
        known = _stable(-load)
    order, offsets, samples, tokens, loss_tokens, workload, n_empty = _lay_out(
        load, known, bin_of, placed, np.ones(n, dtype=np.bool_), m, world, sizes, loss)
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
