"""After packing: lower the step's time, the sum over micro-steps of the slowest micro-batch.

The bins of a step are laid out as micro-steps by sorting (:func:`steps_of`): for a pool of
``world * m`` bins, the heaviest ``world`` make micro-step 0, and so on; for ``world`` rows of
``m`` bins (one row per rank, units kept on their rank), each row's ``j``-th heaviest bin runs in
micro-step ``j``. Either layout is the best one for the bins' loads, so the step's time only
depends on the loads. Each pass of :func:`refine` pairs the slowest bin of every micro-step
(its *critical* bin) with another bin of the same row that has *slack* (room below its own
micro-step's slowest one), and moves one unit from the critical bin to it, or swaps a unit of
each, choosing the exchange that lowers the critical bin most without lifting the other bin
over its micro-step's slowest (or, in the same micro-step, over the critical bin's new load).
An exchange is made only if both bins still cost at most the budget under the cost model. So
no micro-step's slowest bin gets slower, and the next pass lays the bins out again (never
worse): the step's time never rises. Passes stop when none lowers it, or after ``passes``.
"""

from __future__ import annotations

import numpy as np

from fitbatch.costs import CostModel
from fitbatch.steps._pack import Bins, FloatArray, IntArray, Units

#: at most this many passes (each a few numpy calls over the units of the paired bins)
PASSES = 24
#: a pass that lowers the step time by less than this fraction gains nothing
GAIN = 1e-5


def steps_of(load: FloatArray, pooled: bool, world: int) -> IntArray:
    """The micro-step of each bin of ``load`` (``(rows, nb)``), laid out as the step runs them."""
    heaviest = np.argsort(-load, axis=1, kind="stable")
    pos = np.empty_like(heaviest)
    np.put_along_axis(pos, heaviest, np.arange(load.shape[1])[None, :], axis=1)
    return pos // world if pooled else pos


def step_time(load: FloatArray, pooled: bool, world: int) -> float:
    """The sum over micro-steps of the slowest bin (``pooled``: rows of ``world * m`` bins)."""
    if load.size == 0:
        return 0.0
    step = steps_of(load, pooled, world)
    slowest = np.zeros(int(step.max()) + 1)
    np.maximum.at(slowest, step.ravel(), load.ravel())
    return float(slowest.sum())


def refine(bins: Bins, row_of_unit: IntArray, units: Units, budget: float, model: CostModel, *, pooled: bool,
           world: int, passes: int = PASSES) -> Bins:
    """Lower the step time of ``bins`` in place (see the module's docstring) and return them.

    Args:
        bins: the packed bins, ``(rows, nb)``; ``bin_of`` indexes a unit's bin in its row.
        row_of_unit: the row of each unit (units with ``bin_of < 0`` are not placed).
        units: the units' weights and (count, max, sum).
        budget: the cap every bin that was under it stays under.
        model: the cap's cost model.
        pooled: one row of ``world * m`` bins (any unit may go to any bin), else one row per
            rank of ``m`` bins (a unit stays in its row).
        world: the bins of a micro-step.
        passes: at most this many passes.
    """
    rows, nb = bins.load.shape
    if nb == 0 or world == 1 and pooled or not pooled and nb == 1:
        return bins
    placed = np.flatnonzero(bins.bin_of >= 0)
    flat = np.full(bins.bin_of.size, -1, dtype=np.int64)
    flat[placed] = row_of_unit[placed] * nb + bins.bin_of[placed]
    load, count, longest, total = (a.reshape(-1).copy() for a in (bins.load, bins.count, bins.longest, bins.total))
    stalled, before = 0, step_time(load.reshape(rows, nb), pooled, world)
    for t in range(passes):  # wide and narrow pairings in turn, until two passes in a row gain ~nothing
        _one_pass(load, count, longest, total, flat, placed, units, budget, model, rows, nb, pooled, world, t % 2 == 0)
        now = step_time(load.reshape(rows, nb), pooled, world)
        stalled = stalled + 1 if now > before * (1 - GAIN) else 0
        if stalled == 2:
            break
        before = now
    bins.load, bins.count = load.reshape(rows, nb), count.reshape(rows, nb)
    bins.longest, bins.total = longest.reshape(rows, nb), total.reshape(rows, nb)
    bins.bin_of[placed] = flat[placed] % nb
    return bins


def _pairs(load: FloatArray, rows: int, nb: int, pooled: bool, world: int, wide: bool) -> tuple[IntArray, IntArray,
                                                                                                 FloatArray, FloatArray]:
    """(giving bin, taking bin, the most weight it may pass, the best to pass) of each pair.

    In each row, the givers (``wide``: the half of the bins with the least slack, room below
    their micro-step's slowest bin; else each micro-step's slowest bin, heaviest first) are
    paired in order with the other bins, most slack first."""
    row = np.arange(load.size) // nb
    step = steps_of(load.reshape(rows, nb), pooled, world).ravel()
    slowest = np.zeros(int(step.max()) + 1)
    np.maximum.at(slowest, step, load)
    slack = slowest[step] - load
    if wide:
        order = np.lexsort((-load, slack, row)).reshape(rows, nb)
        half = nb // 2
        give, take = order[:, :half].ravel(), order[:, ::-1][:, :half].ravel()
    else:
        by_step = np.lexsort((-load, step))
        give = by_step[np.r_[True, step[by_step][1:] != step[by_step][:-1]]]
        give = give[np.lexsort((-load[give], row[give]))]
        free = np.ones(load.size, dtype=bool)
        free[give] = False
        cand = np.flatnonzero(free)
        cand = cand[np.lexsort((-slack[cand], row[cand]))]
        nth = np.arange(give.size) - np.searchsorted(row[give], row[give])
        at = np.searchsorted(row[cand], row[give]) + nth
        ok = at < np.searchsorted(row[cand], row[give], side="right")
        give, take = give[ok], cand[at[ok]]
    ok = (slack[give] < slack[take]) & (load[give] > 0)
    give, take = give[ok], take[ok]
    same = step[give] == step[take]
    room = np.where(same, load[give] - load[take], slack[take])
    return give, take, room, np.where(same, room / 2, room)


