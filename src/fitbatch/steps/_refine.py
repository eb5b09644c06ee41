"""After packing: lower the step's time, the sum over micro-steps of the slowest micro-batch.

The bins of a step are laid out as micro-steps by sorting (:func:`steps_of`): for a pool of
``world * m`` bins, the heaviest ``world`` make micro-step 0, and so on; for ``world`` rows of
``m`` bins (one row per rank, units kept on their rank), each row's ``j``-th heaviest bin runs in
micro-step ``j``. Either layout is the best one for the bins' loads (sorted groups minimise a sum
of group maxima), so the step's time only depends on the loads.

Each pass of :func:`refine` pairs bins of a row: a *giving* bin (the slowest of its micro-step,
or one with little *slack*, room below its micro-step's slowest bin) with a *taking* bin of much
slack, and makes up to ``ROUNDS`` exchanges per pair: one unit of the giving bin for none, one,
or two units of the taking bin, the one that lowers the giving bin most without lifting the
taking bin over its micro-step's slowest (or, within one micro-step, over the giving bin's new
load). An exchange is made only if both bins still cost at most the budget under the cost
model (their count, longest and total recomputed; the longest kept as an upper bound once a bin
changed within the pass). So no micro-step's slowest bin gets slower, and the next pass lays
the bins out again (never worse): the step's time never rises. Wide passes (many pairs) and
narrow ones (each micro-step's slowest bin, trying one of its heavy units for two lighter ones:
that moves the convex part of a workload such as ``L**2`` at about the same tokens, when no bin
has room for more) alternate until two passes in a row gain under ``GAIN``, the step is within
``CLOSE`` of its mean, or at the budget: a pass costs a few dozen numpy calls plus work on the
paired bins' units, so small steps get a few passes (one per ``UNITS_PER_PASS`` units, at least
``PASSES_SMALL``, at most ``PASSES``) and large ones passes until they worked on ``VISITS``
units, about what the packing costs. On steps of at most ``BALANCED_UP_TO`` units, balance
passes come first, while each gains ``GAIN_B``: the heavier half of a row's bins paired with the
lighter half, each pair's heavier bin only getting lighter (not bound to the micro-steps'
slowest bins, so a balance pass is undone if the step got slower); few units a bin make the
greedy's bins coarse, and these passes even them out fast. Deterministic: no randomness, the
same step gives the same exchanges.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fitbatch.costs import CostModel
from fitbatch.steps import _compiled
from fitbatch.steps._pack import Bins, FloatArray, IntArray, Units

#: at most this many passes (each a few numpy calls over the units of the paired bins), and on
#: steps of fewer than UNITS_PER_PASS * PASSES units one pass per UNITS_PER_PASS units, but at
#: least PASSES_SMALL (on the bench's 54 steps, two passes at N <= 2,048 reach what four did,
#: to within 0.0002 of efficiency, for 0.6 ms less)
PASSES = 24
PASSES_SMALL = 2
UNITS_PER_PASS = 1024
#: passes stop once they have worked on this many units (summed over passes)
VISITS = 32768
#: a pass that lowers the step time by less than this fraction gains nothing
GAIN = 1e-6
#: a narrow pass tries each of the giving bin's this many heaviest units for two of the other's
PAIRED = 4
#: rounds of exchanges in a pass (one per pair a round, each unit moved at most once a pass)
ROUNDS = 4
#: a step within this fraction of its mean (perfect balance) is not refined further
CLOSE = 5e-5
#: balance passes (heaviest bins with lightest, kept only if the step got faster) first, for at most this many units
BALANCED_UP_TO = 16384
#: ... while a balance pass gains at least this fraction
GAIN_B = 1e-5
#: a wide pass pairs this fraction (1 / WIDE) of a row's bins, least slack first, with as many of most slack
WIDE = 4
# the compiled passes' constants (fitbatch._kernels.steps.refine)
_CONSTS = np.array([VISITS, GAIN, GAIN_B, WIDE, PAIRED, ROUNDS], dtype=np.float64)


def steps_of(load: FloatArray, pooled: bool, world: int) -> IntArray:
    """The micro-step of each bin of ``load`` (``(rows, nb)``), laid out as the step runs them."""
    rows, nb = load.shape
    heaviest = np.argsort(-load, axis=1, kind="stable")
    pos = np.empty_like(heaviest)
    pos[np.arange(rows)[:, None], heaviest] = np.arange(nb)
    return pos // world if pooled else pos


def step_time(load: FloatArray, pooled: bool, world: int, exact: bool = False) -> float:
    """The sum over micro-steps of the slowest bin (``pooled``: rows of ``world * m`` bins;
    ``exact``: every load a whole number, their total below ``2**52``, so any order sums alike)."""
    if load.size == 0:
        return 0.0
    if exact:  # whole loads below 2**52: the compiled in-order sum is the pairwise one
        module = _compiled.kernels()
        if module is not None:
            return float(module.step_time(np.ascontiguousarray(load).reshape(-1), load.shape[0], load.shape[1],
                                          pooled, world))
    # micro-step j's slowest bin is the j-th heaviest load (``pooled``: the (j * world)-th of the
    # row; else the most, over rows, of each row's j-th heaviest): the values steps_of's layout
    # gives, in the same order, so the same sum
    if pooled and load.shape[0] == 1:
        slowest = np.ascontiguousarray(np.sort(load[0])[::-1][::world])
    elif pooled:
        step = steps_of(load, pooled, world)
        slowest = np.zeros(int(step.max()) + 1)
        np.maximum.at(slowest, step.ravel(), load.ravel())
    else:
        slowest = np.sort(load, axis=1).max(axis=0)[::-1].copy()
    return float(slowest.sum())


def refine(bins: Bins, row_of_unit: IntArray, units: Units, budget: float, model: CostModel, *, pooled: bool,
           world: int, passes: int | None = None, balance: bool = True) -> Bins:
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
        balance: balance passes first (on steps of at most ``BALANCED_UP_TO`` units); ``False``
            for a start padded with empty bins, whose loaded bins they would split.
    """
    rows, nb = bins.load.shape
    if nb == 0 or world == 1 and pooled or not pooled and nb == 1:
        return bins
    placed = np.flatnonzero(bins.bin_of >= 0)
    if rows == 1:  # a unit's flat bin is its bin (-1: not placed)
        flat = bins.bin_of.copy()
    else:
        flat = np.full(bins.bin_of.size, -1, dtype=np.int64)
        flat[placed] = row_of_unit[placed] * nb + bins.bin_of[placed]
    load, count, longest, total = np.stack([bins.load, bins.count, bins.longest, bins.total]).reshape(4, -1)
    ideal = float(load.sum()) / world * (1 + CLOSE)  # no step runs faster than its mean
    balance = balance and placed.size <= BALANCED_UP_TO
    # a pass costs a few dozen numpy calls plus work on the paired bins' units: a few passes on
    # small steps, at most VISITS units' work on large ones (the packing's cost, about)
    most = min(PASSES, max(PASSES_SMALL, placed.size // UNITS_PER_PASS)) if passes is None else passes
    fast = _compiled.kernels_for(model) if units.whole else None
    if fast is not None:  # the same passes compiled (fitbatch._kernels.steps.refine); exact sums
        module, kind, params = fast
        module.refine(load, count, longest, total, flat, placed, units.weight, units.count, units.longest,
                      units.total, float(budget), kind, params, bool(model.uses_max), rows, nb, bool(pooled),
                      int(world), ideal, int(most), bool(balance), _CONSTS)
    else:
        _passes(load, count, longest, total, flat, placed, units, budget, model, rows, nb, pooled, world, ideal,
                most, balance)
    bins.load, bins.count = load.reshape(rows, nb), count.reshape(rows, nb)
    bins.longest, bins.total = longest.reshape(rows, nb), total.reshape(rows, nb)
    if rows == 1:
        bins.bin_of[:] = flat
    else:
        bins.bin_of[placed] = flat[placed] % nb
    return bins


def _passes(load: FloatArray, count: FloatArray, longest: FloatArray, total: FloatArray, flat: IntArray,
            placed: IntArray, units: Units, budget: float, model: CostModel, rows: int, nb: int, pooled: bool,
            world: int, ideal: float, most: int, balance: bool) -> None:
    """:func:`refine`'s passes on the flat bins, in place (numpy)."""
    ext = tuple(np.append(a, 0.0) for a in (units.weight, units.count, units.longest, units.total))
    times: list[float] = []
    work = 0
    for _ in range(most):  # balance passes while they gain, then the others
        if balance:  # not bound to the micro-steps' slowest bins: undone if the step got slower
            kept = [a.copy() for a in (load, count, longest, total, flat)]
            before, done = _one_pass(load, count, longest, total, flat, placed, units, budget, model, rows, nb,
                                     pooled, world, "balance", ext)
            after = step_time(load.reshape(rows, nb), pooled, world)
            if after > before:
                for a, b in zip((load, count, longest, total, flat), kept):
                    a[:] = b
            balance = after < before * (1 - GAIN_B) and after > ideal
        else:
            now, done = _one_pass(load, count, longest, total, flat, placed, units, budget, model, rows, nb,
                                  pooled, world, ("wide", "narrow")[len(times) % 2], ext)
            times.append(now)
            if now <= ideal or len(times) >= 3 and now > times[-3] * (1 - GAIN):
                break
        work += done
        if work >= VISITS:
            break


def _pairs(load: FloatArray, rows: int, nb: int, pooled: bool, world: int, mode: str) -> tuple[
        IntArray, IntArray, FloatArray, FloatArray, NDArray[np.bool_], float]:
    """(giving bin, taking bin, the most weight it may pass, the best to pass, whether both run
    in one micro-step) of each pair, and the step time of ``load``.

    In each row, the givers (``"wide"``: the ``1 / WIDE`` of the bins with the least slack, room
    below their micro-step's slowest bin; ``"narrow"``: each micro-step's slowest bin, heaviest
    first) are paired in order with the other bins, most slack first. A pair's taking bin may
    rise to its micro-step's slowest (or, in the giver's micro-step, to below the giver's new
    load). ``"balance"``: the heavier half with the lighter half, heaviest with lightest, the
    taking bin staying below the giving bin's new load."""
    row = np.arange(load.size) // nb
    step = steps_of(load.reshape(rows, nb), pooled, world).ravel()
    slowest = np.zeros(int(step.max()) + 1)
    np.maximum.at(slowest, step, load)
    slack = slowest[step] - load
    if mode == "balance":  # heaviest with lightest: a pair's heavier bin only gets lighter
        order = np.lexsort((-load, row)).reshape(rows, nb)
        half = nb // 2
        give, take = order[:, :half].ravel(), order[:, ::-1][:, :half].ravel()
        ok = load[give] > load[take]
        give, take = give[ok], take[ok]
        room = load[give] - load[take]
        same = np.ones(give.size, dtype=bool)
        return give, take, np.nextafter(room, 0.0), room / 2, same, float(slowest.sum())
    if mode == "wide":
        order = np.lexsort((-load, slack, row)).reshape(rows, nb)
        half = max(1, nb // WIDE)
        give, take = order[:, :half].ravel(), order[:, ::-1][:, :half].ravel()
    else:
        by_step = np.lexsort((-load, step))
        give = by_step[_firsts(step[by_step])]
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
    best = np.where(same, room / 2, room)
    return give, take, np.where(same, np.nextafter(room, 0.0), room), best, same, float(slowest.sum())


def _firsts(key: IntArray) -> NDArray[np.bool_]:
    """Where a sorted ``key`` starts a run of equal values."""
    out = np.ones(key.size, dtype=bool)
    np.not_equal(key[1:], key[:-1], out=out[1:])
    return out


def _one_pass(load: FloatArray, count: FloatArray, longest: FloatArray, total: FloatArray, flat: IntArray,
              placed: IntArray, units: Units, budget: float, model: CostModel, rows: int, nb: int, pooled: bool,
              world: int, mode: str, ext: tuple[FloatArray, ...]) -> tuple[float, int]:
    """Exchanges between the pairs of bins of :func:`_pairs`; the step time before them, and
    the units of the paired bins (the pass's work).

    An exchange passes one unit of the giving bin for none, one or (in a narrow pass, for
    one of the giving bin's ``PAIRED`` heaviest units) two units of the taking bin: one for
    two of about its size moves the convex part of a workload (``L**2``) off the giving bin
    at about the same tokens, when neither bin has room for more.
    """
    h, l_, room, best, same, now = _pairs(load, rows, nb, pooled, world, mode)
    if h.size == 0:
        return now, 0
    pair_of = np.full(load.size, -1, dtype=np.int64)
    pair_of[h], pair_of[l_] = np.arange(h.size), np.arange(h.size)
    u = placed[pair_of[flat[placed]] >= 0]
    pair = pair_of[flat[u]]
    give = flat[u] == h[pair]
    w = units.weight[u]
    top_id = np.full(load.size, -1, dtype=np.int64)  # the unit of each bin's longest size
    second = longest  # the bin's longest without it (a model blind to it: the old longest)
    if model.uses_max:
        top_id, second = _second_longest(u, flat, units, load.size)
    # every unit of a pair by (pair, weight): the key's integer part is twice the pair, its
    # fraction the weight (each given unit is looked up among the partner's, both sorted)
    scale = float(units.weight.max()) + 1.0
    key = 2.0 * pair + w / scale
    take, g = np.flatnonzero(~give), np.flatnonzero(give)
    take, g = take[np.argsort(key[take], kind="stable")], g[np.argsort(key[g], kind="stable")]
    t_key, gp, gw = key[take], pair[g], w[g]
    take, g = u[take], u[g]
    n_take = np.bincount(pair_of[flat[take]], minlength=h.size)
    hi = np.cumsum(n_take)
    lo = hi - n_take
    at = np.searchsorted(t_key, 2.0 * gp + np.maximum(gw - best[gp], 0.0) / scale)  # delta <= best from here
    above, below = at < hi[gp], at > lo[gp]  # a partner unit at `at`, one before it
    last = max(take.size - 1, 0)
    cu = [g, g[above], g[below]]  # the given unit for: none, the one at `at`, the one before
    cv = [np.full(g.size, -1, dtype=np.int64), take[np.minimum(at[above], last)], take[at[below] - 1]]
    cv2 = [np.full(g.size + int(above.sum()) + int(below.sum()), -1, dtype=np.int64)]
    cps = [gp, gp[above], gp[below]]
    if mode == "narrow" and take.size:  # one for two: the PAIRED heaviest given units, each partner unit
        n_give = np.bincount(gp, minlength=h.size)
        heavy = np.arange(g.size) >= np.cumsum(n_give)[gp] - PAIRED
        hu, hp = g[heavy], gp[heavy]
        reps = n_take[hp]
        if reps.sum():
            ramp = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
            u1, p1 = np.repeat(hu, reps), np.repeat(hp, reps)
            i1 = lo[p1] + ramp
            need = units.weight[u1] - best[p1] - units.weight[take[i1]]
            i2 = np.searchsorted(t_key, 2.0 * p1 + np.maximum(need, 0.0) / scale)
            i2 = np.where(i2 == i1, i2 + 1, i2)
            ok = i2 < hi[p1]
            cu.append(u1[ok])
            cv.append(take[i1[ok]])
            cv2.append(take[i2[ok]])
            cps.append(p1[ok])
    cu_, v1, v2, cp_ = (np.concatenate(x) for x in (cu, cv, cv2, cps))
    wx, cx, lx, tx = ext  # the units' arrays with a 0 after them: index -1 is "no unit"
    delta = wx[cu_] - wx[v1] - wx[v2]
    fits = (delta > 0) & (delta <= room[cp_])
    cand = [a[fits] for a in (cu_, v1, v2, cp_, delta)]
    cu_, v1, v2, cp_, delta = cand
    cand += [cx[v1] + cx[v2], tx[v1] + tx[v2], np.maximum(lx[v1], lx[v2])]
    used = np.zeros(units.weight.size + 1, dtype=bool)  # units moved in this pass (and "no unit": never)
    touched = np.zeros(load.size, dtype=bool)  # bins changed in this pass (their longest kept as an upper bound)
    for _ in range(ROUNDS):  # invariant: each taking bin <= its step's slowest at the pass's start
        cu_, v1, v2, cp, delta, in_count, in_total, in_long = cand
        ok = ~(used[cu_] | used[v1] | used[v2]) & (delta <= room[cp])
        if not ok.any():
            break
        cand = [a[ok] for a in cand]
        cu_, v1, v2, cp, delta, in_count, in_total, in_long = cand
        one, two = v1 >= 0, v2 >= 0
        hb, lb = h[cp], l_[cp]
        h_count = count[hb] - units.count[cu_] + in_count
        h_total = total[hb] - units.total[cu_] + in_total
        h_long = np.maximum(np.where((top_id[hb] == cu_) & ~touched[hb], second[hb], longest[hb]), in_long)
        l_count = count[lb] + units.count[cu_] - in_count
        l_total = total[lb] + units.total[cu_] - in_total
        # two leaving the taking bin, or a bin changed: its longest is kept (an upper bound)
        l_keep = np.where(one & ~two & (top_id[lb] == v1) & ~touched[lb], second[lb], longest[lb])
        l_long = np.maximum(l_keep, units.longest[cu_])
        costs = model.evaluate(np.concatenate([h_count, l_count]), np.concatenate([h_long, l_long]),
                               np.concatenate([h_total, l_total]))
        idx = np.flatnonzero((costs[: cu_.size] <= budget) & (costs[cu_.size :] <= budget))
        if idx.size == 0:
            break
        score = np.minimum(delta[idx], 2 * best[cp[idx]] - delta[idx])
        idx = idx[np.lexsort((-score, cp[idx]))]
        idx = idx[_firsts(np.asarray(cp[idx], dtype=np.int64))]  # the best exchange of each pair
        hb, lb, d, p = hb[idx], lb[idx], delta[idx], cp[idx]
        load[hb] -= d
        load[lb] += d
        count[hb], total[hb], longest[hb] = h_count[idx], h_total[idx], h_long[idx]
        count[lb], total[lb], longest[lb] = l_count[idx], l_total[idx], l_long[idx]
        flat[cu_[idx]] = lb
        flat[v1[idx][one[idx]]] = hb[one[idx]]
        flat[v2[idx][two[idx]]] = hb[two[idx]]
        used[cu_[idx]] = used[v1[idx]] = used[v2[idx]] = True
        used[-1] = False
        touched[hb] = touched[lb] = True
        room[p] -= np.where(same[p], 2 * d, d)  # the taking bin's room left, and the best to pass
        best[p] = np.where(same[p], room[p] / 2, room[p])
    return now, u.size


def _second_longest(u: IntArray, flat: IntArray, units: Units, n_bins: int) -> tuple[IntArray, FloatArray]:
    """The unit holding each bin's longest size (among ``u``; -1: none), and the longest size
    of the bin without it (0 if it is alone)."""
    by_len = u[np.lexsort((units.longest[u], flat[u]))]
    fb = flat[by_len]
    last = np.ones(fb.size, dtype=bool)
    np.not_equal(fb[1:], fb[:-1], out=last[:-1])
    top_id = np.full(n_bins, -1, dtype=np.int64)
    top_id[fb[last]] = by_len[last]
    second = np.zeros(n_bins)
    below = np.flatnonzero(last) - 1
    has = (below >= 0) & (fb[np.maximum(below, 0)] == fb[last])
    second[fb[last][has]] = units.longest[by_len[below[has]]]
    return top_id, second
