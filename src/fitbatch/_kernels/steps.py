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

# numpy's constants, mirrored (fitbatch.steps._pack / _refine pass their values in; these are
# only the compiled loops' defaults for warming)
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
    """Positions of ``key`` sorted ascending, ties by position (numpy's ``kind="stable"``)."""
    return np.argsort(key, kind="mergesort")


@njit(**_OPTS)
def _then(order: Any, key: Any) -> Any:
    """``order`` stably re-sorted by ``key[order]`` (a lexsort's next, more significant key)."""
    return order[np.argsort(key[order], kind="mergesort")]


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
    n = 0
    for j in range(k):
        if order[j] >= 0:
            n += 1
    done = 0
    rounds = 0
    # invariant: the first `done` units of order are each in one bin (unless the row failed),
    # every bin's cost is <= budget, and load holds each bin's weight
    while done < n and not failed[0]:
        middle = (n - done) // m - exact_rounds
        if rounds >= exact_rounds and middle > 1:
            width = max(1, middle // 4) * m
            if _deal_block(order, done, width, w, c, lg, t, load, bc, bl, bt, bin_of, budget, kind, params):
                done += width
                continue
        done = _deal_round(order, done, n, w, c, lg, t, load, bc, bl, bt, bin_of, failed, budget, kind, params)
        rounds += 1
    return load, bc, bl, bt, bin_of, failed[0]


@njit(**_OPTS)
def _deal_round(order: Any, d: int, n: int, w: Any, c: Any, lg: Any, t: Any, load: Any, bc: Any, bl: Any, bt: Any,
                bin_of: Any, failed: Any, budget: float, kind: int, params: Any) -> int:
    """``_deal_round_one``: the i-th heaviest next unit to the i-th lightest bin; the new ``done``."""
    m, k = load.size, order.size
    first = w[max(order[min(d, k - 1)], 0)]
    if first > 0:
        low = load.min() + first
        below = 0
        for b in range(m):
            if load[b] < low:
                below += 1
        width = max(below, 1)
    else:
        width = m
    width = min(width, n - d)
    lightest = _stable(load)[:width]
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
        cheapest = _stable(cost)
        nu = units.size
        ok = np.zeros(nu, dtype=np.bool_)
        bs = np.empty(nu, dtype=np.int64)
        nc, nl, nt = np.empty(nu), np.empty(nu), np.empty(nu)
        for i in range(nu):
            u = units[i]
            b = cheapest[min(i, m - 1)]
            bs[i] = b
            nc[i], nl[i], nt[i] = bc[b] + c[u], max(bl[b], lg[u]), bt[b] + t[u]
            ok[i] = i < m and _cost(kind, params, nc[i], nl[i], nt[i]) <= budget
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
    step = np.empty(load.size, dtype=np.int64)
    for r in range(rows):
        heaviest = _stable(-load[r * nb:(r + 1) * nb])
        for p in range(nb):
            step[r * nb + heaviest[p]] = p // world if pooled else p
    return step


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
    step = _steps_of(load, rows, nb, pooled, world)
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
            order = _stable(-load[r * nb:(r + 1) * nb])
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
        by_step = _then(_stable(-load), step)
        first = np.ones(size, dtype=np.bool_)
        for i in range(1, size):
            first[i] = step[by_step[i]] != step[by_step[i - 1]]
        give = by_step[first]
        give = give[_then(_stable(-load[give]), row[give])]
        free = np.ones(size, dtype=np.bool_)
        free[give] = False
        cand = np.flatnonzero(free)
        cand = cand[_then(_stable(-slack[cand]), row[cand])]
        g_row, c_row = row[give], row[cand]
        keep = np.zeros(give.size, dtype=np.bool_)
        at = np.zeros(give.size, dtype=np.int64)
        for i in range(give.size):
            nth = i - _search(g_row, g_row[i], 0, give.size)
            start = _search(c_row, g_row[i], 0, cand.size)
            end = _search(c_row, g_row[i] + 1, 0, cand.size)
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
    """``_second_longest``: the unit holding each bin's longest size, and the bin's longest without it."""
    by_len = u[_then(_stable(lg[u]), flat[u])]
    fb = flat[by_len]
    top_id = np.full(n_bins, -1, dtype=np.int64)
    second = np.zeros(n_bins)
    for i in range(fb.size):
        if i == fb.size - 1 or fb[i + 1] != fb[i]:  # the bin's last (longest) unit
            top_id[fb[i]] = by_len[i]
            if i > 0 and fb[i - 1] == fb[i]:
                second[fb[i]] = lg[by_len[i - 1]]
    return top_id, second


@njit(**_OPTS)
def _one_pass(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, placed: Any, w: Any, c: Any, lg: Any, t: Any,
              budget: float, kind: int, params: Any, uses_max: bool, rows: int, nb: int, pooled: bool, world: int,
              mode: int, wide: int, paired: int, n_rounds: int) -> Any:
    """``_one_pass``: exchanges between the pairs of bins of :func:`_pairs`; (step time before, units worked on)."""
    h, l_, room, best, same, now = _pairs(load, rows, nb, pooled, world, mode, wide)
    n_pairs = h.size
    if n_pairs == 0:
        return now, 0
    nu, n_bins = w.size, load.size
    pair_of = np.full(n_bins, -1, dtype=np.int64)
    for i in range(n_pairs):
        pair_of[h[i]] = i
        pair_of[l_[i]] = i
    u = placed[pair_of[flat[placed]] >= 0]
    pair = pair_of[flat[u]]
    give = flat[u] == h[pair]
    wu = w[u]
    if uses_max:
        top_id, second = _second_longest(u, flat, lg, n_bins)
    else:
        top_id, second = np.full(n_bins, -1, dtype=np.int64), bl  # a model blind to the longest
    scale = w.max() + 1.0
    key = 2.0 * pair + wu / scale
    take = np.flatnonzero(~give)
    g = np.flatnonzero(give)
    take, g = take[_stable(key[take])], g[_stable(key[g])]
    t_key, gp, gw = key[take], pair[g], wu[g]
    take, g = u[take], u[g]
    n_take = np.zeros(n_pairs, dtype=np.int64)
    for i in range(take.size):
        n_take[pair_of[flat[take[i]]]] += 1
    hi = np.cumsum(n_take)
    lo = hi - n_take
    ng = g.size
    at = np.empty(ng, dtype=np.int64)
    for i in range(ng):
        at[i] = _search(t_key, 2.0 * gp[i] + max(gw[i] - best[gp[i]], 0.0) / scale, 0, take.size)
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
                i2 = _search(t_key, 2.0 * p + max(need, 0.0) / scale, 0, take.size)
                if i2 == i1:
                    i2 += 1
                if i2 < hi[p]:
                    cu[x], v1[x], v2[x], cp[x] = g[i], take[i1], take[i2], p
                    x += 1
    cu, v1, v2, cp = cu[:x], v1[:x], v2[:x], cp[:x]
    delta = np.empty(x)
    fits = np.empty(x, dtype=np.bool_)
    for i in range(x):
        d = w[cu[i]] - (w[v1[i]] if v1[i] >= 0 else 0.0) - (w[v2[i]] if v2[i] >= 0 else 0.0)
        delta[i] = d
        fits[i] = d > 0 and d <= room[cp[i]]
    cu, v1, v2, cp, delta = cu[fits], v1[fits], v2[fits], cp[fits], delta[fits]
    x = cu.size
    in_c, in_t, in_l = np.zeros(x), np.zeros(x), np.zeros(x)
    for i in range(x):
        a, b = v1[i], v2[i]
        ca, ta, la = (c[a], t[a], lg[a]) if a >= 0 else (0.0, 0.0, 0.0)
        cb, tb, lb_ = (c[b], t[b], lg[b]) if b >= 0 else (0.0, 0.0, 0.0)
        in_c[i], in_t[i], in_l[i] = ca + cb, ta + tb, max(la, lb_)
    used = np.zeros(nu, dtype=np.bool_)  # units moved in this pass
    touched = np.zeros(n_bins, dtype=np.bool_)  # bins changed in this pass (their longest an upper bound)
    for _ in range(n_rounds):  # invariant: each taking bin <= its step's slowest at the pass's start
        ok = np.empty(cu.size, dtype=np.bool_)
        for i in range(cu.size):
            ok[i] = not (used[cu[i]] or (v1[i] >= 0 and used[v1[i]]) or (v2[i] >= 0 and used[v2[i]])) and \
                delta[i] <= room[cp[i]]
        if not ok.any():
            break
        cu, v1, v2, cp, delta = cu[ok], v1[ok], v2[ok], cp[ok], delta[ok]
        in_c, in_t, in_l = in_c[ok], in_t[ok], in_l[ok]
        x = cu.size
        hc, ht, hl = np.empty(x), np.empty(x), np.empty(x)
        lc, lt, ll = np.empty(x), np.empty(x), np.empty(x)
        good = np.zeros(x, dtype=np.bool_)
        for i in range(x):
            hb, lb = h[cp[i]], l_[cp[i]]
            one, two = v1[i] >= 0, v2[i] >= 0
            hc[i] = bc[hb] - c[cu[i]] + in_c[i]
            ht[i] = bt[hb] - t[cu[i]] + in_t[i]
            hl[i] = max(second[hb] if top_id[hb] == cu[i] and not touched[hb] else bl[hb], in_l[i])
            lc[i] = bc[lb] + c[cu[i]] - in_c[i]
            lt[i] = bt[lb] + t[cu[i]] - in_t[i]
            keep_l = second[lb] if one and not two and top_id[lb] == v1[i] and not touched[lb] else bl[lb]
            ll[i] = max(keep_l, lg[cu[i]])
            good[i] = _cost(kind, params, hc[i], hl[i], ht[i]) <= budget and \
                _cost(kind, params, lc[i], ll[i], lt[i]) <= budget
        idx = np.flatnonzero(good)
        if idx.size == 0:
            break
        score = np.empty(idx.size)
        for j in range(idx.size):
            i = idx[j]
            score[j] = min(delta[i], 2 * best[cp[i]] - delta[i])
        idx = idx[_then(_stable(-score), cp[idx])]
        for j in range(idx.size):  # the best exchange of each pair (distinct pairs: distinct bins)
            i = idx[j]
            p = cp[i]
            if j > 0 and cp[idx[j - 1]] == p:
                continue
            hb, lb, d = h[p], l_[p], delta[i]
            load[hb] -= d
            load[lb] += d
            bc[hb], bt[hb], bl[hb] = hc[i], ht[i], hl[i]
            bc[lb], bt[lb], bl[lb] = lc[i], lt[i], ll[i]
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
    return now, u.size


@njit(**_OPTS)
def refine(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, placed: Any, w: Any, c: Any, lg: Any, t: Any,
           budget: float, kind: int, params: Any, uses_max: bool, rows: int, nb: int, pooled: bool, world: int,
           ideal: float, most: int, balance: bool, consts: Any) -> None:
    """``refine``'s passes on flat bins, in place (``consts``: VISITS, GAIN, GAIN_B, WIDE, PAIRED, ROUNDS)."""
    visits, gain, gain_b = consts[0], consts[1], consts[2]
    wide, paired, n_rounds = int(consts[3]), int(consts[4]), int(consts[5])
    times = np.empty(most)
    n_times = 0
    work = 0
    for _ in range(most):  # balance passes while they gain, then the others
        if balance:  # not bound to the micro-steps' slowest bins: undone if the step got slower
            kept = (load.copy(), bc.copy(), bl.copy(), bt.copy(), flat.copy())
            before, done = _one_pass(load, bc, bl, bt, flat, placed, w, c, lg, t, budget, kind, params, uses_max,
                                     rows, nb, pooled, world, 0, wide, paired, n_rounds)
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
