"""Bounded batch shapes (``max_shapes=K``): at most K ``(rows, length)`` shapes for a whole run.

torch.compile and CUDA graphs specialise on every new input shape; a budget planner makes
hundreds. With ``max_shapes=K`` the planner first chooses K lengths from the sizes (the grid
that pads least: :func:`optimal_lengths`), gives each length the most rows whose cost fits the
budget (:func:`shape_rows`), then plans every sample as if its size were rounded up to its grid
length with the unchanged engine. A batch's longest sample then rounds to a grid length whose
rows hold the batch, so every batch fits one of the K shapes (:func:`pick_shapes`), and the shape
set depends only on the sizes, the budget, the cost and the options: the same every epoch and
on every rank.

>>> import numpy as np
>>> values = np.array([3.0, 5.0, 9.0, 10.0, 4.0, 10.0])
>>> shapes = shape_set(values, budget=40, k=2, model=PaddedCost())
>>> shapes.tolist()
[[8, 5], [4, 10]]
>>> rounded_sizes(values, shapes).tolist()
[5.0, 5.0, 10.0, 10.0, 5.0, 10.0]
>>> pick_shapes(shapes, np.array([3, 2]), np.array([4.0, 9.0])).tolist()
[[8, 5], [4, 10]]
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fitbatch.costs import CostModel, PaddedCost, PaddedPolynomial
from fitbatch.sizes import Sizes
from fitbatch.strategies import Strategy

if TYPE_CHECKING:
    from fitbatch.plan._options import PlanOptions

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

# Distinct lengths the grid is chosen over exactly; more are merged into this many bins.
MAX_DISTINCT = 4096
# Rows searched at most for a cost model without a row limit (2**40 samples in one batch).
MAX_ROWS = 1 << 40


def distinct_lengths(values: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Sorted distinct whole lengths (sizes rounded up) and how many samples have each.

    More than :data:`MAX_DISTINCT` distinct lengths are merged into that many bins of equal
    width on a log scale, each standing for the longest length in it (so a grid over them still
    covers every size, and pads at most the bins' relative width more than the exact grid:
    under 0.3 % for lengths 1 to 60000).

    >>> v, c = distinct_lengths(np.array([2.5, 3.0, 7.0, 3.0]))
    >>> v.tolist(), c.tolist()
    ([3.0, 7.0], [3.0, 1.0])
    """
    whole = np.ceil(values)
    if whole.size and whole.max() < 1 << 16:
        counts = np.bincount(whole.astype(np.int64))
        lengths = np.flatnonzero(counts)
        if lengths.size <= MAX_DISTINCT:
            return lengths.astype(np.float64), counts[lengths].astype(np.float64)
        found, many = lengths.astype(np.float64), counts[lengths].astype(np.float64)
    else:
        found, raw = np.unique(whole, return_counts=True)
        many = raw.astype(np.float64)
        if found.size <= MAX_DISTINCT:
            return found, many
    # log-scale bins over positive lengths (a zero length keeps a bin of its own)
    low = max(float(found[found > 0].min()), 1.0)
    span = math.log(float(found[-1]) / low) or 1.0
    bins = np.floor(np.log(np.maximum(found, low) / low) * ((MAX_DISTINCT - 2) / span)).astype(
        np.int64
    )
    bins[found <= 0] = -1
    last = np.flatnonzero(np.append(bins[1:] != bins[:-1], True))
    sums = np.cumsum(many)[last]
    return found[last], np.diff(np.concatenate([[0.0], sums]))


def optimal_lengths(lengths: FloatArray, counts: FloatArray, k: int) -> FloatArray:
    """The at most ``k`` grid lengths that minimise the total padding of rounding up to the grid.

    ``lengths`` are sorted distinct lengths and ``counts`` their samples; every length is
    rounded up to the next grid length, and the grid minimises ``sum(count * grid length)``
    (so the padded units), the largest length always in it. An exact dynamic programme: groups
    are runs of consecutive lengths, ``f_g(j) = min_i f_{g-1}(i) + lengths[j-1] * (C[j] - C[i])``
    with ``C`` the cumulative counts. The cost is Monge, so the best ``i`` never decreases with
    ``j``, and each layer is solved by divide and conquer, one vectorised pass per level:
    ``O(k * U log U)`` for ``U`` distinct lengths.

    >>> optimal_lengths(np.array([1.0, 2.0, 9.0, 10.0]), np.array([5.0, 5.0, 1.0, 1.0]), 2).tolist()
    [2.0, 10.0]
    """
    u = lengths.size
    if u <= k:
        return lengths.copy()
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    f = np.full(u + 1, np.inf)
    f[0] = 0.0
    choices = np.empty((k, u + 1), dtype=np.int64)
    for g in range(k):
        f, choices[g] = _layer(f, lengths, cum)
    # walk back from the last length through each layer's best split
    cuts, j = [], u
    for g in range(k - 1, -1, -1):
        cuts.append(j)
        j = int(choices[g, j])
        if j == 0:
            break
    return lengths[np.array(sorted(set(cuts)), dtype=np.int64) - 1]


