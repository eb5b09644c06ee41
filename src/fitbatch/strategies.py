"""Strategies: which samples go together. Each orders the samples, then calls a kernel.

* :class:`Sequential` — greedy in the given order (or a shuffled one); the seed tools' behaviour.
* :class:`Sorted` — greedy over samples sorted by size; for evaluation.
* :class:`Pooled` — shuffle, cut into pools, sort each pool, greedy, shuffle the batch order.
* :class:`Buckets` — size buckets fitted to the data; shuffle inside buckets, equal-count batches
  per bucket, the buckets' leftovers planned together; batches interleaved at random.
* :class:`Packed` — bin packing within pools: for costs that grow with the sum each batch takes
  the largest remaining samples and fills the rest with the smallest; other costs are already
  count-bound, so it plans like :class:`Pooled`.
* :class:`Fixed` — ``batch_size`` samples per batch whatever they cost (the baseline; not a
  name, since it needs its batch size).

Any strategy works with any cost model. A strategy is a frozen dataclass; the names
``"sequential"``, ``"sorted"``, ``"pooled"``, ``"buckets"`` and ``"packed"`` give the defaults.

>>> resolve_strategy("pooled")
Pooled(pool_size=65536)
>>> resolve_strategy(Buckets(spread=0.05)).spread
0.05
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fitbatch import _kernels as K
from fitbatch import _rng
from fitbatch import _sorting as SK
from fitbatch._packing import two_ended_starts
from fitbatch._validate import choice, fraction, positive_int
from fitbatch.costs import CostModel
from fitbatch.sizes import Sizes

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclasses.dataclass
class Context:
    """Everything a strategy needs for one epoch; sort keys are computed once, on demand."""

    sizes: Sizes
    budget: float
    cost: CostModel
    cap: int | None
    multiple: int
    shuffle: bool
    seed: int
    epoch: int
    _keys: tuple[NDArray[np.uint16], FloatArray] | None = None

    def rng(self, purpose: str) -> np.random.Generator:
        return _rng.generator(self.seed, self.epoch, purpose)

    def keys(self) -> tuple[NDArray[np.uint16], FloatArray]:
        """16-bit size keys (by sample cost for D-dimensional sizes) and each key's upper edge."""
        if self._keys is None:
            v = self.sizes.values
            if v.ndim == 1:
                self._keys = self.sizes.cached("size_keys", lambda: SK.size_keys(v, self.sizes.integral))
            else:
                self._keys = SK.size_keys(self.cost.sample_cost(v), False)
        return self._keys


@dataclasses.dataclass(frozen=True)
class Result:
    """A strategy's output: sample positions in batch order, batch starts, and tail batches."""

    order: IntArray
    starts: IntArray
    tails: NDArray[np.bool_]  # batches closed because their segment ran out (drop_last candidates)
    identity: bool = False  # order is 0..n-1


class Strategy(ABC):
    """Base class: :meth:`plan` lays out one epoch's batches, :meth:`batch_order` may reorder them.

    >>> import fitbatch
    >>> {s.plan_name: fitbatch.plan_batches([5, 1, 4, 2, 3, 3], 6, strategy=s).to_lists()
    ...  for s in (fitbatch.Sequential(), fitbatch.Sorted())}
    {'sequential': [[0], [1], [2], [3, 4], [5]], 'sorted': [[1, 3], [5, 4], [2], [0]]}
    """

    name: ClassVar[str]
    default_shuffle: ClassVar[bool] = True

    @abstractmethod
    def plan(self, ctx: Context) -> Result:
        """Plan one epoch of batches over ``ctx.sizes``."""

    @property
    def plan_name(self) -> str:
        """How plans made by this strategy name it (``BatchPlan.strategy_name``)."""
        return self.name

    def batch_order(self, ctx: Context, n_batches: int) -> IntArray | None:
        """A permutation of the planned batches, or None to keep them as planned."""
        if ctx.shuffle and n_batches > 1:
            return ctx.rng("batch-order").permutation(n_batches).astype(np.int64)
        return None


