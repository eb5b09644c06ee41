"""Slow, obviously correct planners: the oracles the fast kernels are compared against.

Everything here is plain Python over lists, one sample at a time, written for reading rather
than speed (STYLE 14, like fairseq's ``batch_by_size_baseline``). Sizes are floats, or tuples
of floats for D-dimensional samples; a cost is any function ``(count, max, sum) -> float``
where ``max``/``sum`` are floats (1-D) or tuples (D-dim).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

Size = Any  # float, or tuple[float, ...]
CostFn = Callable[[int, Size, Size], float]


def _max(a: Size, b: Size) -> Size:
    if isinstance(a, tuple):
        return tuple(max(x, y) for x, y in zip(a, b, strict=True))
    return max(a, b)


def _add(a: Size, b: Size) -> Size:
    if isinstance(a, tuple):
        return tuple(x + y for x, y in zip(a, b, strict=True))
    return a + b


def model_cost(model: Any) -> CostFn:
    """A fitbatch ``CostModel`` as a scalar cost function (one batch at a time)."""

    def cost(count: int, mx: Size, sm: Size) -> float:
        m = np.asarray([mx], dtype=np.float64)
        s = np.asarray([sm], dtype=np.float64)
        return float(model.evaluate(np.asarray([float(count)]), m, s)[0])

    return cost


def as_python(sizes: Any) -> list[Size]:
    """numpy (n,) or (n, D) array -> list of floats or tuples of floats."""
    arr = np.asarray(sizes, dtype=np.float64)
    if arr.ndim == 1:
        return [float(x) for x in arr]
    return [tuple(float(x) for x in row) for row in arr]


def greedy_starts(
    sizes: Sequence[Size],
    budget: float,
    cost: CostFn,
    *,
    cap: int | None = None,
    forced: Iterable[int] = (),
    multiple: int = 1,
    carry: tuple[int, Size, Size] | None = None,
) -> tuple[list[int], tuple[int, Size, Size]]:
    """Greedy batch starts, one sample at a time.

    A sample joins the open batch when the batch with it still costs at most ``budget``, holds
    at most ``cap`` samples, and the sample is not a forced (segment) start; otherwise it starts
    a new batch. An empty batch always takes its sample (a lone oversized sample is a batch).

    ``carry = (count, max, sum)`` is a batch left open before position 0 (its samples are not
    listed). With ``multiple > 1``, a batch closed by the budget or the cap (not by a forced
    start or the end of the sequence) that holds at least ``multiple`` samples is cut back to a
    multiple of ``multiple``; its surplus samples start the next batch, which is then filled
    greedily again. A cut never reaches into the carried samples.

    Returns (start positions, the batch open at the end as (count, max, sum)).
    """
    forced = set(forced)
    n = len(sizes)
    starts: list[int] = []
    if carry is not None and carry[0] > 0:
        batch_start, count, mx, sm = -carry[0], carry[0], carry[1], carry[2]
    else:
        batch_start, count, mx, sm = None, 0, None, None
    p = 0
    while p < n:
        x = sizes[p]
        if count == 0:
            batch_start, count, mx, sm = p, 1, x, x
            starts.append(p)
            p += 1
            continue
        new_max, new_sum = _max(mx, x), _add(sm, x)
        closes = p in forced or cost(count + 1, new_max, new_sum) > budget or (cap is not None and count + 1 > cap)
        if not closes:
            count, mx, sm = count + 1, new_max, new_sum
            p += 1
            continue
        q = p  # the open batch is [batch_start, q)
        if multiple > 1 and p not in forced and count >= multiple:
            cut = batch_start + count - count % multiple
            if cut >= 0:
                q = cut
        # start a fresh batch at q
        batch_start, count, mx, sm = q, 0, None, None
        p = q
    if count == 0:
        return starts, carry if (carry is not None and n == 0) else (0, None, None)
    return starts, (count, mx, sm)


def greedy_batches(sizes: Sequence[Size], budget: float, cost: CostFn, **kw: Any) -> list[list[int]]:
    """:func:`greedy_starts` as lists of positions (no carry)."""
    starts, _ = greedy_starts(sizes, budget, cost, **kw)
    bounds = starts + [len(sizes)]
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def first_fit_batches(
    sizes: Sequence[float], seg_starts: Sequence[int], budget: float, cap: int | None = None
) -> list[list[int]]:
    """First-fit decreasing over descending segments, the textbook way: each sample goes into
    the first batch of its segment (in opening order) whose room, the budget minus the sizes
    already in it subtracted one by one, is at least the sample, and that holds fewer than ``cap``
    samples; otherwise into a new batch."""
    n = len(sizes)
    cap = n if cap is None else cap
    bounds = list(seg_starts) + [n]
    out: list[list[int]] = []
    for s0, s1 in zip(bounds[:-1], bounds[1:], strict=True):
        batches: list[list[int]] = []
        rooms: list[float] = []
        for p in range(s0, s1):
            x = sizes[p]
            j = next((j for j, r in enumerate(rooms) if r >= x and len(batches[j]) < cap), None)
            if j is None:
                batches.append([])
                rooms.append(float(budget))
                j = len(batches) - 1
            batches[j].append(p)
            rooms[j] -= x
        out += batches
    return out


def packed_batches(
    sizes: Sequence[float], order: Sequence[int], seg_starts: Sequence[int], budget: float, loose: float, cap: int | None = None
) -> list[list[int]]:
    """The ``packed`` plan of samples laid out in ``order`` (each segment descending): first-fit
    packing per segment, then the batches of each segment after its last one filled to at least
    ``loose`` x budget (and each segment's last batch) packed again together, descending by size
    (ties by their order in those batches), after the kept batches."""
    laid = [sizes[i] for i in order]
    batches = [[order[p] for p in b] for b in first_fit_batches(laid, seg_starts, budget, cap)]
    if len(seg_starts) <= 1:
        return batches
    ends = list(seg_starts[1:]) + [len(order)]
    seg_of = []
    pos = 0
    for b in batches:
        seg_of.append(next(k for k, e in enumerate(ends) if pos < e))
        pos += len(b)
    loose_ids = set()
    for k in range(len(ends)):
        mine = [j for j, s in enumerate(seg_of) if s == k]
        tight = [j for j in mine if sum(sizes[i] for i in batches[j]) >= loose * budget]
        last_tight = max(tight, default=-1)
        loose_ids.update(j for j in mine if j > last_tight)
        if mine:
            loose_ids.add(mine[-1])
    if len(loose_ids) <= 1:
        return batches
    rest = [i for j in sorted(loose_ids) for i in batches[j]]
    rest = sorted(rest, key=lambda i: -sizes[i])  # stable: ties keep their order
    again = [[rest[p] for p in b] for b in first_fit_batches([sizes[i] for i in rest], [0], budget, cap)]
    return [b for j, b in enumerate(batches) if j not in loose_ids] + again


def batches_from_starts(order: Sequence[int], starts: Sequence[int]) -> list[list[int]]:
    bounds = list(starts) + [len(order)]
    return [list(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def batch_cost(batch: Sequence[int], sizes: Sequence[Size], cost: CostFn) -> float:
    """The cost of one batch of indices, from scratch."""
    mx = sm = None
    for i in batch:
        x = sizes[i]
        mx = x if mx is None else _max(mx, x)
        sm = x if sm is None else _add(sm, x)
    return cost(len(batch), mx, sm)


def largest_count(edge: float, budget: float, cost: CostFn, cap: int | None = None) -> int:
    """The most samples of size ``edge`` one batch holds within ``budget``, counted up one by
    one (at least 1, a lone sample; at most ``cap``)."""
    count = 1
    while (cap is None or count < cap) and cost(count + 1, edge, (count + 1) * edge) <= budget:
        count += 1
    return count


def fixed_batches(order: Sequence[int], batch_size: int) -> list[list[int]]:
    """Consecutive batches of ``batch_size`` samples of ``order`` (the last one takes the rest)."""
    order = list(order)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
