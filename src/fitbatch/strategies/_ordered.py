"""Strategies that order the samples, then run the greedy kernel: sequential, sorted, pooled,
and packed (bin packing within pools)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from fitbatch import _lazy
from fitbatch._kernels import batches as K
from fitbatch._kernels import histogram
from fitbatch._kernels import packing_depth as PD
from fitbatch._kernels import sorting as SK
from fitbatch._kernels.batches import FloatArray
from fitbatch._kernels.packing import batch_loads, first_fit_keys, first_fit_laid
from fitbatch._validate import fraction, positive_int
from fitbatch.strategies import _lattice
from fitbatch.strategies._base import (
    Context,
    IntArray,
    Result,
    Strategy,
    _greedy,
    _mixed_order,
    _pooled_layout,
    _pooled_order,
    _tails,
    remembered,
    replan,
)
from fitbatch.strategies._mixing import (
    AUTO_MAX_EXCESS,
    LEVEL_BATCHES,
    _per_batch,
    auto_excess,
    check_randomness,
    mixed_levels,
)
from fitbatch.strategies._recut import enabled as recut_enabled
from fitbatch.strategies._recut import least_cost_starts

if TYPE_CHECKING:
    from fitbatch._kernels import pattern_layout
else:  # loaded by the first plan that lays out batch patterns (the histogram path), not by import fitbatch
    pattern_layout = _lazy.module("fitbatch._kernels.pattern_layout")

# Packed batches filled below this share of the budget are packed again with every pool's.
LOOSE = 0.95
# "auto" few-batch levels over their batch allowance: up to this many narrowings, by 0.75 each
NARROWER_LEVELS = 4
# ... and other "auto" epochs over AUTO_MAX_EXCESS: up to this many fits aiming 3 % lower each
# (the last a quarter as high)
THRIFTIER_FITS = 9
# "auto" epochs whose batch target (auto_excess) is at least this are checked against exact
# sorting: sets of up to 100,000 samples (above, the target is 2 % or less and epochs stay within 2.5 %)
CHECKED_EXCESS = 0.02


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
            order = ctx.rng("order").permutation(n).astype(np.int64, copy=False)
            return _greedy(ctx, order, np.zeros(min(n, 1), np.int64), None)
        return _greedy(
            ctx, np.arange(n, dtype=np.int64), np.zeros(min(n, 1), np.int64), None, identity=True
        )

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

    def __post_init__(self) -> None:
        if not isinstance(self.descending, (bool, np.bool_)):
            raise TypeError(f"Sorted(descending=...) must be True or False, got {self.descending!r}")

    def plan(self, ctx: Context) -> Result:
        n = len(ctx.sizes)
        order, _, levels = _pooled_layout(ctx, max(n, 1))
        result = _greedy(ctx, order, np.zeros(min(n, 1), np.int64), levels)
        del levels  # not held while the order is reversed
        if self.descending or result.starts.size == 0:
            return result
        # Reversing the whole order reverses the batches and the samples inside each batch.
        ends = np.append(result.starts[1:], n)
        laid = None if result.laid is None else _reverse(result.laid)
        return Result(_reverse(result.order), (n - ends)[::-1].copy(), result.tails[::-1].copy(), laid=laid)

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

    Pools are sorted by size level, not by exact size: ``randomness`` is the co-batch repeat
    rate aimed at (the share of pairs batched together in one epoch that meet again in the
    next, :func:`fitbatch.plan.repeat_rate`), and the levels are fitted for it as
    :class:`Buckets` fits its buckets (wide levels for small sizes, whose batches hold many
    pairs; levels as narrow as ``spread`` for large ones). Inside a level the order is random,
    so batch partners change every epoch, and when shuffled the level boundaries move every
    epoch too (halving the repeat rate; ``fitbatch.strategies._mixing.shift_levels``); the
    levels span the whole epoch (``pool_size`` only applies to ``randomness=None``). ``"auto"``
    (default) takes the lowest repeat rate whose levels cost about 2 % more batches than exact
    sorting at 100k samples (less above, up to 5 % below: small sets are seen for many
    epochs), within [0.005, 0.15]; epochs of under 64 batches get levels of 0.6 of a batch.
    On sets of up to 65,536 samples the other "auto" epochs lay each level out on a lattice
    instead of at random (``fitbatch.strategies._lattice``): the pairs of one epoch's batches
    are spread apart in the next, which about halves the repeat rate at the same levels.
    On sets of up to 100,000 samples every "auto" epoch is checked against exact sorting and
    fitted again, a little less random, until it spends at most 5 % more batches (the fit aims
    at its share on average; the epochs whose levels moved least can land over it); what the
    levels leave of those 5 % goes to cutting the batches of most samples in parts
    (:func:`split_densest`: fewer pairs, no padding; one process only, like the cheapest cuts:
    the steps of several ranks need batches of even cost). With whole sizes, a size that fills a
    batch on its own level is never batched with another (:func:`_pure_borders`).
    ``randomness=None`` sorts each pool by exact size: the tightest plan, but on datasets under
    a million samples the same samples meet again epoch after epoch. Larger pools pad less.

    >>> import fitbatch
    >>> [len(fitbatch.plan_batches([9, 2, 8, 3, 7, 1, 6, 2], 18, strategy=fitbatch.Pooled(pool_size=p, randomness=None))) for p in (2, 8)]
    [4, 3]
    >>> fitbatch.plan_batches([5, 1, 4, 2, 3, 3], 6, strategy=fitbatch.Pooled(randomness=0.5)).stats().max_fill <= 1
    True
    """

    randomness: float | Literal["auto"] | None = "auto"
    spread: float = 0.02
    name: ClassVar[str] = "pooled"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_randomness(self.randomness)
        fraction("spread", self.spread, low=0.0, high=math.inf)

    def plan(self, ctx: Context) -> Result:
        if self.randomness is None or len(ctx.sizes) == 0:
            return _greedy(ctx, *_pooled_layout(ctx, self.pool_size))
        lut, tops, few = mixed_levels(ctx, self.spread, self.randomness)
        auto = self.randomness == "auto"
        lattice = _lattice.applies(self.randomness, few, ctx.shuffle, len(ctx.sizes))
        allowance = _allowance(ctx, few) if auto else None
        # borders cost a batch each at most: as many as the allowance has batches
        borders = 0 if few or allowance is None else allowance[0] - allowance[1]
        result = self._mixed(ctx, lut, tops, lattice, borders)
        if not auto:
            return result

        def refit(width: float, scale: float) -> Result:
            return self._mixed(ctx, *mixed_levels(ctx, self.spread, "auto", width, scale)[:2], lattice, borders)

        result = within_allowance(ctx, result, few, refit, allowance)
        result = _recut(ctx, result) if few else result
        if allowance is None or not recut_enabled():  # (several ranks: steps need batches of even cost)
            return result
        return split_densest(ctx, result, allowance[0])

    def _mixed(self, ctx: Context, lut: NDArray[Any], tops: NDArray[np.float64], lattice: bool, borders: int = 0) -> Result:
        """Greedy over the levels' order, cut at up to ``borders`` of :func:`_pure_borders`
        (``"auto"`` epochs checked against sorting, not few-batch ones: they get the cheapest
        cuts, :func:`_recut`)."""
        level = lut[ctx.keys()[0]]
        # one pool: levels already mix partners, and pool borders only add padding
        order = _mixed_order(ctx, level, tops.size - 1, "pools", lattice)
        del level  # not held while the greedy gathers the sizes
        seg_starts = _pure_borders(ctx, lut, tops, borders)
        # greedy on the real sizes, not equal counts for each level's top: a random batch of a
        # wide level often stays under the top (fewer batches at the same randomness)
        result = _greedy(ctx, order, seg_starts, None)
        if seg_starts.size > 1:  # the borders are no segments: one tail, the epoch's last batch
            result = dataclasses.replace(result, tails=_tails(result.starts, seg_starts[:1], order.size))
        return result


