"""The compiled refinement of a step's micro-batches (numba): :mod:`fitbatch.steps._refine`'s
passes (exchanges of units between the bins of the slowest micro-steps and their partners), the
same decisions in the same order as the numpy form.

The step time is a sum over micro-steps, pairwise in numpy and in order here: the caller uses
:func:`refine` only where every load is a whole number below ``2**53``, so that each sum is
exact in any order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from fitbatch._kernels.steps_common import OPTS, _cost, _search, _stable, _then

#: from this many units the passes take them from one sort by weight (below: each pass sorts its
#: own, as fast for so few)
PRESORT_FROM = 1024


@njit(**OPTS)
def _steps_heaviest(load: Any, rows: int, nb: int, pooled: bool, world: int, known: Any) -> Any:
    """``steps_of``, flat, and each row's bins heaviest first (``(rows, nb)``: positions in the
    row, the stable order the micro-steps come from; ``known``: that order of one row's loads,
    where the caller has it, else empty)."""
    step = np.empty(load.size, dtype=np.int64)
    order = np.empty((rows, nb), dtype=np.int64)
    for r in range(rows):
        heaviest = known if known.size == nb and rows == 1 else _stable(-load[r * nb:(r + 1) * nb])
        order[r] = heaviest
        for p in range(nb):
            step[r * nb + heaviest[p]] = p // world if pooled else p
    return step, order


@njit(**OPTS)
def _heaviest_time(load: Any, world: int) -> Any:
    """:func:`step_time` of one pooled row and its bins heaviest first (the stable order, which
    :func:`_steps_heaviest` then need not sort again): (step time, order)."""
    nb = load.size
    heaviest = _stable(-load)
    n_steps = (nb + world - 1) // world
    slowest = np.zeros(n_steps)
    for s in range(n_steps):
        v = load[heaviest[s * world]]
        if v > slowest[s]:
            slowest[s] = v
    return slowest.sum(), heaviest


@njit(**OPTS)
def _slowest(load: Any, step: Any) -> Any:
    slowest = np.zeros(step.max() + 1)
    for i in range(load.size):
        if load[i] > slowest[step[i]]:
            slowest[step[i]] = load[i]
    return slowest


@njit(**OPTS)
def step_time(load: Any, rows: int, nb: int, pooled: bool, world: int) -> float:
    """``step_time`` of flat loads (in-order sum: exact for whole-number loads below 2**53)."""
    if load.size == 0:
        return 0.0
    # a micro-step's slowest load is a value of the row's loads sorted (the p-th heaviest bin makes
    # micro-step p // world, pooled, or p): the values alone, no stable order of the bins
    n_steps = (nb + world - 1) // world if pooled else nb
    slowest = np.zeros(n_steps)
    for r in range(rows):
        ascending = np.sort(load[r * nb:(r + 1) * nb])
        for s in range(n_steps):
            v = ascending[nb - 1 - (s * world if pooled else s)]
            if v > slowest[s]:
                slowest[s] = v
    return slowest.sum()


@njit(**OPTS)
def _pairs(load: Any, rows: int, nb: int, pooled: bool, world: int, mode: int, wide: int, known: Any) -> Any:
    """``_pairs`` (mode 0 balance, 1 wide, 2 narrow): give, take, room, best, same, step time
    (``known``: the bins heaviest first where the caller has them, else empty)."""
    size = load.size
    row = np.arange(size) // nb
    step, heaviest = _steps_heaviest(load, rows, nb, pooled, world, known)
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


@njit(**OPTS)
def _second_longest(placed: Any, flat: Any, pair_of: Any, lg: Any, n_bins: int) -> Any:
    """``_second_longest`` in one scan of the units of the pass (``u``: those of ``placed`` in a
    pair's bin, in its order): the unit holding each bin's longest size (the last of ``u`` among
    equals, as the stable sort there leaves it), and the bin's longest without it (the next in that
    order: the second largest size, equal to the longest on a tie; 0 alone); and ``u``'s size."""
    top_id = np.full(n_bins, -1, dtype=np.int64)
    top = np.zeros(n_bins)
    second = np.zeros(n_bins)
    n_u = 0
    for i in range(placed.size):
        x = placed[i]
        b, v = flat[x], lg[x]
        if pair_of[b] < 0:
            continue
        n_u += 1
        if top_id[b] < 0:
            top_id[b], top[b] = x, v
        elif v >= top[b]:
            second[b], top[b], top_id[b] = top[b], v, x
        elif v > second[b]:
            second[b] = v
    return top_id, second, n_u


@njit(**OPTS)
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


