"""Size buckets fitted to the data (or given), equal-count batches per bucket."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import sorting as SK
from fitbatch._validate import fraction, positive_int
from fitbatch.costs import CostModel
from fitbatch.strategies import _lattice
from fitbatch.strategies._base import (
    Context,
    FloatArray,
    IntArray,
    Result,
    Strategy,
    _greedy,
    _mixed_order,
    replan,
)
from fitbatch.strategies._mixing import (
    LEVEL_BATCHES,
    _per_batch,
    check_randomness,
    mixed_levels,
)
from fitbatch.strategies._ordered import _allowance, within_allowance


@dataclasses.dataclass(frozen=True)
class Buckets(Strategy):
    """Size buckets fitted to the data, or given as ``boundaries`` (upper edges, ascending).

    ``randomness`` is the co-batch repeat rate the fitted buckets aim at: the share of sample
    pairs batched together in one epoch that meet again in the next (pair-weighted, as
    :func:`fitbatch.plan.repeat_rate` measures it). Lower is more random and pads more. Buckets of
    small sizes (many samples, many pairs per batch) are made wide, buckets of large sizes stay
    as narrow as ``spread``; when shuffled, their boundaries move every epoch (as for
    :class:`Pooled`). ``"auto"`` (default) takes the lowest repeat rate whose buckets cost about
    2 % more batches than exact sorting (less above 100k samples), within [0.005, 0.15].
    ``randomness=None`` keeps the earlier fitting: buckets as narrow as ``spread`` holding at
    least ``min_batches`` full batches (on small datasets 1/64 of the epoch's batches, at least 2).
    Inside a bucket samples are shuffled and cut into equal-count batches sized for the bucket's
    largest sample; every bucket's leftover is planned together, sorted, at the end. ``"auto"``
    lays buckets out on a lattice instead of shuffling them where :class:`Pooled` does (sets of
    up to 65,536 samples, epochs of 64 batches or more: ``fitbatch.strategies._lattice``).

    >>> import fitbatch
    >>> sizes = [1, 9, 2, 7, 3, 8, 2, 6]
    >>> [[sizes[i] for i in b] for b in fitbatch.plan_batches(sizes, 16, strategy=fitbatch.Buckets(boundaries=(4, 8)))]
    [[2, 2, 1], [8, 6], [9], [7, 3]]
    """

    boundaries: tuple[float, ...] | None = None
    spread: float = 0.02
    min_batches: int = 16
    randomness: float | Literal["auto"] | None = "auto"
    name: ClassVar[str] = "buckets"

    def __post_init__(self) -> None:
        fraction("spread", self.spread, low=0.0, high=math.inf)
        positive_int("min_batches", self.min_batches)
        check_randomness(self.randomness)
        if self.boundaries is not None:
            b = np.asarray(self.boundaries, dtype=np.float64)
            if b.ndim != 1 or b.size == 0 or not np.all(np.isfinite(b)) or np.any(np.diff(b) <= 0):
                raise ValueError(
                    f"boundaries must be a non-empty strictly increasing sequence, got {self.boundaries!r}"
                )
            object.__setattr__(self, "boundaries", tuple(float(x) for x in b))

    def bucket_ids(self, ctx: Context) -> tuple[NDArray[Any], FloatArray]:
        """Bucket of every sample (0 = smallest sizes) and each bucket's upper edge."""
        ids, top, _, _ = self._buckets(ctx)
        return ids, top

    def _buckets(
        self, ctx: Context, width: float = LEVEL_BATCHES, scale: float = 1.0
    ) -> tuple[NDArray[Any], FloatArray, NDArray[np.int64], bool]:
        """:meth:`bucket_ids`, the samples in each bucket and whether the levels are few-batch
        ones (``width``, ``scale``: see :func:`~fitbatch.strategies._ordered.within_allowance`)."""
        if self.boundaries is not None:
            values = (
                ctx.sizes.values if ctx.sizes.values.ndim == 1 else ctx.cost.order_cost(ctx.sizes.values)
            )
            ids = np.searchsorted(np.asarray(self.boundaries), values, side="left").astype(np.int64)
            top = np.zeros(len(self.boundaries) + 1)
            np.maximum.at(top, ids, values)
            return ids, top, np.bincount(ids, minlength=top.size), False
        keys, edges = ctx.keys()
        few = False
        if self.randomness is not None:
            lut, top, few = mixed_levels(ctx, self.spread, self.randomness, width, scale)
        else:
            lut, top = fit_buckets(
                keys,
                edges,
                ctx.budget,
                ctx.cost,
                ctx.cap,
                self.spread,
                self.min_batches,
                ctx.sizes.values.ndim,
            )
        ids = lut[keys]
        if keys.size < SK.KEY_LEVELS:  # fewer samples than keys: counted directly
            return ids, top, np.bincount(ids, minlength=top.size).astype(np.int64, copy=False), few
        # samples per bucket from samples per key: 2**16 additions, not n
        per_key = ctx.key_counts()
        present = np.flatnonzero(per_key)  # (a weighted bincount over the keys present: no ufunc.at)
        counts = np.bincount(lut[present], weights=per_key[present], minlength=top.size).astype(np.int64)
        return ids, top, counts, few

    def plan(self, ctx: Context) -> Result:
        n = len(ctx.sizes)
        if n == 0:
            return Result(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
        result, few = self._plan(ctx, LEVEL_BATCHES, 1.0)
        if self.boundaries is not None or self.randomness != "auto":
            return result
        return within_allowance(ctx, result, few, lambda width, scale: self._plan(ctx, width, scale)[0], _allowance(ctx, few))

    def _plan(self, ctx: Context, width: float, scale: float) -> tuple[Result, bool]:
        """The plan over buckets fitted with ``width`` and ``scale``, and whether they are
        few-batch levels."""
        n = len(ctx.sizes)
        ids, top, counts, few = self._buckets(ctx, width, scale)
        n_buckets = top.size
        # mixed (see _mixed_order), then by descending bucket id (16-bit keys: an O(n) radix sort)
        lattice = self.boundaries is None and _lattice.applies(self.randomness, few, ctx.shuffle, n)
        order = _mixed_order(ctx, ids, n_buckets - 1, "buckets", lattice)
        counts = counts[::-1]
        seg_starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[counts > 0].astype(np.int64)
        if ctx.sizes.values.ndim > 1:
            return _greedy(ctx, order, seg_starts, None), few
        first = _greedy(ctx, order, seg_starts, (ids[order], top))
        del ids, order  # (2 B a sample: not held while the leftovers are planned again)
        return self._replan_leftovers(ctx, first), few

    def _replan_leftovers(self, ctx: Context, first: Result) -> Result:
        """Plan the short last batch of every bucket together, sorted, for fewer batches."""
        keys, edges = ctx.keys()

        def sorted_plan(rest: IntArray) -> Result:
            sub_order = rest[np.argsort(np.uint16(SK.KEY_LEVELS - 1) - keys[rest], kind="stable")]
            return _greedy(ctx, sub_order, np.zeros(1, np.int64), (keys[sub_order], edges))

        return replan(first, first.tails, sorted_plan)


def fit_buckets(
    keys: NDArray[np.uint16],
    edges: FloatArray,
    budget: float,
    cost: CostModel,
    cap: int | None,
    spread: float,
    min_batches: int,
    ndim: int = 1,
) -> tuple[NDArray[Any], FloatArray]:
    """Bucket boundaries over the key histogram, from the largest sizes down.

    Returns a lookup table key -> bucket id (0 = smallest) and each bucket's upper edge.
    """
    hist = np.bincount(keys, minlength=SK.KEY_LEVELS)
    present = np.flatnonzero(hist)[::-1]
    lows = np.concatenate([[0.0], edges[:-1]])  # every value with key k is > edges[k-1]
    per_batch = _per_batch(edges[present], budget, cost, cap, ndim)
    epoch_batches = float(np.sum(hist[present] / per_batch))
    min_batches = int(np.clip(epoch_batches / 64, 2, max(min_batches, 2)))
    bucket_of = np.zeros(SK.KEY_LEVELS, dtype=np.int64)
    tops: list[float] = []
    pop = 0
    top = 0.0
    need = 0.0
    # Invariant: keys already visited are assigned to buckets; the open bucket has upper edge
    # `top`, `pop` samples, and needs `need` samples to hold min_batches full batches.
    for j, k in enumerate(present.tolist()):
        if pop and pop >= need and lows[k] * (1.0 + spread) < top:
            pop = 0
        if pop == 0:
            tops.append(float(edges[k]))
            top = float(edges[k])
            need = min_batches * float(per_batch[j])
        bucket_of[k] = len(tops) - 1
        pop += int(hist[k])
    if len(tops) > 1 and pop < need:
        # the smallest sizes ran out before filling min_batches batches: join the bucket above
        bucket_of[present] = np.minimum(bucket_of[present], len(tops) - 2)
        tops.pop()
    n_buckets = len(tops)
    lut = (n_buckets - 1 - bucket_of).astype(np.uint16 if n_buckets <= 1 << 16 else np.int64)
    return lut, np.asarray(tops[::-1], dtype=np.float64)