def _pure_borders(ctx: Context, lut: NDArray[Any], tops: NDArray[np.float64], most: int) -> IntArray:
    """Where the epoch's order (levels from the top down) starts a level next to a level of one
    distinct size filling at least a batch: up to ``most`` of those borders, where the sizes on
    either side differ most (in log terms), and 0 first.

    A batch across such a border pads the smaller samples to the larger size; a cut there costs
    at most one batch, and the batches of a one-size level pad nothing.
    """
    zero = np.zeros(1, dtype=np.int64)
    if most <= 0 or ctx.sizes.values.ndim != 1 or tops.size < 2 or not SK.keys_are_sizes(ctx.keys()[1], ctx.sizes.integral):
        return zero  # (a key of several sizes is no one size)
    hist = ctx.key_counts()
    present = np.flatnonzero(hist)
    level = lut[present].astype(np.int64)
    samples = np.bincount(level, weights=hist[present], minlength=tops.size)
    distinct = np.bincount(level, minlength=tops.size)
    pure = (distinct == 1) & (samples >= _per_batch(tops, ctx.budget, ctx.cost, ctx.cap, 1))
    # a cut at the start of level l (l < top) ends level l + 1: next to a pure level on either side
    near = np.flatnonzero((pure[:-1] | pure[1:]) & (samples[:-1] > 0))
    if near.size == 0:
        return zero
    gap = np.log(tops[near + 1] / np.maximum(tops[near], 1e-300))
    near = near[np.argsort(-gap, kind="stable")[:most]]
    begin = (np.cumsum(samples[::-1]) - samples[::-1])[::-1].astype(np.int64)  # after the levels above
    return np.unique(np.concatenate([zero, begin[near]]))