@njit(**OPTS)
def _one_pass(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, placed: Any, w: Any, c: Any, lg: Any, t: Any,
              budget: float, kind: int, params: Any, uses_max: bool, rows: int, nb: int, pooled: bool, world: int,
              mode: int, wide: int, paired: int, n_rounds: int, by_w: Any, have: Any, known: Any) -> Any:
    """``_one_pass``: exchanges between the pairs of bins of :func:`_pairs`; (step time before, units worked on).
    ``by_w``: room for the placed units by weight, ties by unit (:func:`_presort_room`), filled
    where ``have[0]``."""
    h, l_, room, best, same, now = _pairs(load, rows, nb, pooled, world, mode, wide, known)
    n_pairs = h.size
    if n_pairs == 0:
        return now, 0
    n_bins = load.size
    pair_of = np.full(n_bins, -1, dtype=np.int64)
    for i in range(n_pairs):
        pair_of[h[i]] = i
        pair_of[l_[i]] = i
    if uses_max:  # the units of the pairs (`u`, in `placed`'s order), each bin's longest and second
        top_id, second, n_u = _second_longest(placed, flat, pair_of, lg, n_bins)
    else:
        top_id, second = np.full(n_bins, -1, dtype=np.int64), bl  # a model blind to the longest
        n_u = 0
        for i in range(placed.size):
            n_u += pair_of[flat[placed[i]]] >= 0
    # the presorted units where the pairs hold a good part of them (two scans of all; else a sort of
    # theirs), sorted at the first such pass; already sorted (partition_pool's), from a 64th of them
    # (the other way scans all units too, to find theirs)
    presorted = by_w[:0]
    if by_w.size and (4 * n_u >= by_w.size or have[0] and 64 * n_u >= by_w.size):
        if not have[0]:
            by_w[:] = placed[_stable(w[placed])]
            have[0] = True
        presorted = by_w
    cu, v1, v2, cp, delta, in_c, in_t, in_l = _candidates(placed, flat, pair_of, w, c, lg, t, room, best, n_pairs,
                                                          mode, paired, presorted, h)
    _exchange(load, bc, bl, bt, flat, w, c, lg, t, budget, kind, params, h, l_, room, best, same, top_id, second,
              cu, v1, v2, cp, delta, in_c, in_t, in_l, n_rounds)
    return now, n_u


@njit(**OPTS)
def _sides(u: Any, pair: Any, give: Any, w: Any, scale: float, n_pairs: int) -> Any:
    """The pass's units by pair, then weight (key ``2 * pair + weight / scale``, stably: ties by
    position in ``u``), taking and giving apart: (taking units, their keys, giving units, their
    pairs, their weights, each pair's number of taking units)."""
    wu = w[u]
    key = 2.0 * pair + wu / scale
    take = np.flatnonzero(~give)
    g = np.flatnonzero(give)
    take, g = _by_pair(take, pair, key, n_pairs), _by_pair(g, pair, key, n_pairs)
    n_take = np.zeros(n_pairs, dtype=np.int64)
    for i in range(take.size):
        n_take[pair[take[i]]] += 1
    return u[take], key[take], u[g], pair[g], wu[g], n_take


@njit(**OPTS)
def _sides_presorted(by_w: Any, flat: Any, pair_of: Any, h: Any, w: Any, scale: float, n_pairs: int) -> Any:
    """:func:`_sides` from ``by_w`` (the placed units by weight, ties by unit; ``u`` ascending):
    a counting sort by pair keeps that order within each pair. It is the stable sort by key where
    the keys it gives are in order, equal keys by unit (else distinct weights met in one key:
    ``ok`` false, and :func:`_sides` sorts): (ok, the sides)."""
    n_take = np.zeros(n_pairs, dtype=np.int64)
    n_give = np.zeros(n_pairs, dtype=np.int64)
    for i in range(by_w.size):
        x = by_w[i]
        p = pair_of[flat[x]]
        if p >= 0:
            if flat[x] == h[p]:
                n_give[p] += 1
            else:
                n_take[p] += 1
    t_at = np.empty(n_pairs, dtype=np.int64)
    g_at = np.empty(n_pairs, dtype=np.int64)
    nt, ng = 0, 0
    for p in range(n_pairs):
        t_at[p], g_at[p] = nt, ng
        nt += n_take[p]
        ng += n_give[p]
    take = np.empty(nt, dtype=np.int64)
    t_key = np.empty(nt)
    g = np.empty(ng, dtype=np.int64)
    gp = np.empty(ng, dtype=np.int64)
    gw = np.empty(ng)
    for i in range(by_w.size):
        x = by_w[i]
        p = pair_of[flat[x]]
        if p >= 0:
            if flat[x] == h[p]:
                j = g_at[p]
                g[j], gp[j], gw[j] = x, p, w[x]
                g_at[p] = j + 1
            else:
                j = t_at[p]
                take[j], t_key[j] = x, 2.0 * p + w[x] / scale
                t_at[p] = j + 1
    for j in range(1, nt):  # the order of the keys (equal ones by unit): the stable sort's
        if t_key[j] < t_key[j - 1] or t_key[j] == t_key[j - 1] and take[j] < take[j - 1]:
            return False, take, t_key, g, gp, gw, n_take
    for j in range(1, ng):
        kj, kp = 2.0 * gp[j] + gw[j] / scale, 2.0 * gp[j - 1] + gw[j - 1] / scale
        if kj < kp or kj == kp and g[j] < g[j - 1]:
            return False, take, t_key, g, gp, gw, n_take
    return True, take, t_key, g, gp, gw, n_take


