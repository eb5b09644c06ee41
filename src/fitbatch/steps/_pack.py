"""The packing kernel of a step: units into ``m`` capped bins per row, balanced by weight.

A *row* is one rank (or, for the rank split, the whole step); a *unit* is a sequence, or a group
kept together. Each unit carries a weight (what is balanced) and its own (count, max size, sum of
sizes), so a bin's cost under any :class:`~fitbatch.costs.CostModel` follows from its running
(count, max, sum). The kernel is a largest-processing-time greedy run in *rounds*: the units of a
row, heaviest first, are dealt ``m`` at a time, the heaviest of a round to the lightest bin. One
round of every row is one vectorised step; a unit that would break the cap in its bin (rare: the
round's pairing is blind to cost) is placed alone, in the lightest bin it fits, or the row fails
for this ``m``. Rows are independent, so the ranks of a step are packed at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.costs import CostModel
from fitbatch.steps import _compiled

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

#: rounds dealt one by one before the deal goes by blocks of rounds (snake order, checked)
EXACT_ROUNDS = 32


@dataclass(frozen=True)
class Units:
    """Per-unit arrays: weight, and the (count, max size, sum of sizes) a bin's cost is taken on."""

    weight: FloatArray
    count: FloatArray
    longest: FloatArray
    total: FloatArray

    @cached_property
    def whole(self) -> bool:
        """Whether the weights are whole numbers whose total is below ``2**52``: every sum of
        them is exact in any order (the compiled refinement's condition)."""
        return _compiled.whole(self.weight)


@dataclass
class Bins:
    """Running totals of ``rows x m`` bins, and the bin each unit went to (-1: not yet)."""

    load: FloatArray
    count: FloatArray
    longest: FloatArray
    total: FloatArray
    bin_of: IntArray
    failed: NDArray[np.bool_]

    @classmethod
    def empty(cls, rows: int, m: int, n_units: int) -> Bins:
        zeros = np.zeros((rows, m))
        return cls(zeros, zeros.copy(), zeros.copy(), zeros.copy(), np.full(n_units, -1, np.int64),
                   np.zeros(rows, dtype=bool))

    def padded(self, m: int) -> Bins:
        """These bins, with empty ones after them up to ``m`` a row."""
        extra = np.zeros((self.load.shape[0], m - self.load.shape[1]))
        load, count, longest, total = (np.hstack([a, extra]) for a in (self.load, self.count, self.longest, self.total))
        return Bins(load, count, longest, total, self.bin_of, self.failed)