def _tails(starts: IntArray, seg_starts: IntArray, n: int) -> NDArray[np.bool_]:
    """Batches holding the last position of a segment (closed because the segment ran out)."""
    tails = np.zeros(starts.size, dtype=bool)
    if starts.size:
        last = np.append(seg_starts[1:], n) - 1
        tails[np.searchsorted(starts, last, side="right") - 1] = True
    return tails


Levels = tuple[NDArray[Any], FloatArray]  # (level per position, upper edge per level)


def _greedy(
    ctx: Context, order: IntArray, seg_starts: IntArray, levels: Levels | None, identity: bool = False
) -> Result:
    """Run the right kernel over samples laid out in ``order`` with the given segments.

    ``levels`` (1-D sizes only) says the planning max is non-increasing in each segment;
    ``identity`` that ``order`` is 0..n-1 (no gather needed).
    """
    if levels is not None and ctx.sizes.ndim == 1:
        level, edges = levels
        values = ctx.sizes.values[order] if ctx.cost.max_count(edges[:1], ctx.budget) is None else ctx.sizes.values[:0]
        starts = K.descending_starts(
            level, edges, values, seg_starts, ctx.budget, ctx.cost, cap=ctx.cap, multiple=ctx.multiple
        )
    else:
        force = None
        if seg_starts.size > 1:
            force = np.zeros(order.size, dtype=bool)
            force[seg_starts] = True
        starts, _ = K.greedy_starts(
            ctx.sizes.values if identity else ctx.sizes.values[order], ctx.budget, ctx.cost, cap=ctx.cap, multiple=ctx.multiple, force=force
        )
    return Result(order, starts, _tails(starts, seg_starts, order.size), identity)


def _gather_into(values: IntArray, index: IntArray) -> IntArray:
    """``values[index]`` written over ``index`` (one array of n int64 fewer at the peak).

    Each output element depends only on the index at the same position, and ``mode="clip"``
    does not buffer, so overwriting the index array in place is safe.
    """
    return np.take(values, index, out=index, mode="clip")


def _random_positions(n: int, rng: np.random.Generator) -> IntArray:
    """A fast shuffle: stable radix sort by 16 random bits (ties keep index order)."""
    if n <= 1 << 16:
        return rng.permutation(n).astype(np.int64)
    return SK.stable_argsort_u16(rng.integers(0, 1 << 16, size=n, dtype=np.uint16))


def _pooled_layout(ctx: Context, pool_size: int) -> tuple[IntArray, IntArray, Levels]:
    """Shuffle (if asked), cut into pools, sort each pool by descending size key."""
    n = len(ctx.sizes)
    keys, edges = ctx.keys()
    base = _random_positions(n, ctx.rng("pools")) if ctx.shuffle else np.arange(n, dtype=np.int64)
    down = np.uint16(SK.KEY_LEVELS - 1) - keys[base]
    order = _gather_into(base, SK.sort_within_segments(down, pool_size))
    seg_starts = np.arange(0, n, pool_size, dtype=np.int64) if n else np.zeros(0, np.int64)
    return order, seg_starts, (keys[order], edges)


@dataclasses.dataclass(frozen=True)
class Sequential(Strategy):
    """Greedy in the given order (shuffled first when ``shuffle=True``).

    >>> import fitbatch
    >>> fitbatch.plan_batches([4, 1, 3, 2, 5], 6, cost="sum", strategy=fitbatch.Sequential()).to_lists()
    [[0, 1], [2, 3], [4]]
    """

    name: ClassVar[str] = "sequential"
    default_shuffle: ClassVar[bool] = False

    def plan(self, ctx: Context) -> Result:
        n = len(ctx.sizes)
        if ctx.shuffle:
            order = ctx.rng("order").permutation(n).astype(np.int64)
            return _greedy(ctx, order, np.zeros(min(n, 1), np.int64), None)
        return _greedy(ctx, np.arange(n, dtype=np.int64), np.zeros(min(n, 1), np.int64), None, identity=True)

    def batch_order(self, ctx: Context, n_batches: int) -> IntArray | None:
        return None