def within_allowance(
    ctx: Context,
    result: Result,
    few: bool,
    refit: Callable[[float, float], Result],
    allowance: tuple[int, int] | None,
) -> Result:
    """An ``"auto"`` plan within its batch allowance against exact sorting, else the fewest.

    A few-batch epoch may spend ``auto_excess`` more batches than sorting (one batch is 2-5 %
    of a few dozen, and levels of :data:`LEVEL_BATCHES` can cost two): narrower levels until it
    does. Any other epoch of a set whose target is at least :data:`CHECKED_EXCESS` may spend
    :data:`AUTO_MAX_EXCESS`: the fit aims at its target on average, and an epoch whose level
    boundaries moved least can land over the cap; it is fitted again aiming 3 % lower each time
    (the last time a quarter as high). A few-batch epoch may keep one batch more than sorting
    where narrower levels do not reach its allowance (at 4 batches one more is 25 %, but the
    same batches every epoch would be the cost); an epoch over that, or any other epoch still
    over its cap, takes the sorted plan, its ties still shuffled.
    ``refit(width, scale)`` plans with few-batch levels of ``width`` of a batch, or with the
    target scaled by ``scale``; ``allowance``: :func:`_allowance`'s answer for the epoch.
    """
    if allowance is None:
        return result
    allowed, sorted_count = allowance
    width, scale = LEVEL_BATCHES, 1.0
    for k in range(NARROWER_LEVELS if few else THRIFTIER_FITS):
        if result.starts.size <= allowed:
            break
        if few:
            width *= 0.75
        else:  # small steps (the count is not monotone in the target), then a last, long one
            scale = scale * 0.97 if k < THRIFTIER_FITS - 1 else scale / 4.0
        narrower = refit(width, scale)
        if narrower.starts.size < result.starts.size:
            result = narrower
    if result.starts.size > (max(allowed, sorted_count + 1) if few else allowed):
        return Sorted().plan(ctx)
    return result


def _allowance(ctx: Context, few: bool) -> tuple[int, int] | None:
    """The batches an ``"auto"`` epoch may hold and the sorted plan's, or ``None`` where epochs
    are not checked against sorting (sets over 100,000 samples: :data:`CHECKED_EXCESS`).

    A few-batch epoch may spend ``auto_excess`` more batches than sorting, any other checked
    epoch :data:`AUTO_MAX_EXCESS`.
    """
    excess = auto_excess(ctx.population or len(ctx.sizes))
    if not (few or excess >= CHECKED_EXCESS):
        return None
    sorted_count = _sorted_count(ctx)
    return math.floor((1.0 + (excess if few else AUTO_MAX_EXCESS)) * sorted_count + 1e-9), sorted_count