def _one_pass(load: FloatArray, count: FloatArray, longest: FloatArray, total: FloatArray, flat: IntArray,
              placed: IntArray, units: Units, budget: float, model: CostModel, rows: int, nb: int, pooled: bool,
              world: int, wide: bool) -> bool:
    """One exchange per pair of bins (:func:`_pairs`); whether any was made."""
    h, l_, room, best = _pairs(load, rows, nb, pooled, world, wide)
    if h.size == 0:
        return False
    pair_of = np.full(load.size, -1, dtype=np.int64)
    pair_of[h], pair_of[l_] = np.arange(h.size), np.arange(h.size)
    u = placed[pair_of[flat[placed]] >= 0]
    pair = pair_of[flat[u]]
    give = flat[u] == h[pair]  # in the critical bin
    w = units.weight[u]
    # longest but one of each paired bin, for the longest after a unit leaves
    top_id = np.full(load.size, -1, dtype=np.int64)
    second = longest  # a model blind to the longest size: the old longest is as good as any
    if model.uses_max:
        top_id, second = _second_longest(u, flat, units, load.size)
    # every unit of a pair by (pair, weight): the key's integer part is twice the pair, its
    # fraction the weight (each given unit is looked up among the partner's, both sorted)
    scale = float(units.weight.max()) + 1.0
    key = 2.0 * pair + w / scale
    take, g = np.flatnonzero(~give), np.flatnonzero(give)
    take, g = take[np.argsort(key[take])], g[np.argsort(key[g])]
    t_key, gp, gw = key[take], pair[g], w[g]
    take, g = u[take], u[g]
    at = np.searchsorted(t_key, 2.0 * gp + np.maximum(gw - best[gp], 0.0) / scale)  # delta <= best from here
    hi_b = np.cumsum(np.bincount(pair_of[flat[take]], minlength=h.size))
    lo_b = hi_b - np.bincount(pair_of[flat[take]], minlength=h.size)
    lo_b, hi_b = lo_b[gp], hi_b[gp]
    last = max(take.size - 1, 0)
    cands_u = [g, g, g]
    cands_v = [np.full(g.size, -1, dtype=np.int64),
               np.where(at < hi_b, take[np.minimum(at, last)], -2) if take.size else np.full(g.size, -2),
               np.where(at - 1 >= lo_b, take[np.clip(at - 1, 0, last)], -2) if take.size else np.full(g.size, -2)]
    cu, cv = np.concatenate(cands_u), np.concatenate(cands_v)
    cp = np.concatenate([gp, gp, gp])
    keep = cv != -2
    cu, cv, cp = cu[keep], cv[keep], cp[keep]
    swap = cv >= 0
    v = np.maximum(cv, 0)
    wv = np.where(swap, units.weight[v], 0.0)
    delta = units.weight[cu] - wv
    same_step = best[cp] < room[cp]
    fits = (delta > 0) & np.where(same_step, delta < room[cp], delta <= room[cp])
    score = np.minimum(delta, 2 * best[cp] - delta)
    hb, lb = h[cp], l_[cp]
    cv_, cl_, ct_ = (np.where(swap, a[v], 0.0) for a in (units.count, units.longest, units.total))
    h_count = count[hb] - units.count[cu] + cv_
    h_total = total[hb] - units.total[cu] + ct_
    h_long = np.maximum(np.where(top_id[hb] == cu, second[hb], longest[hb]), cl_)
    l_count = count[lb] + units.count[cu] - cv_
    l_total = total[lb] + units.total[cu] - ct_
    l_keep = np.where(swap & (top_id[lb] == v), second[lb], longest[lb])
    l_long = np.maximum(l_keep, units.longest[cu])
    costs = model.evaluate(np.r_[h_count, l_count], np.r_[h_long, l_long], np.r_[h_total, l_total])
    fits &= (costs[: cu.size] <= budget) & (costs[cu.size :] <= budget)
    if not fits.any():
        return False
    idx = np.flatnonzero(fits)
    idx = idx[np.lexsort((-score[idx], cp[idx]))]
    idx = idx[np.r_[True, cp[idx][1:] != cp[idx][:-1]]]  # the best exchange of each pair
    hb, lb, d = hb[idx], lb[idx], delta[idx]
    load[hb] -= d
    load[lb] += d
    count[hb], total[hb], longest[hb] = h_count[idx], h_total[idx], h_long[idx]
    count[lb], total[lb], longest[lb] = l_count[idx], l_total[idx], l_long[idx]
    flat[cu[idx]] = lb
    sw = swap[idx]
    flat[v[idx][sw]] = hb[sw]
    return True


def _second_longest(u: IntArray, flat: IntArray, units: Units, n_bins: int) -> tuple[IntArray, FloatArray]:
    """The unit holding each bin's longest size (among ``u``; -1: none), and the longest size
    of the bin without it (0 if it is alone)."""
    by_len = u[np.lexsort((units.longest[u], flat[u]))]
    fb = flat[by_len]
    last = np.r_[fb[1:] != fb[:-1], True]
    top_id = np.full(n_bins, -1, dtype=np.int64)
    top_id[fb[last]] = by_len[last]
    second = np.zeros(n_bins)
    below = np.flatnonzero(last) - 1
    has = (below >= 0) & (fb[np.maximum(below, 0)] == fb[last])
    second[fb[last][has]] = units.longest[by_len[below[has]]]
    return top_id, second