@dataclasses.dataclass(frozen=True)
class Sorted(Strategy):
    """Greedy over samples sorted by size: ascending (default) or descending batches.

    Batches are planned from the longest samples down; ``descending=False`` then reverses them.
    With ``shuffle=True`` equal sizes are tied at random instead of by index.

    >>> import fitbatch
    >>> [fitbatch.plan_batches([5, 1, 4, 2, 3, 3], 6, strategy=fitbatch.Sorted(descending=d)).to_lists() for d in (False, True)]
    [[[1, 3], [5, 4], [2], [0]], [[0], [2], [4, 5], [3, 1]]]
    """

    descending: bool = False
    name: ClassVar[str] = "sorted"
    default_shuffle: ClassVar[bool] = False

    def plan(self, ctx: Context) -> Result:
        n = len(ctx.sizes)
        order, _, levels = _pooled_layout(ctx, max(n, 1))
        result = _greedy(ctx, order, np.zeros(min(n, 1), np.int64), levels)
        if self.descending or result.starts.size == 0:
            return result
        # Reversing the whole order reverses the batches and the samples inside each batch.
        ends = np.append(result.starts[1:], n)
        return Result(result.order[::-1].copy(), (n - ends)[::-1].copy(), result.tails[::-1].copy())

    def batch_order(self, ctx: Context, n_batches: int) -> IntArray | None:
        return None


@dataclasses.dataclass(frozen=True)
class _Pools(Strategy):
    """Base of the strategies that shuffle, cut into pools of ``pool_size`` and sort each pool."""

    pool_size: int = 65536

    def __post_init__(self) -> None:
        positive_int("pool_size", self.pool_size)


@dataclasses.dataclass(frozen=True)
class Pooled(_Pools):
    """Shuffle, sort within pools of ``pool_size`` samples, greedy, shuffle the batch order.

    Larger pools pad less; smaller pools are more random (samples meet other partners each
    epoch). The default (65536) reaches padding efficiency >= 0.98 with a co-batch repeat rate
    <= 0.15 from about a million samples on; on smaller datasets, ``pool_size`` near n / 16
    trades a few points of padding for fresh batch partners every epoch (or use ``buckets``).

    >>> import fitbatch
    >>> [len(fitbatch.plan_batches([9, 2, 8, 3, 7, 1, 6, 2], 18, strategy=fitbatch.Pooled(pool_size=p))) for p in (2, 8)]
    [4, 3]
    """

    name: ClassVar[str] = "pooled"

    def plan(self, ctx: Context) -> Result:
        return _greedy(ctx, *_pooled_layout(ctx, self.pool_size))


@dataclasses.dataclass(frozen=True)
class Packed(_Pools):
    """Bin packing within pools (see the module docstring).

    >>> import fitbatch
    >>> fitbatch.plan_batches([9, 8, 7, 3, 2, 1], 10, cost="sum", strategy=fitbatch.Packed()).to_lists()
    [[0, 5], [1, 4], [2, 3]]
    """

    name: ClassVar[str] = "packed"

    def plan(self, ctx: Context) -> Result:
        order, seg_starts, levels = _pooled_layout(ctx, self.pool_size)
        if not (K.plain_sum(ctx.cost) and ctx.sizes.ndim == 1 and ctx.multiple == 1):
            return _greedy(ctx, order, seg_starts, levels)
        values = ctx.sizes.values[order]
        inner, starts = two_ended_starts(values, seg_starts, ctx.budget, ctx.cap)
        del values
        order = _gather_into(order, inner)
        # Packing keeps each segment's samples together, so segment borders stay where they were.
        return Result(order, starts, _tails(starts, seg_starts, order.size))