def _layer(prev: FloatArray, lengths: FloatArray, cum: FloatArray) -> tuple[FloatArray, IntArray]:
    """One layer of the programme: ``cur[j]`` for every ``j`` and the ``i`` that achieves it."""
    u = lengths.size
    cur = np.full(u + 1, np.inf)
    best = np.zeros(u + 1, dtype=np.int64)
    # tasks: solve j in [jlo, jhi] knowing the best i lies in [ilo, ihi]
    jlo, jhi = np.array([1]), np.array([u])
    ilo, ihi = np.array([0]), np.array([u - 1])
    # Invariant: every j not yet solved lies in exactly one task, whose [ilo, ihi] holds its best i.
    while jlo.size:
        mid = (jlo + jhi) // 2
        top = np.minimum(ihi, mid - 1)
        width = top - ilo + 1
        task = np.repeat(np.arange(mid.size), width)
        i = np.arange(width.sum()) - np.repeat(np.cumsum(width) - width, width) + ilo[task]
        j = mid[task]
        value = prev[i] + lengths[j - 1] * (cum[j] - cum[i])
        heads = np.cumsum(width) - width
        low = np.minimum.reduceat(value, heads)
        hit = np.flatnonzero(value == low[task])
        first = hit[np.concatenate([[True], task[hit][1:] != task[hit][:-1]])]
        arg = i[first]
        cur[mid], best[mid] = low, arg
        left, right = mid > jlo, mid < jhi
        jlo, jhi, ilo, ihi = (
            np.concatenate([jlo[left], mid[right] + 1]),
            np.concatenate([mid[left] - 1, jhi[right]]),
            np.concatenate([ilo[left], arg[right]]),
            np.concatenate([arg[left], ihi[right]]),
        )
    return cur, best


def shape_rows(
    lengths: FloatArray, model: CostModel, budget: float, cap: int | None, multiple: int
) -> IntArray:
    """The most rows whose padded cost ``model(rows, length, rows * length)`` fits ``budget``, per length.

    At least 1 (an oversized sample planned alone), at most ``cap``, and cut to a multiple of
    ``multiple`` when at least ``multiple`` (the planner's ``batch_size_multiple`` rule).

    >>> shape_rows(np.array([10.0, 64.0, 300.0]), PaddedCost(), 256, None, 1).tolist()
    [25, 4, 1]
    >>> shape_rows(np.array([10.0, 64.0]), PaddedCost(), 256, 16, 8).tolist()
    [16, 4]
    """
    limit = MAX_ROWS if cap is None else cap
    lo = np.ones(lengths.size, dtype=np.int64)  # fits (or is the floor of 1)
    hi = np.full(lengths.size, limit + 1, dtype=np.int64)  # does not fit, or beyond the cap
    # Invariant: rows lo fit or are 1; rows hi do not fit or exceed the cap; the answer is in [lo, hi).
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        rows = mid.astype(np.float64)
        ok = model.evaluate(rows, lengths, rows * lengths) <= budget
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    if multiple > 1:
        lo = np.where(lo >= multiple, lo - lo % multiple, lo)
    return lo


def shape_set(
    values: FloatArray,
    budget: float,
    k: int,
    model: CostModel,
    cap: int | None = None,
    multiple: int = 1,
) -> IntArray:
    """At most ``k`` shapes ``(rows, length)`` for samples of sizes ``values``, sorted by length.

    Lengths from :func:`optimal_lengths` over the sizes rounded up to whole numbers, rows from
    :func:`shape_rows`. An (K, 2) int64 array; empty (0, 2) when there are no samples.
    """
    if values.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    lengths = optimal_lengths(*distinct_lengths(values), k)
    rows = shape_rows(lengths, model, budget, cap, multiple)
    return np.stack([rows, lengths.astype(np.int64)], axis=1)


def rounded_sizes(values: FloatArray, shapes: IntArray) -> FloatArray:
    """Each size rounded up to the shortest shape length that holds it (what the planner sees)."""
    lengths = shapes[:, 1].astype(np.float64)
    return lengths[np.searchsorted(lengths, values, side="left")]