@njit(**OPTS)
def _candidates(placed: Any, flat: Any, pair_of: Any, w: Any, c: Any, lg: Any, t: Any, room: Any, best: Any,
                n_pairs: int, mode: int, paired: int, by_w: Any, h: Any) -> Any:
    """A pass's candidate exchanges (``_one_pass`` up to its rounds): the given unit, the one
    or two units coming back (-1: none), the pair, the weight passed, and what comes back's
    count, total and longest; those that pass a positive weight within the pair's room.
    ``by_w``: the placed units by weight (ties by unit), where ``u`` is ascending; else empty."""
    scale = w.max() + 1.0
    ok = by_w.size > 0
    if ok:
        ok, take, t_key, g, gp, gw, n_take = _sides_presorted(by_w, flat, pair_of, h, w, scale, n_pairs)
    if not ok:  # the units of the pairs, by pair and weight
        u = placed[pair_of[flat[placed]] >= 0]
        pair = pair_of[flat[u]]
        give = flat[u] == h[pair]
        take, t_key, g, gp, gw, n_take = _sides(u, pair, give, w, scale, n_pairs)
    hi = np.cumsum(n_take)
    lo = hi - n_take
    ng = g.size
    at = np.empty(ng, dtype=np.int64)
    # a search key 2 * p + x (0 <= x < 1: the weight passed is under the scale) lies above every
    # key of the pairs before p and below every key of those after: searching the pair's own
    # partners finds the position a search of all of them finds (fewer, unpredictable, steps)
    for i in range(ng):
        at[i] = _search(t_key, 2.0 * gp[i] + max(gw[i] - best[gp[i]], 0.0) / scale, lo[gp[i]], hi[gp[i]])
    n_heavy_reps = 0
    if mode == 2 and take.size:
        n_give = np.zeros(n_pairs, dtype=np.int64)
        for i in range(ng):
            n_give[gp[i]] += 1
        c_give = np.cumsum(n_give)
        for i in range(ng):
            if i >= c_give[gp[i]] - paired:
                n_heavy_reps += n_take[gp[i]]
    # candidates, in this order: each given unit for none, for the partner unit at `at`, for the
    # one before it, then the heavy ones for two; only those passing a positive weight within the
    # pair's room are written (the order of those kept, as a filter of all of them keeps it)
    total = 3 * ng + n_heavy_reps
    cu = np.empty(total, dtype=np.int64)
    v1 = np.empty(total, dtype=np.int64)
    v2 = np.empty(total, dtype=np.int64)
    cp = np.empty(total, dtype=np.int64)
    delta = np.empty(total)
    in_c, in_t, in_l = np.empty(total), np.empty(total), np.empty(total)
    x = 0
    for i in range(ng):
        p = gp[i]
        d = gw[i]
        if d > 0 and d <= room[p]:
            cu[x], v1[x], v2[x], cp[x], delta[x] = g[i], -1, -1, p, d
            in_c[x], in_t[x], in_l[x] = 0.0, 0.0, 0.0
            x += 1
    for i in range(ng):
        p = gp[i]
        if at[i] < hi[p]:
            a = take[at[i]]
            d = gw[i] - w[a]
            if d > 0 and d <= room[p]:
                cu[x], v1[x], v2[x], cp[x], delta[x] = g[i], a, -1, p, d
                in_c[x], in_t[x], in_l[x] = c[a], t[a], max(lg[a], 0.0)
                x += 1
    for i in range(ng):
        p = gp[i]
        if at[i] > lo[p]:
            a = take[at[i] - 1]
            d = gw[i] - w[a]
            if d > 0 and d <= room[p]:
                cu[x], v1[x], v2[x], cp[x], delta[x] = g[i], a, -1, p, d
                in_c[x], in_t[x], in_l[x] = c[a], t[a], max(lg[a], 0.0)
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
                    a, b = take[i1], take[i2]
                    d = w[g[i]] - w[a] - w[b]
                    if d > 0 and d <= room[p]:
                        cu[x], v1[x], v2[x], cp[x], delta[x] = g[i], a, b, p, d
                        in_c[x], in_t[x], in_l[x] = c[a] + c[b], t[a] + t[b], max(lg[a], lg[b])
                        x += 1
    cu, v1, v2, cp, delta = cu[:x], v1[:x], v2[:x], cp[:x], delta[:x]
    in_c, in_t, in_l = in_c[:x], in_t[:x], in_l[:x]
    return cu, v1, v2, cp, delta, in_c, in_t, in_l


