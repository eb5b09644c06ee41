"""The micro-batch count of a step: the fewest bins every row packs into under the cap.

Rows are packed at the lower bound; only a failing row raises the count (galloping, then
halving), and a collective (for :func:`~fitbatch.steps.partition_local`) makes it common. A row
can always be packed into more bins than it needs (its own packing plus empty bins), so the count
never goes back to the collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from fitbatch.costs import CostModel
from fitbatch.steps._pack import Bins, IntArray, Units, pack


class Caps(Protocol):
    """What the count needs of a step's plan: the cap, its cost model, the count's multiple and floor."""

    budget: float
    model: CostModel
    step: int
    floor: int


def settle(order: IntArray, alone: IntArray, units: Units, bound: int, plan: Caps,
           agree: Callable[[int], int] | None, width: int = 1) -> tuple[int, Bins]:
    """The micro-batch count and every row's bins (``width`` bins a micro-step per row).

    The rows are packed at the lower bound ``m``; only if a row fails is the count
    raised, for the failing rows together: ``m`` plus 1, 2, 4, ... steps until they all pack,
    then halving back to the least count at which they all do. ``agree`` (a collective MAX,
    or none) then makes the count common, and a row packed into fewer bins is packed again
    into that many; if it fails there (the deal is not monotone in the count, so this is not
    excluded), it keeps its packing into fewer bins, plus empty ones.
    """
    step, model, budget = plan.step, plan.model, plan.budget
    rows = order.shape[0]
    m = round_up(max(bound, plan.floor), step)
    bins = pack(order, units, m * width, budget, model, alone) if m else Bins.empty(rows, 0, units.weight.size)
    if agree is None and not bins.failed.any():  # every row packs at the lower bound (the common case)
        return m, bins
    packed = {r: (m, _row(bins, r)) for r in range(rows) if m and not bins.failed[r]}

    def attempt(count: int, todo: IntArray) -> IntArray:
        got = pack(order[todo], units, count * width, budget, model, alone[todo])
        packed.update({r: (count, _row(got, i)) for i, r in enumerate(todo.tolist()) if not got.failed[i]})
        return todo[got.failed]

    todo = np.flatnonzero(bins.failed)
    low, high, gap = m, m, step
    while todo.size:  # galloping: every row of todo fails at `low`
        high = low + gap
        left = attempt(high, todo)
        if not left.size:
            break
        low, todo, gap = high, left, gap * 2
    while high - low > step:  # halving: every row of todo fails at `low` and packs at `high`
        mid = low + (high - low) // (2 * step) * step
        left = attempt(mid, todo)
        if left.size:
            low, todo = mid, left
        else:
            high = mid
    final = agree(high) if agree is not None else high
    if final == m:
        return m, bins
    out = Bins.empty(rows, final * width, units.weight.size)
    redo = np.array([r for r in range(rows) if packed.get(r, (0,))[0] != final], dtype=np.int64)
    if redo.size:
        attempt(final, redo)
    for r, (_, src) in packed.items():
        _adopt(out, r, src, order[r], alone[r])
    return final, out


def _row(bins: Bins, r: int) -> Bins:
    return Bins(bins.load[r : r + 1], bins.count[r : r + 1], bins.longest[r : r + 1], bins.total[r : r + 1],
                bins.bin_of, bins.failed[r : r + 1])


def _adopt(out: Bins, r: int, src: Bins, order: IntArray, alone: IntArray) -> None:
    """Row ``r`` of ``out`` takes a packing of that row into fewer bins (the rest stay empty)."""
    c = src.load.shape[1]
    if c == 0:
        return
    for field in ("load", "count", "longest", "total"):
        getattr(out, field)[r] = 0.0
        getattr(out, field)[r, :c] = getattr(src, field)[0]
    ids = np.concatenate([order[order >= 0], alone[alone >= 0]])
    out.bin_of[ids] = src.bin_of[ids]
    out.failed[r] = False


def round_up(m: int, step: int) -> int:
    """``m`` rounded up to a multiple of ``step``."""
    return -(-m // step) * step