def pick_shapes(shapes: IntArray, counts: IntArray, longest: FloatArray) -> IntArray:
    """Each batch's shape: among ``shapes`` with rows >= its count and length >= its longest
    sample, the smallest length, then the smallest rows (the collates' rule). (n, 2) int64.

    Raises:
        ValueError: a batch no shape holds (counting them), which a plan made with these
            shapes never has.
    """
    if counts.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.lexsort((shapes[:, 0], shapes[:, 1]))
    ranked = shapes[order]
    fits = (ranked[None, :, 0] >= counts[:, None]) & (ranked[None, :, 1] >= longest[:, None])
    first = np.argmax(fits, axis=1)
    none = ~fits[np.arange(counts.size), first] if counts.size else np.zeros(0, bool)
    if np.any(none):
        bad = np.flatnonzero(none)
        raise ValueError(
            f"{bad.size} batches fit none of the {len(shapes)} shapes, the first batch {int(bad[0])} "
            f"({int(counts[bad[0]])} samples, longest {float(longest[bad[0]]):g}); its batches were "
            "not planned with these shapes"
        )
    out: IntArray = ranked[first]
    return out


def batch_longest(counts: IntArray, padded_units: FloatArray) -> FloatArray:
    """Each batch's longest size from its padded units (``count * longest`` for 1-D sizes)."""
    out: FloatArray = np.divide(padded_units, counts, out=np.zeros(counts.size), where=counts > 0)
    return out


@dataclasses.dataclass(frozen=True)
class ShapeCost(CostModel):
    """A cost model's cost of a batch's full shape: ``model(count, max, count * max)``.

    Planning against it keeps every batch's count within the rows of its shape also for cost
    models that depend on the sum of sizes (they are non-decreasing in it).
    """

    model: CostModel
    name: ClassVar[str] = "shape"
    checked: ClassVar[bool] = False

    def evaluate(
        self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]
    ) -> FloatArray:
        count = np.asarray(count, dtype=np.float64)
        return self.model.evaluate(count, max_size, count * np.asarray(max_size, dtype=np.float64))

    def max_count(self, max_size: NDArray[Any], budget: float) -> FloatArray | None:
        return self.model.max_count(max_size, budget)


@dataclasses.dataclass(frozen=True)
class RowsCost(CostModel):
    """``model``, over budget for a batch of more samples than the rows of its length's shape.

    With ``batch_size_multiple`` the planner cuts batches to a multiple of it but leaves the last
    batch of a segment uncut, which could then hold more samples than its shape's rows (cut to
    the multiple). Planning against this model keeps every batch within its shape's rows.
    ``lengths`` (ascending) and ``rows`` describe the shape set; a longer batch (a lone oversized
    sample) may hold one sample.

    >>> m = RowsCost(PaddedCost(), (5.0, 10.0), (6, 3))
    >>> m.evaluate(np.array([6.0, 7.0, 3.0]), np.array([5.0, 5.0, 10.0]), np.zeros(3)).tolist()[0]
    30.0
    >>> bool(m.evaluate(np.array([7.0]), np.array([5.0]), np.zeros(1))[0] > 1e300)
    True
    """

    model: CostModel
    lengths: tuple[float, ...]
    rows: tuple[int, ...]
    name: ClassVar[str] = "shape-rows"
    checked: ClassVar[bool] = False

    def _limit(self, max_size: NDArray[Any]) -> FloatArray:
        at = np.searchsorted(np.asarray(self.lengths), np.asarray(max_size, dtype=np.float64), side="left")
        return np.append(np.asarray(self.rows, dtype=np.float64), 1.0)[at]

    def evaluate(self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]) -> FloatArray:
        base = np.asarray(self.model.evaluate(count, max_size, sum_size), dtype=np.float64)
        return np.where(np.asarray(count, dtype=np.float64) > self._limit(max_size), np.finfo(np.float64).max, base)

    def max_count(self, max_size: NDArray[Any], budget: float) -> FloatArray | None:
        inner = self.model.max_count(max_size, budget)
        return None if inner is None else np.minimum(inner, self._limit(max_size))


def planning_cost(model: CostModel, shapes: IntArray | None = None, multiple: int = 1) -> CostModel:
    """The cost model to plan rounded sizes with: ``model`` itself when it ignores the sum.

    With ``batch_size_multiple > 1`` it also keeps every batch within its shape's rows
    (:class:`RowsCost`).
    """
    out: CostModel = model if isinstance(model, (PaddedCost, PaddedPolynomial)) else ShapeCost(model)
    if multiple > 1 and shapes is not None and len(shapes):
        by_length = shapes[np.lexsort((-shapes[:, 0], shapes[:, 1]))]
        lengths, first = np.unique(by_length[:, 1], return_index=True)
        out = RowsCost(out, tuple(float(x) for x in lengths), tuple(int(r) for r in by_length[first, 0]))
    return out