def split_densest(ctx: Context, result: Result, allowed: int) -> Result:
    """``result`` with its batches of the most samples split evenly, up to ``allowed`` batches.

    The co-batch repeat rate is pair-weighted: a batch of ``c`` samples holds ``c (c - 1) / 2``
    pairs, each meeting again next epoch with a chance that grows with ``c``, so the repeats
    sit in the batches of most samples (the smallest sizes). Splitting those costs batches but
    no padding (each part's longest sample is at most the batch's) and no budget (a part of a
    batch costs at most the batch, the cost being monotone). What the level fit left of the
    batch allowance is spent so: every batch of more than ``t`` samples is cut into
    ``ceil(c / t)`` near-equal parts, for the least ``t`` that keeps the epoch within
    ``allowed`` (equal batches alike: some spare may be left). Sizes of one column and no
    batch-size multiple only.

    >>> from fitbatch import as_sizes
    >>> from fitbatch.costs import PaddedCost
    >>> ctx = Context(as_sizes([1] * 10), 8.0, PaddedCost(), None, 1, False, 0, 0)
    >>> r = Result(np.arange(10), np.array([0, 8]), np.array([False, True]))
    >>> split_densest(ctx, r, 3).starts.tolist()
    [0, 4, 8]
    """
    n = result.order.size
    starts = result.starts
    spare = allowed - starts.size
    if spare <= 0 or n == 0 or ctx.multiple != 1 or ctx.sizes.values.ndim != 1 or result.kinds is not None:
        return result
    counts = np.diff(starts, append=n)
    lo, hi = 1, int(counts.max())
    # Invariant: the least t whose parts fit in spare lies in [lo, hi] (hi: no split at all)
    while lo < hi:
        mid = (lo + hi) // 2
        if int(np.sum((counts - 1) // mid)) <= spare:  # ceil(c / t) - 1 more batches each
            hi = mid
        else:
            lo = mid + 1
    parts = (counts - 1) // lo + 1
    if int(parts.sum()) == starts.size:
        return result
    batch = np.repeat(np.arange(starts.size, dtype=np.int64), parts)
    part = np.arange(batch.size, dtype=np.int64) - np.repeat(np.cumsum(parts) - parts, parts)
    new = starts[batch] + part * counts[batch] // parts[batch]
    return dataclasses.replace(result, starts=new, tails=_tails(new, np.zeros(1, np.int64), n), measured=None)


def _sorted_count(ctx: Context) -> int:
    """Batches of the :class:`Sorted` plan; kept across epochs where every size is its own key
    (equal keys are equal sizes, so the order of ties, the epoch's, changes no batch)."""

    def count() -> int:
        return int(Sorted().plan(ctx).starts.size)

    if ctx.sizes.values.ndim != 1 or not SK.keys_are_sizes(ctx.keys()[1], ctx.sizes.integral):
        return count()
    return int(remembered(ctx, ("sorted count", ctx.budget, ctx.cost, ctx.cap, ctx.multiple), count))


def _recut(ctx: Context, result: Result) -> Result:
    """The same order and batch count with the cheapest cuts (:mod:`._recut`), 1-D sizes."""
    if ctx.sizes.values.ndim != 1 or ctx.multiple != 1 or result.starts.size < 2 or not recut_enabled():
        return result
    laid = np.asarray(ctx.sizes.values[result.order] if result.laid is None else result.laid, dtype=np.float64)
    starts = least_cost_starts(laid, result.starts, ctx.budget, ctx.cost, ctx.cap)
    if starts is None:
        return result
    return dataclasses.replace(result, starts=starts, tails=_tails(starts, np.zeros(1, np.int64), result.order.size), measured=None)


@dataclasses.dataclass(frozen=True)
class Packed(_Pools):
    """Bin packing within pools (see the module docstring).

    >>> import fitbatch
    >>> fitbatch.plan_batches([9, 8, 7, 3, 2, 1], 10, cost="sum", strategy=fitbatch.Packed()).to_lists()
    [[0, 5], [1, 4], [2, 3]]
    """

    name: ClassVar[str] = "packed"

    def plan(self, ctx: Context) -> Result:
        if not (K.plain_sum(ctx.cost) and ctx.sizes.values.ndim == 1 and ctx.multiple == 1):
            return _greedy(ctx, *_pooled_layout(ctx, self.pool_size))
        # the sizes in batch order (measured by the plan; the loads when pools are re-packed):
        # when every key is its size, the pool sort lays the keys out as it goes (no gather)
        keys, edges = ctx.keys()
        if _histogram_applies(ctx, edges):  # no cap, many samples per size: on the histogram
            # the "large" rule's patterns (lengths up to 1024, near the bound), else first fit
            quick = _quick_patterns(ctx, edges)
            return quick if quick is not None else _packed_on_histogram(ctx)
        if _on_histogram(ctx):  # a cap, or no cap where the fast path does not pay
            budget = int(math.floor(ctx.budget))
            counts = np.bincount(ctx.sizes.values.astype(np.int64), minlength=budget + 1)
            patterns = PD.cached_best_patterns(counts, budget, ctx.cap)
            if ctx.cap is None:  # every rule's, or the quick ones' (their loose ends re-packed)
                quick_patterns = PD.quick_patterns(counts, budget)
                if PD._batches(quick_patterns) < PD._batches(patterns):
                    patterns = quick_patterns
            if ctx.cap is not None or PD.near_bound(patterns, counts, budget):
                return _laid_out(ctx, counts, patterns, budget)
        values = ctx.sizes.values
        laid: FloatArray | None = None
        loads: FloatArray | None = None  # each batch's sum of sizes, where the keys give it
        measured: tuple[FloatArray, FloatArray] | None = None
        if SK.keys_are_sizes(edges, ctx.sizes.integral):
            # the first fit reads the 16-bit keys (2 B a sample), not float64 sizes laid out (8 B);
            # the plan measures each batch's longest and load from the keys in batch order (whole
            # sizes: exact), not the sizes through the order (no laid copy of 8 B a sample)
            laid_keys = np.empty(keys.size, dtype=np.uint16)
            order, seg_starts = _pooled_order(ctx, self.pool_size, laid_keys)
            order, starts, laid_keys = first_fit_keys(laid_keys, order, seg_starts, ctx.budget, ctx.cap)
            loads = batch_loads(laid_keys, starts)
            measured = (_longest(laid_keys, starts), loads)
            del laid_keys
        else:
            order, seg_starts = _pooled_order(ctx, self.pool_size)
            order, starts, laid = first_fit_laid(values[order], order, seg_starts, ctx.budget, ctx.cap)
            if seg_starts.size > 1:
                loads = np.add.reduceat(laid, starts)
        # Packing keeps each segment's samples together, so segment borders stay where they were.
        first = Result(order, starts, _tails(starts, seg_starts, order.size), laid=laid, measured=measured)
        if loads is None or seg_starts.size == 1:  # one pool
            return first
        # A pool ends with loosely filled batches (its small samples ran out): pack those of all
        # pools again, together, so that the epoch has one loose end instead of one per pool.
        # each batch's load (one pool or more: starts is not empty) tells it is loose
        loose = loads < LOOSE * ctx.budget
        del loads
        whole = SK.keys_are_sizes(edges, ctx.sizes.integral)

        def pack(rest: IntArray) -> Result:
            # descending by size, stably: whole sizes below 2**16 by an O(n) counting sort
            down = SK.KEY_LEVELS - 1 - keys[rest].astype(np.int64) if whole else None
            rest = rest[SK.counting_argsort(down, SK.KEY_LEVELS - 1) if down is not None else np.argsort(-values[rest], kind="stable")]
            rest, starts, laid = first_fit_laid(values[rest], rest, np.zeros(1, np.int64), ctx.budget, ctx.cap)
            again = K.batch_reduce(laid, np.append(starts, rest.size))[1:] if whole else None
            return Result(rest, starts, _tails(starts, np.zeros(1, np.int64), rest.size), laid=laid, measured=again)

        return replan(first, _loose_ends(loose, starts, seg_starts), pack)

    def batch_order(self, ctx: Context, n_batches: int) -> IntArray | None:
        # the base class's permutation, without copying it (it is int64 already): millions of
        # batches on a histogram plan
        if ctx.shuffle and n_batches > 1:
            return ctx.rng("batch-order").permutation(n_batches).astype(np.int64, copy=False)
        return None


HISTOGRAM_MIN_SAMPLES = 65_536  # without a cap, first-fit pools are as tight below this


def _on_histogram(ctx: Context) -> bool:
    """Whether ``packed`` tries the length histogram (:mod:`fitbatch._kernels.packing_depth`):
    whole-number sizes within a whole budget of at most 1024, and a cap on samples per batch
    (first-fit fills a capped batch with the first samples that fit, not the ones that fill it)
    or at least :data:`HISTOGRAM_MIN_SAMPLES` samples that :func:`_histogram_applies` leaves
    (then the histogram's batches are kept only within 0.02 % of ceil(tokens / budget): first-fit
    packs wide length sets tighter)."""
    values = ctx.sizes.values
    if ctx.cap is None and values.shape[0] < HISTOGRAM_MIN_SAMPLES:
        return False
    return PD.applies(values, math.floor(ctx.budget), ctx.sizes.integral)


def _quick_patterns(ctx: Context, edges: NDArray[np.float64]) -> Result | None:
    """The uncapped plan of whole sizes in ``[1, budget]`` (a whole budget of at most
    :data:`~fitbatch._kernels.packing_depth.MAX_BUDGET`, where :func:`_histogram_applies`: many
    samples per size) as the ``"large"`` rule's patterns on the histogram
    (:func:`~fitbatch._kernels.packing_depth.quick_patterns`, kept across epochs), when they are
    within :data:`~fitbatch._kernels.packing_depth.NEAR_BOUND` of ceil(tokens / budget) or take
    fewer batches than the histogram first fit; else ``None`` (first fit then). Positions are drawn per epoch within each length (a counting sort
    by length of the shuffled positions) and laid out pattern by pattern: no per-sample step
    beyond the sort, and the sizes in batch order come from the patterns (nothing re-read).
    """
    n = len(ctx.sizes)
    budget = ctx.budget
    if ctx.cap is not None or n < HISTOGRAM_MIN_SAMPLES or not SK.keys_are_sizes(edges, ctx.sizes.integral):
        return None
    if budget != math.floor(budget) or not 1 <= budget <= PD.MAX_BUDGET:
        return None
    whole = int(budget)
    present = np.flatnonzero(ctx.key_counts())  # keys are the sizes here
    if present.size == 0 or present[0] < 1 or present[-1] > whole:
        return None
    counts = np.array(ctx.key_counts()[: whole + 1])
    patterns = PD.quick_patterns(counts, whole)
    if not PD.near_bound(patterns, counts, whole) and PD._batches(patterns) >= _first_fit_count(counts, whole):
        return None
    return _laid_out(ctx, counts, patterns, whole)


def _first_fit_count(counts: IntArray, budget: int) -> int:
    """Batches of the histogram first fit of ``counts`` (samples per whole size) at ``budget``.

    >>> _first_fit_count(np.array([0, 2, 0, 0, 0, 0, 0, 0, 2]), 9)
    2
    """
    return _first_fit_count_of(np.ascontiguousarray(counts, dtype=np.int64).tobytes(), int(budget))


@functools.lru_cache(maxsize=8)
def _first_fit_count_of(counts: bytes, budget: int) -> int:
    """:func:`_first_fit_count`, kept per histogram (later epochs skip it)."""
    c = np.frombuffer(counts, dtype=np.int64)
    sizes = np.arange(c.size - 1, -1, -1, dtype=np.uint16)
    return int(histogram.histogram_plan(np.repeat(sizes, c[::-1]), float(budget))[1].size)


def _laid_out(ctx: Context, counts: IntArray, patterns: list[PD.Pattern], budget: int) -> Result:
    """The positions laid out as ``patterns`` for the epoch
    (:func:`~fitbatch._kernels.pattern_layout.lay_out_drawn`): drawn within each length and the
    batches in a drawn sequence when shuffled (index order and pattern by pattern else), each
    batch measured by its pattern."""
    keys, edges = ctx.keys()
    level = keys if SK.keys_are_sizes(edges, ctx.sizes.integral) else ctx.sizes.values.astype(np.int64)
    within, sequence = (ctx.rng("packed-histogram"), ctx.rng("batch-order")) if ctx.shuffle else (None, None)
    out = pattern_layout.lay_out_drawn(level, counts, patterns, within, sequence)
    tails = np.zeros(out.offsets.size - 1, dtype=bool)
    if out.tail >= 0:
        tails[out.tail] = True
    return Result(out.order, out.offsets[:-1], tails, kinds=(out.offsets, out.kind, out.count, out.longest, out.total))


def _histogram_applies(ctx: Context, edges: NDArray[np.float64]) -> bool:
    """Whether sum-cost packing runs on the histogram of sizes (:mod:`fitbatch._kernels.histogram`):
    whole sizes below ``2**16`` (each its own key), no count cap, a budget exact in float64, and
    many samples per distinct size."""
    if ctx.cap is not None or not SK.keys_are_sizes(edges, ctx.sizes.integral) or not ctx.budget < 2.0**52:
        return False
    n = len(ctx.sizes)
    most = n // histogram.SAMPLES_PER_SIZE  # distinct sizes at which the histogram still pays
    if not histogram.pays(n, 1) or np.count_nonzero(np.bincount(ctx.keys()[0][: 32 * (most + 1)])) > most:
        return False  # (a few keys show too many sizes: no histogram of every key to count)
    return histogram.pays(n, int(np.count_nonzero(ctx.key_counts())))


def _packed_on_histogram(ctx: Context) -> Result:
    """First-fit decreasing over all samples as one pool, planned on the histogram of sizes.

    One pool of up to ``pool_size`` samples gets the same batches as the per-sample first fit;
    more are packed together (no pools, no second pass over loose ends): at least as tight on
    the real sets measured (``bench/packing.py``), in time that grows with the distinct sizes.
    """
    n = len(ctx.sizes)
    laid_keys = np.empty(n, dtype=np.uint16)
    order, _ = _pooled_order(ctx, max(n, 1), laid_keys)
    parts, starts = histogram.histogram_plan(laid_keys, ctx.budget)
    sizes = histogram.run_sizes(parts, laid_keys)  # (one per run: each batch's measures come last)
    del laid_keys
    # the positions in 32 bits while both orders are alive (4 + 4 B a sample, not 8 + 8), widened
    # once the planned one is let go: the plan's int64 order is never beside two others
    narrow = np.uint32 if n <= np.iinfo(np.uint32).max else np.int64
    order = order.astype(narrow, copy=False)
    packed = np.empty_like(order)
    # a part at a time: no array of every sample's place beside the two orders
    for a, b, dest in histogram.placements(parts, starts, n):
        packed[dest] = order[a:b]
    del order
    tails = _tails(starts, np.zeros(1, np.int64), n)
    order = packed.astype(np.int64, copy=False)
    del packed
    # each batch's longest and total from the runs (the plan reads no size through the order),
    # made once the narrow order is let go
    measured = histogram.batch_measures(parts, sizes, starts.size)
    return Result(order, starts, tails, measured=measured)


def _longest(laid: NDArray[Any], starts: IntArray) -> FloatArray:
    """Each batch's longest of the sizes ``laid`` in batch order, cut at ``starts`` (float64).

    >>> _longest(np.array([6, 4, 5, 3], np.uint16), np.array([0, 2])).tolist()
    [6.0, 5.0]
    """
    if not starts.size:
        return np.zeros(0, np.float64)
    return np.maximum.reduceat(laid, starts).astype(np.float64, copy=False)


def _reverse(a: NDArray[Any]) -> NDArray[Any]:
    """``a`` reversed in place (its own array: a copy of :data:`REVERSE_CHUNK` of it at a time,
    not of half of it)."""
    n = a.shape[0]
    half = n // 2
    for i in range(0, half, REVERSE_CHUNK):
        j = min(i + REVERSE_CHUNK, half)
        head = a[i:j].copy()
        a[i:j] = a[n - j : n - i][::-1]  # its mirror, reversed: no overlap, so numpy does not buffer
        a[n - j : n - i] = head[::-1]
    return a


#: positions :func:`_reverse` swaps at a time (its one buffer)
REVERSE_CHUNK = 1 << 18


def _loose_ends(loose: NDArray[np.bool_], starts: IntArray, seg_starts: IntArray) -> NDArray[np.bool_]:
    """The batches of each segment after its last tight one (and every segment's last batch).

    Every segment starts a batch; one array of batch numbers is made, no other per batch.

    >>> _loose_ends(np.array([False, True, False, True, True]), np.array([0, 2, 4, 6, 8]), np.array([0, 5]))
    array([False, False,  True,  True,  True])
    """
    n = starts.size
    firsts = np.searchsorted(starts, seg_starts)  # each segment's first batch
    tight = np.arange(n, dtype=np.int64)
    tight[loose] = -1
    after = np.maximum.reduceat(tight, firsts) + 1  # each segment's first batch after its last tight one
    del tight
    lasts = np.append(firsts[1:], n) - 1
    np.maximum(after, firsts, out=after)  # (a segment with no tight batch: its first)
    np.minimum(after, lasts, out=after)  # a segment's last batch is an end even when tight
    # the runs [after, next segment's first) marked by +1 at their starts and -1 past their ends
    marks = np.zeros(n + 1, dtype=np.int8)
    marks[after] += 1
    marks[lasts + 1] -= 1
    return np.cumsum(marks[:-1], dtype=np.int8).astype(bool)