@dataclasses.dataclass(frozen=True)
class Buckets(Strategy):
    """Size buckets fitted to the data, or given as ``boundaries`` (upper edges, ascending).

    Fitted buckets are as narrow as ``spread`` (relative width, which bounds padding) while each
    holds at least ``min_batches`` full batches (which bounds how often the same samples meet);
    on small datasets the minimum shrinks to 1/64 of the epoch's batches (at least 2) so that
    buckets stay narrow.
    Inside a bucket samples are shuffled and cut into equal-count batches sized for the bucket's
    largest sample; every bucket's leftover is planned together, sorted, at the end.

    >>> import fitbatch
    >>> sizes = [1, 9, 2, 7, 3, 8, 2, 6]
    >>> [[sizes[i] for i in b] for b in fitbatch.plan_batches(sizes, 16, strategy=fitbatch.Buckets(boundaries=(4, 8)))]
    [[2, 2, 1], [8, 6], [9], [7, 3]]
    """

    boundaries: tuple[float, ...] | None = None
    spread: float = 0.02
    min_batches: int = 16
    name: ClassVar[str] = "buckets"

    def __post_init__(self) -> None:
        fraction("spread", self.spread, low=0.0, high=math.inf)
        positive_int("min_batches", self.min_batches)
        if self.boundaries is not None:
            b = np.asarray(self.boundaries, dtype=np.float64)
            if b.ndim != 1 or b.size == 0 or not np.all(np.isfinite(b)) or np.any(np.diff(b) <= 0):
                raise ValueError(f"boundaries must be a non-empty strictly increasing sequence, got {self.boundaries!r}")
            object.__setattr__(self, "boundaries", tuple(float(x) for x in b))

    def bucket_ids(self, ctx: Context) -> tuple[NDArray[Any], FloatArray]:
        """Bucket of every sample (0 = smallest sizes) and each bucket's upper edge."""
        if self.boundaries is not None:
            values = ctx.sizes.values if ctx.sizes.ndim == 1 else ctx.cost.sample_cost(ctx.sizes.values)
            ids = np.searchsorted(np.asarray(self.boundaries), values, side="left").astype(np.int64)
            top = np.zeros(len(self.boundaries) + 1)
            np.maximum.at(top, ids, values)
            return ids, top
        keys, edges = ctx.keys()
        lut, top = fit_buckets(keys, edges, ctx.budget, ctx.cost, ctx.cap, self.spread, self.min_batches, ctx.sizes.ndim)
        return lut[keys], top

    def plan(self, ctx: Context) -> Result:
        n = len(ctx.sizes)
        if n == 0:
            return Result(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
        ids, top = self.bucket_ids(ctx)
        base = _random_positions(n, ctx.rng("buckets")) if ctx.shuffle else np.arange(n, dtype=np.int64)
        n_buckets = top.size
        # descending bucket id, as 16-bit keys where possible (an O(n) radix sort)
        down = (n_buckets - 1) - ids[base]
        idx = np.argsort(down.astype(np.uint16) if n_buckets <= 1 << 16 else down, kind="stable")
        order = _gather_into(base, idx.astype(np.int64, copy=False))
        del base, down, idx  # n int64 fewer while the batches are planned
        counts = np.bincount(ids, minlength=n_buckets)[::-1]
        seg_starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[counts > 0].astype(np.int64)
        if ctx.sizes.ndim > 1:
            return _greedy(ctx, order, seg_starts, None)
        first = _greedy(ctx, order, seg_starts, (ids[order], top))
        return self._replan_leftovers(ctx, first)

    def _replan_leftovers(self, ctx: Context, first: Result) -> Result:
        """Plan the short last batch of every bucket together, sorted, for fewer batches."""
        n = first.order.size
        lengths = np.diff(np.append(first.starts, n))
        loose = first.tails
        if np.count_nonzero(loose) <= 1:
            return first
        in_loose = np.repeat(loose, lengths)
        rest = first.order[in_loose]
        keys, edges = ctx.keys()
        sub_order = rest[np.argsort(np.uint16(SK.KEY_LEVELS - 1) - keys[rest], kind="stable")]
        again = _greedy(ctx, sub_order, np.zeros(1, np.int64), (keys[sub_order], edges))
        # compact the kept positions to the front of the order buffer, the re-plan after them
        order = first.order
        n_kept = n - again.order.size
        order[:n_kept] = order[~in_loose]
        order[n_kept:] = again.order
        kept_starts = np.concatenate([[0], np.cumsum(lengths[~loose])[:-1]]) if (~loose).any() else np.zeros(0)
        starts = np.concatenate([kept_starts, n_kept + again.starts]).astype(np.int64)
        tails = np.concatenate([np.zeros(int(np.count_nonzero(~loose)), bool), again.tails])
        return Result(order, starts, tails)


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
    if ndim == 1:
        per_batch = cost.max_count(edges[present], budget)
        if per_batch is None:
            per_batch = budget / np.maximum(cost.sample_cost(edges[present]), 1e-300)
    else:
        per_batch = budget / np.maximum(edges[present], 1e-300)
    per_batch = np.clip(np.floor(per_batch), 1, cap if cap is not None else np.inf)
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


def fixed_counts(n: int, counts: IntArray, *, shuffle: bool, seed: int, epoch: int, purpose: str) -> Result:
    """The fixed-count planner: batch k holds the next ``counts[k]`` samples, whatever they cost.

    Samples come in index order, or in the permutation drawn from (seed, epoch, ``purpose``)
    when ``shuffle``; those past ``counts.sum()`` end ``order`` in no batch. Serves
    :class:`Fixed` and the sample-count steps of :mod:`fitbatch.schedule`.
    """
    if shuffle:
        order = _rng.generator(seed, epoch, purpose).permutation(n).astype(np.int64)
    else:
        order = np.arange(n, dtype=np.int64)
    starts = (np.cumsum(counts) - counts).astype(np.int64)
    return Result(order, starts, _tails(starts, np.zeros(min(n, 1), np.int64), int(counts.sum())), identity=not shuffle)


@dataclasses.dataclass(frozen=True)
class Fixed(Strategy):
    """``batch_size`` samples per batch whatever they cost: the baseline a budget is compared to.

    Samples are taken in order (shuffled by default, as a fixed-size ``DataLoader`` does), the
    last batch takes the rest. The budget only measures the batches (their fills); it does not
    shape them, so a batch may exceed it. ``max_batch_size`` must allow ``batch_size``, and
    ``batch_size_multiple`` must divide it.

    >>> import fitbatch
    >>> plan = fitbatch.plan_batches([4, 1, 3, 2, 5], 8, strategy=fitbatch.Fixed(2), shuffle=False)
    >>> plan.to_lists(), plan.costs.tolist(), plan.strategy_name
    ([[0, 1], [2, 3], [4]], [8.0, 6.0, 5.0], 'fixed(2)')
    """

    batch_size: int
    name: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", positive_int("batch_size", self.batch_size))

    @property
    def plan_name(self) -> str:
        return f"fixed({self.batch_size})"

    def plan(self, ctx: Context) -> Result:
        bs = self.batch_size
        if (ctx.cap is not None and ctx.cap < bs) or bs % ctx.multiple:
            raise ValueError(
                f"Fixed(batch_size={bs}) does not fit max_batch_size={ctx.cap} and "
                f"batch_size_multiple={ctx.multiple}: pass a batch size within both, or leave them out"
            )
        n = len(ctx.sizes)
        counts = np.full(n // bs, bs, dtype=np.int64)
        if n % bs:
            counts = np.append(counts, n % bs)
        return fixed_counts(n, counts, shuffle=ctx.shuffle, seed=ctx.seed, epoch=ctx.epoch, purpose="fixed-order")

    def batch_order(self, ctx: Context, n_batches: int) -> IntArray | None:
        return None


STRATEGIES: dict[str, type[Strategy]] = {
    "buckets": Buckets,
    "packed": Packed,
    "pooled": Pooled,
    "sequential": Sequential,
    "sorted": Sorted,
}


def resolve_strategy(strategy: str | Strategy) -> Strategy:
    """Coerce a strategy name or instance into a :class:`Strategy`.

    >>> resolve_strategy("sorted"), resolve_strategy(Fixed(4))
    (Sorted(descending=False), Fixed(batch_size=4))
    """
    if isinstance(strategy, Strategy):
        return strategy
    name = choice("strategy", strategy, tuple(STRATEGIES))
    return STRATEGIES[name]()


def strategy_names() -> Sequence[str]:
    return tuple(STRATEGIES)