def pack(
    order: IntArray, units: Units, m: int, budget: float, model: CostModel | None, alone: IntArray | None = None
) -> Bins:
    """Deal each row of ``order`` (unit ids, heaviest first, -1 padded) into ``m`` bins.

    Args:
        order: ``(rows, k)`` unit ids; a row's ids come first, -1 after them.
        units: the units' weights and (count, max, sum).
        m: bins per row (>= 1).
        budget: the cap on each bin's cost (``inf``: none).
        model: the cost model (``None``: no cap).
        alone: ``(rows, a)`` unit ids (-1 padded, at most ``m`` a row) placed first, one per bin:
            the oversized units, over the cap alone; a cost model being non-decreasing, no
            other unit fits beside them.

    Returns:
        The bins; ``failed[r]`` is true where a unit of row ``r`` fit no bin: the row's dealing
        stopped there, and it must be packed into more bins.
    """
    rows, k = order.shape
    fast = _compiled.kernels_for(model) if rows == 1 else None
    if fast is not None:  # the same deal compiled (fitbatch._kernels.steps.pack_pool)
        module, kind, params = fast
        row = np.full(0, -1, dtype=np.int64) if alone is None else np.ascontiguousarray(alone[0], dtype=np.int64)
        load, count, longest, total, bin_of, failed = module.pack_pool(
            np.ascontiguousarray(order[0], dtype=np.int64), row, units.weight, units.count, units.longest,
            units.total, int(m), float(budget), kind, params, EXACT_ROUNDS)
        return Bins(load[None], count[None], longest[None], total[None], bin_of, np.array([failed]))
    bins = Bins.empty(rows, m, units.weight.size)
    if alone is not None and alone.size:
        r, b = np.nonzero(alone >= 0)
        u = alone[r, b]
        bins.load[r, b], bins.count[r, b] = units.weight[u], units.count[u]
        bins.longest[r, b], bins.total[r, b] = units.longest[u], units.total[u]
        bins.bin_of[u] = b
    n = (order >= 0).sum(axis=1)
    done = np.zeros(rows, dtype=np.int64)  # units of each row dealt so far (a prefix of the row)
    t = 0
    while True:
        live = (done < n) & ~bins.failed
        if not live.any():
            return bins
        # invariant: the first done[r] units of a row that has not failed are each in one bin,
        # every bin's cost is <= budget, and bins.load holds each bin's weight. The first
        # rounds (the heaviest units) and the last (the lightest, which even out what the
        # blocks leave) go one round at a time; the middle of a long row by blocks of rounds.
        middle = int(((n - done)[live]).min()) // m - EXACT_ROUNDS
        if t >= EXACT_ROUNDS and middle > 1 and _deal_block(order, done, live, max(1, middle // 4) * m, units, bins,
                                                           budget, model):
            continue
        _deal_round(order, done, live, n, units, bins, budget, model)
        t += 1


def _cost(model: CostModel | None, count: FloatArray, longest: FloatArray, total: FloatArray) -> FloatArray:
    if model is None:
        return np.zeros(np.shape(count))
    shape = np.shape(count)  # models take 1-D arrays of batches (2-D sizes mean (k, D))
    return model.evaluate(np.ravel(count), np.ravel(longest), np.ravel(total)).reshape(shape)


def _deal_round(order: IntArray, done: IntArray, live: NDArray[np.bool_], n: IntArray, units: Units, bins: Bins,
                budget: float, model: CostModel | None) -> None:
    """One round: the i-th heaviest next unit of a row to its i-th lightest bin, for as many
    bins as are lighter than the lightest one will be after its unit (what a one-at-a-time
    greedy would fill next), so a bin holding a heavy unit waits instead of taking one a round."""
    rows, m = bins.load.shape
    if rows == 1:  # one pool (the step's partition without groups): the same round in 1-D
        _deal_round_one(order[0], done, int(n[0]), units, bins, budget, model)
        return
    r = np.arange(rows)[:, None]
    first = units.weight[np.maximum(order[np.arange(rows), np.minimum(done, order.shape[1] - 1)], 0)]
    low = bins.load.min(axis=1)
    below = (bins.load < (low + first)[:, None]).sum(axis=1)
    width = np.where(live, np.minimum(np.where(first > 0, np.maximum(below, 1), m), n - done), 0)
    w = int(width.max())
    if w < m:  # only the w lightest bins of a row take a unit: sort those alone
        part = np.argpartition(bins.load, w - 1, axis=1)[:, :w]
        lightest = np.take_along_axis(part, np.argsort(np.take_along_axis(bins.load, part, axis=1), axis=1,
                                                       kind="stable"), axis=1)
    else:
        lightest = np.argsort(bins.load, axis=1, kind="stable")
    j = np.arange(w)[None, :]
    u = order[r, np.minimum(done[:, None] + j, order.shape[1] - 1)]
    u = np.where(u >= 0, u, 0)
    valid = j < width[:, None]
    done += width
    r = np.broadcast_to(r, (rows, w))
    count = bins.count[r, lightest] + units.count[u]
    longest = np.maximum(bins.longest[r, lightest], units.longest[u])
    total = bins.total[r, lightest] + units.total[u]
    ok = valid & (_cost(model, count, longest, total) <= budget)
    rr, bb, uu = r[ok], lightest[ok], u[ok]  # distinct bins: one unit per bin in a round
    bins.load[rr, bb] += units.weight[uu]
    bins.count[rr, bb] = count[ok]
    bins.longest[rr, bb] = longest[ok]
    bins.total[rr, bb] = total[ok]
    bins.bin_of[uu] = bb
    bad = valid & ~ok
    if bad.any():
        _place_rest(r[bad], u[bad], units, bins, budget, model)


def _deal_round_one(order: IntArray, done: IntArray, n: int, units: Units, bins: Bins, budget: float,
                    model: CostModel | None) -> None:
    """:func:`_deal_round` of a single live row (``order`` its unit ids), with 1-D arrays:
    the same decisions, a third of the numpy calls."""
    load, m, k = bins.load[0], bins.load.shape[1], order.size
    d = int(done[0])
    first = units.weight[max(int(order[min(d, k - 1)]), 0)]
    width = min(max(int((load < load.min() + first).sum()), 1) if first > 0 else m, n - d)
    lightest = np.argsort(load, kind="stable")[:width]  # ties by bin: the same on every machine
    u = order[np.minimum(d + np.arange(width), k - 1)]
    u = np.where(u >= 0, u, 0)
    done[0] = d + width
    count = bins.count[0, lightest] + units.count[u]
    longest = np.maximum(bins.longest[0, lightest], units.longest[u])
    total = bins.total[0, lightest] + units.total[u]
    ok = _cost(model, count, longest, total) <= budget
    bb, uu = lightest[ok], u[ok]  # distinct bins: one unit per bin in a round
    load[bb] += units.weight[uu]
    bins.count[0, bb], bins.longest[0, bb], bins.total[0, bb] = count[ok], longest[ok], total[ok]
    bins.bin_of[uu] = bb
    if not ok.all():
        bad = ~ok
        _place_rest(np.zeros(int(bad.sum()), dtype=np.int64), u[bad], units, bins, budget, model)


def _place_roomiest(rows: IntArray, unit: IntArray, units: Units, bins: Bins, budget: float,
                    model: CostModel | None, passes: int = 8) -> tuple[IntArray, IntArray]:
    """Further pairings of a round's leftover units (row-major, heaviest first): in each pass,
    the i-th left over of a row to the row's i-th cheapest bin. Returns those still left over."""
    m = bins.load.shape[1]
    for _ in range(passes):
        if rows.size == 0:
            break
        cheapest = np.argsort(_cost(model, bins.count, bins.longest, bins.total), axis=1, kind="stable")
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        nth = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
        b = cheapest[rows, np.minimum(nth, m - 1)]
        count = bins.count[rows, b] + units.count[unit]
        longest = np.maximum(bins.longest[rows, b], units.longest[unit])
        total = bins.total[rows, b] + units.total[unit]
        ok = (nth < m) & (_cost(model, count, longest, total) <= budget)
        if not ok.any():
            break
        rr, bb, uu = rows[ok], b[ok], unit[ok]
        bins.load[rr, bb] += units.weight[uu]
        bins.count[rr, bb], bins.longest[rr, bb], bins.total[rr, bb] = count[ok], longest[ok], total[ok]
        bins.bin_of[uu] = bb
        rows, unit = rows[~ok], unit[~ok]
    return rows, unit


def _place_rest(rows: IntArray, unit: IntArray, units: Units, bins: Bins, budget: float, model: CostModel | None) -> None:
    """Units whose bin of the round could not take them: those that fit no bin of their row
    (their cost beside the row's least count, max and sum of any bin is over the cap: a model
    is non-decreasing) are left out at once; the others are paired with the cheapest bins,
    and what still did not fit goes one by one to the lightest bin it fits."""
    floor = _cost(model, bins.count.min(axis=1)[rows] + units.count[unit],
                  np.maximum(bins.longest.min(axis=1)[rows], units.longest[unit]),
                  bins.total.min(axis=1)[rows] + units.total[unit])
    out = floor > budget
    if out.any():
        bins.failed[rows[out]] = True
    rows, unit = _place_roomiest(rows[~out], unit[~out], units, bins, budget, model)
    for row, u in zip(rows.tolist(), unit.tolist()):
        _place_alone(row, u, units, bins, budget, model)


def _place_alone(row: int, unit: int, units: Units, bins: Bins, budget: float, model: CostModel | None) -> None:
    """``unit`` into the lightest bin of ``row`` it fits, or mark the row failed."""
    if bins.failed[row]:
        return
    count = bins.count[row] + units.count[unit]
    longest = np.maximum(bins.longest[row], units.longest[unit])
    total = bins.total[row] + units.total[unit]
    fits = _cost(model, count, longest, total) <= budget
    if not fits.any():
        bins.failed[row] = True
        return
    b = int(np.argmin(np.where(fits, bins.load[row], np.inf)))
    bins.load[row, b] += units.weight[unit]
    bins.count[row, b], bins.longest[row, b], bins.total[row, b] = count[b], longest[b], total[b]
    bins.bin_of[unit] = b


def _deal_block(order: IntArray, done: IntArray, live: NDArray[np.bool_], width: int, units: Units, bins: Bins,
                budget: float, model: CostModel | None) -> bool:
    """The next ``width`` units of every live row at once (several rounds: the late, light
    units of a long row), in snake order over the bins sorted lightest first. Applied only if
    no bin breaks the cap; returns whether it was."""
    rows, m = bins.load.shape
    lightest = np.argsort(bins.load, axis=1, kind="stable")
    j = np.arange(width)
    pos = np.where((j // m) % 2 == 0, j % m, m - 1 - j % m)  # 0..m-1, m-1..0, ...
    target = lightest[:, pos]
    valid = np.broadcast_to(live[:, None], (rows, width))
    u = order[np.arange(rows)[:, None], np.minimum(done[:, None] + j, order.shape[1] - 1)]
    flat = (np.arange(rows)[:, None] * m + target)[valid]
    uu = u[valid]
    size = rows * m
    count = bins.count.ravel() + np.bincount(flat, units.count[uu], size)
    total = bins.total.ravel() + np.bincount(flat, units.total[uu], size)
    longest = bins.longest.ravel().copy()
    np.maximum.at(longest, flat, units.longest[uu])
    if model is not None and not (_cost(model, count, longest, total) <= budget).all():
        return False
    bins.load += np.bincount(flat, units.weight[uu], size).reshape(rows, m)
    bins.count, bins.longest, bins.total = count.reshape(rows, m), longest.reshape(rows, m), total.reshape(rows, m)
    bins.bin_of[uu] = target[valid]
    done[live] += width
    return True


def rows_of(row_of_unit: IntArray, weight: FloatArray, rows: int) -> IntArray:
    """``(rows, k)`` unit ids, each row's units heaviest first (ties by id), padded with -1."""
    heavy = _compiled.argsort(-weight)
    if rows == 1:  # every unit in row 0: the heaviest first is the row
        return heavy[None]
    key = heavy[_compiled.argsort(row_of_unit[heavy])]
    counts = np.bincount(row_of_unit, minlength=rows)
    k = int(counts.max()) if counts.size else 0
    out = np.full((rows, k), -1, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sorted_rows = row_of_unit[key]
    out[sorted_rows, np.arange(key.size) - starts[sorted_rows]] = key
    return out


def as_units(weight: Any, count: Any, longest: Any, total: Any) -> Units:
    return Units(*(np.ascontiguousarray(a, dtype=np.float64) for a in (weight, count, longest, total)))