@njit(**OPTS)
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


@njit(**OPTS)
def refine(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, placed: Any, w: Any, c: Any, lg: Any, t: Any,
           budget: float, kind: int, params: Any, uses_max: bool, rows: int, nb: int, pooled: bool, world: int,
           ideal: float, most: int, balance: bool, consts: Any) -> None:
    """``refine``'s passes on flat bins, in place (``consts``: VISITS, GAIN, GAIN_B, WIDE, PAIRED, ROUNDS)."""
    _passes(load, bc, bl, bt, flat, placed, w, c, lg, t, budget, kind, params, uses_max, rows, nb, pooled, world,
            ideal, most, balance, consts, _presort_room(placed), np.zeros(1, dtype=np.bool_), np.zeros(0, dtype=np.int64))


@njit(**OPTS)
def _presort_room(placed: Any) -> Any:
    """Room for the placed units by weight, ties by unit (a pass sorts them there when first
    needed), where ``placed`` is ascending and holds at least ``PRESORT_FROM``; else empty (the
    passes sort their units by pair and weight themselves)."""
    if placed.size < PRESORT_FROM:
        return np.zeros(0, dtype=np.int64)
    for i in range(1, placed.size):
        if placed[i] <= placed[i - 1]:
            return np.zeros(0, dtype=np.int64)
    return np.empty(placed.size, dtype=np.int64)


@njit(**OPTS)
def _passes(load: Any, bc: Any, bl: Any, bt: Any, flat: Any, placed: Any, w: Any, c: Any, lg: Any, t: Any,
            budget: float, kind: int, params: Any, uses_max: bool, rows: int, nb: int, pooled: bool, world: int,
            ideal: float, most: int, balance: bool, consts: Any, by_w: Any, have: Any, known: Any) -> None:
    """:func:`refine` with the presort's room ``by_w`` (:func:`_presort_room`) given, filled where ``have[0]``;
    ``known``: the bins heaviest first where the caller has them (one pooled row), else empty."""
    visits, gain, gain_b = consts[0], consts[1], consts[2]
    wide, paired, n_rounds = int(consts[3]), int(consts[4]), int(consts[5])
    times = np.empty(most)
    n_times = 0
    balance_mode = np.int64(0)  # not a literal: one specialisation of _one_pass
    work = 0
    one_row = rows == 1 and pooled
    none = np.zeros(0, dtype=np.int64)  # no order known: the pass sorts
    for _ in range(most):  # balance passes while they gain, then the others
        if balance:  # not bound to the micro-steps' slowest bins: undone if the step got slower
            kept = (load.copy(), bc.copy(), bl.copy(), bt.copy(), flat.copy())
            before, done = _one_pass(load, bc, bl, bt, flat, placed, w, c, lg, t, budget, kind, params, uses_max,
                                     rows, nb, pooled, world, balance_mode, wide, paired, n_rounds, by_w, have, known)
            if one_row:  # the order the step time comes from is the next pass's
                after, known = _heaviest_time(load, world)
            else:
                after, known = step_time(load, rows, nb, pooled, world), none
            if after > before:
                load[:], bc[:], bl[:], bt[:], flat[:] = kept
                known = none
            balance = after < before * (1 - gain_b) and after > ideal
        else:
            now, done = _one_pass(load, bc, bl, bt, flat, placed, w, c, lg, t, budget, kind, params, uses_max,
                                  rows, nb, pooled, world, 1 + n_times % 2, wide, paired, n_rounds, by_w, have, known)
            known = none
            times[n_times] = now
            n_times += 1
            if now <= ideal or n_times >= 3 and now > times[n_times - 3] * (1 - gain):
                break
        work += done
        if work >= visits:
            break