def bounded(
    sizes: Sizes, opts: PlanOptions, source: Sizes | None = None
) -> tuple[IntArray, Sizes, CostModel]:
    """What ``max_shapes`` plans ``sizes`` with: the shape set, the sizes rounded to it, the planning cost.

    The shape set is chosen over ``source`` (default: ``sizes``; a re-planned rest of an epoch
    passes every sample, so the shapes stay those of the whole dataset), less the samples
    ``oversized="skip"`` leaves out.

    Raises:
        ValueError: D-dimensional sizes (a shape is one length per batch).
    """
    over = sizes if source is None else source
    if over.values.ndim != 1:
        raise ValueError(
            f"max_shapes={opts.max_shapes} needs one size per sample, got sizes of shape "
            f"{over.values.shape}; pass 1-D sizes (lengths), or max_shapes=None"
        )
    values = over.values
    alone = opts.cost.sample_cost(np.ceil(values)) > opts.budget  # a shape's length is whole
    k = opts.max_shapes if opts.max_shapes is not None else max(len(values), 1)
    if opts.oversized == "skip" or not alone.any():
        shapes = _shapes_of(values[~alone], k, opts)
    else:  # "single": samples over the budget alone share one shape of their own, (1, longest)
        if k < 2 and not alone.all():
            n = int(alone.sum())
            raise ValueError(
                f"max_shapes={k} cannot give the {n} sample{'s' if n > 1 else ''} over the budget alone "
                "(oversized='single') a shape apart from the others; pass max_shapes >= 2 or "
                "oversized='skip'"
            )
        top = np.array([[1, int(math.ceil(values[alone].max()))]], dtype=np.int64)
        shapes = np.concatenate([_shapes_of(values[~alone], k - 1, opts), top])
    return shapes, Sizes(rounded_sizes(sizes.values, shapes), True), planning_cost(opts.cost, shapes, opts.batch_size_multiple)


def _shapes_of(values: FloatArray, k: int, opts: PlanOptions) -> IntArray:
    return shape_set(
        values, opts.budget, k, opts.cost, opts.max_batch_size, opts.batch_size_multiple
    )


def grid_strategy(strategy: Strategy) -> Strategy:
    """The strategy that plans sizes rounded to the shape grid: its size levels are the grid's.

    On the grid every sample of a level has the same planning size, and samples of equal size
    are ordered at random each epoch; a ``randomness`` level mixing grid lengths would pad short
    samples to the next shape instead. So a strategy with ``randomness`` plans by exact size here.

    >>> import fitbatch
    >>> grid_strategy(fitbatch.Pooled()).randomness is None
    True
    """
    if getattr(strategy, "randomness", None) is not None:
        return dataclasses.replace(strategy, randomness=None)  # type: ignore[type-var]
    return strategy


def union(sets: list[IntArray | None]) -> IntArray | None:
    """The shapes of several plans' shape sets, sorted by length then rows (``None`` if none has one).

    >>> union([np.array([[8, 5], [4, 10]]), None, np.array([[6, 5]])]).tolist()
    [[6, 5], [8, 5], [4, 10]]
    """
    have = [s for s in sets if s is not None]
    if not have:
        return None
    shapes = np.unique(np.concatenate(have), axis=0)
    out: IntArray = shapes[np.lexsort((shapes[:, 0], shapes[:, 1]))]
    return out


def shape_stats(shapes: IntArray | None, real_units: FloatArray) -> dict[str, Any]:
    """``n_shapes`` and ``shape_efficiency`` of a plan's per-batch ``shapes`` (``{}`` without shapes)."""
    if shapes is None:
        return {}
    area = float(np.sum(shapes[:, 0] * shapes[:, 1], dtype=np.float64))
    n_shapes = int(np.unique(shapes, axis=0).shape[0]) if shapes.size else 0
    return {
        "n_shapes": n_shapes,
        "shape_efficiency": float(real_units.sum()) / area if area > 0 else 1.0,
    }




__all__ = [
    "MAX_DISTINCT",
    "ShapeCost",
    "batch_longest",
    "bounded",
    "distinct_lengths",
    "optimal_lengths",
    "pick_shapes",
    "planning_cost",
    "rounded_sizes",
    "shape_rows",
    "shape_set",
    "shape_stats",
    "union",
]
