"""What every strategy shares: the epoch :class:`Context`, the :class:`Result`, the
:class:`Strategy` base, and the helpers that lay samples out and run the planning kernel."""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fitbatch import _rng
from fitbatch._kernels import batches as K
from fitbatch._kernels import histogram
from fitbatch._kernels import jit as _jit
from fitbatch._kernels import sorting as SK
from fitbatch.costs import CostModel
from fitbatch.sizes import Sizes
from fitbatch.strategies import _lattice

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclasses.dataclass
class Context:
    """Everything a strategy needs for one epoch; sort keys are computed once, on demand.

    A strategy's :meth:`Strategy.plan` gets one and returns a :class:`Result`.

    >>> from fitbatch import as_sizes
    >>> from fitbatch.costs import SumCost
    >>> ctx = Context(as_sizes([3, 1, 2]), 4.0, SumCost(), None, 1, False, 0, 0)
    >>> len(ctx.sizes), ctx.budget
    (3, 4.0)
    """

    sizes: Sizes
    budget: float
    cost: CostModel
    cap: int | None
    multiple: int
    shuffle: bool
    seed: int
    epoch: int
    #: samples of the whole epoch when these sizes are one window of it (``BudgetBatchSampler(window=...)``):
    #: ``randomness="auto"`` mixes as much as it would for the epoch (``None``: these sizes)
    population: int | None = None
    _keys: tuple[NDArray[np.uint16], FloatArray] | None = None
    _counts: NDArray[np.int64] | None = None

    def rng(self, purpose: str) -> np.random.Generator:
        return _rng.generator(self.seed, self.epoch, purpose)

    def keys(self) -> tuple[NDArray[np.uint16], FloatArray]:
        """16-bit size keys (by ``cost.order_cost`` for D-dimensional sizes) and each key's upper edge."""
        if self._keys is None:
            v = self.sizes.values
            if v.ndim == 1:
                self._keys = self.sizes.cached(
                    "size_keys", lambda: SK.size_keys(v, self.sizes.integral)
                )
            else:
                self._keys = SK.size_keys(self.cost.order_cost(v), False)
        return self._keys

    def key_counts(self) -> NDArray[np.int64]:
        """Samples per size key (``SK.KEY_LEVELS`` of them), kept with the keys."""
        if self._counts is None:
            keys = self.keys()[0]

            def count() -> NDArray[np.int64]:
                return histogram.level_counts(keys, SK.KEY_LEVELS)

            self._counts = self.sizes.cached("key_counts", count) if self.sizes.values.ndim == 1 else count()
        return self._counts


@dataclasses.dataclass(frozen=True)
class Result:
    """A strategy's output: sample positions in batch order, batch starts, and tail batches.

    >>> import numpy as np
    >>> r = Result(np.array([2, 0, 1]), np.array([0, 2]), np.array([False, True]))
    >>> [r.order[a:b].tolist() for a, b in zip(r.starts, [*r.starts[1:], len(r.order)])]
    [[2, 0], [1]]
    """

    order: IntArray
    starts: IntArray
    tails: NDArray[np.bool_]  # batches closed because their segment ran out (drop_last candidates)
    identity: bool = False  # order is 0..n-1
    laid: NDArray[Any] | None = None  # the sizes in ``order``, when the kernel gathered them
    # batches of a few kinds, each kind one count, longest and total size (histogram patterns):
    # (offsets: starts and the end, each batch's kind, per kind count, longest, total); the plan
    # measures the kinds, not the samples, and its batches are in the epoch's order already
    kinds: tuple[IntArray, NDArray[Any], IntArray, FloatArray, FloatArray] | None = None
    # each batch's longest and total size (float64, in ``starts``' order; 1-D sizes), when the
    # strategy knows them as it plans: the plan measures them, not the sizes through the order.
    # Whatever changes ``order`` or ``starts`` drops them (or carries them along, as replan does)
    measured: tuple[FloatArray, FloatArray] | None = None


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
            return ctx.rng("batch-order").permutation(n_batches).astype(np.int64, copy=False)
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
    ctx: Context,
    order: IntArray,
    seg_starts: IntArray,
    levels: Levels | None,
    identity: bool = False,
) -> Result:
    """Run the right kernel over samples laid out in ``order`` with the given segments.

    ``levels`` (1-D sizes only: rows, even of one column, plan by search) says the planning
    max is non-increasing in each segment;
    ``identity`` that ``order`` is 0..n-1 (no gather needed).
    """
    laid = None
    if levels is not None and ctx.sizes.values.ndim == 1:
        level, edges = levels
        if ctx.cost.max_count(edges[:1], ctx.budget) is None:
            values = laid = ctx.sizes.values[order]
        else:
            values = ctx.sizes.values[:0]
        starts = K.descending_starts(
            level,
            edges,
            values,
            seg_starts,
            ctx.budget,
            ctx.cost,
            cap=ctx.cap,
            multiple=ctx.multiple,
        )
    else:
        force = None
        if seg_starts.size > 1:
            force = np.zeros(order.size, dtype=bool)
            force[seg_starts] = True
        through = None
        if not identity and ctx.multiple == 1 and ctx.sizes.values.ndim == 1 and order.size:
            # compiled: the sizes read through the order, not gathered (8 B a sample fewer)
            through = _jit.greedy(
                ctx.sizes.values, ctx.budget, ctx.cost, math.inf if ctx.cap is None else float(ctx.cap),
                force, 0, 0.0, 0.0, order=order,
            )
        if through is not None:
            starts = through[0]
        else:
            values = ctx.sizes.values if identity else ctx.sizes.values[order]
            laid = None if identity else values
            starts, _ = K.greedy_starts(
                values,
                ctx.budget,
                ctx.cost,
                cap=ctx.cap,
                multiple=ctx.multiple,
                force=force,
            )
    return Result(order, starts, _tails(starts, seg_starts, order.size), identity, laid)


def _gather_into(values: IntArray, index: IntArray) -> IntArray:
    """``values[index]`` written over ``index`` (one array of n int64 fewer at the peak).

    Each output element depends only on the index at the same position, and ``mode="clip"``
    does not buffer, so overwriting the index array in place is safe.
    """
    return np.take(values, index, out=index, mode="clip")


def _random_positions(n: int, rng: np.random.Generator) -> IntArray:
    """A fast shuffle: stable radix sort by 16 random bits (ties keep index order)."""
    if n <= 1 << 16:
        return rng.permutation(n).astype(np.int64, copy=False)
    return SK.stable_argsort_u16(_draws(n, rng))


def _draws(n: int, rng: np.random.Generator) -> NDArray[np.uint16]:
    """The 16 random bits per position that :func:`_random_positions` sorts by (``n > 2**16``)."""
    return rng.integers(0, 1 << 16, size=n, dtype=np.uint16)


def _shuffled_by_level(n: int, rng: np.random.Generator | None, level: NDArray[Any], top: int) -> IntArray:
    """Positions shuffled as :func:`_random_positions` shuffles them (``rng=None``: in index
    order), then stably sorted by descending ``level`` (every level in ``[0, top]``).

    With the ``fast`` extra both stable sorts run as one compiled pair of counting sorts.
    """
    if rng is not None and n > 1 << 16:
        draws = _draws(n, rng)
        compiled = _jit.shuffle_by_level(draws, level, top)
        if compiled is not None:
            return compiled
        base = SK.stable_argsort_u16(draws)
        del draws
    else:
        base = np.arange(n, dtype=np.int64) if rng is None else _random_positions(n, rng)
    return _by_level(base, level, top)


# results kept per set of 1-D sizes that depend on the sizes and settings but not on the epoch
# (a level fit: only its shift is the epoch's; a sorted batch count; the lattice ranks): later
# epochs and re-plans at the same budget reuse them. Up to this many distinct settings each.
REMEMBERED = 8


def remembered(ctx: Context, settings: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
    """``compute()``, kept with the 1-D sizes for the :data:`REMEMBERED` latest distinct
    ``settings`` (whose first item names what is computed; the oldest goes first). Arrays in the
    result are made read-only; settings that do not hash (a cost holding arrays) compute every
    time."""
    if ctx.sizes.values.ndim != 1:
        return compute()
    try:
        hash(settings)
    except TypeError:
        return compute()
    memo: dict[tuple[Any, ...], Any] = ctx.sizes.cached(f"remembered {settings[0]}", dict)
    value = memo.get(settings)
    if value is not None:
        return value
    shared = _shared_key(ctx, settings)
    value = None if shared is None else _SHARED.get(shared)
    if value is None:
        value = compute()
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, np.ndarray):
                item.setflags(write=False)
        if shared is not None:
            _SHARED[shared] = value
            while len(_SHARED) > SHARED:
                _SHARED.pop(next(iter(_SHARED)), None)
    memo[settings] = value
    while len(memo) > REMEMBERED:
        memo.pop(next(iter(memo)), None)
    return value


# ... and kept in the process for the SHARED latest (settings, data) pairs, keyed by the data they
# depend on, so that plans of the same data given afresh (an array planned every epoch, not one
# Sizes) skip them too: a level fit and a sorted batch count depend on the size-key histogram
# alone (the count only where every size is its own key), the lattice ranks on the keys in
# sample order (sets of at most LATTICE_SHARED samples). The key holds the data's bytes, not a
# digest of them: equal keys are equal data. Sets of at most LATTICE_SHARED whole sizes below
# 2**16 (each its own key: the keys are the sizes) are keyed by their keys in sample order,
# which take less time to read than a histogram does to count.
SHARED = 16
LATTICE_SHARED = 1 << 16
_SHARED: dict[tuple[Any, ...], Any] = {}


def _shared_key(ctx: Context, settings: tuple[Any, ...]) -> tuple[Any, ...] | None:
    what = settings[0]
    small = len(ctx.sizes) <= LATTICE_SHARED
    whole = SK.keys_are_sizes(ctx.keys()[1], ctx.sizes.integral)
    if small and (whole or what == "lattice ranks"):  # the keys in order: cheaper than their histogram
        return (settings, ctx.sizes.cached("key bytes", lambda: ctx.keys()[0].tobytes()))
    if what in ("level fit", "level shift") or (what == "sorted count" and whole):
        return (settings, ctx.sizes.cached("histogram bytes", lambda: _histogram_bytes(ctx)))
    return None


def _histogram_bytes(ctx: Context) -> bytes:
    """The size-key histogram as bytes: the keys present, their counts and (unless every size
    is its own key) their upper edges."""
    counts = ctx.key_counts()
    edges = ctx.keys()[1]
    present = np.flatnonzero(counts)
    parts = [present.astype(np.uint16).tobytes(), counts[present].tobytes()]
    if not SK.keys_are_sizes(edges, ctx.sizes.integral):  # a key's edge and the one below it (a fit reads both)
        parts += [edges[present].tobytes(), edges[np.maximum(present - 1, 0)].tobytes()]
    return b"".join(parts)


def _mixed_order(ctx: Context, level: NDArray[Any], top: int, purpose: str, lattice: bool) -> IntArray:
    """The positions by descending ``level``: inside each level in the epoch's lattice layout
    (``lattice``, :mod:`._lattice`), else shuffled with ``ctx.rng(purpose)`` (index order when
    the plan is not shuffled)."""
    if lattice:
        keys = ctx.keys()[0]
        by_rank = remembered(ctx, ("lattice ranks", ctx.seed), lambda: _lattice.ranked(keys, ctx.seed))
        return _by_level(_lattice.lattice_order(keys, ctx.seed, ctx.epoch, by_rank), level, top)
    return _shuffled_by_level(len(ctx.sizes), ctx.rng(purpose) if ctx.shuffle else None, level, top)


def _by_level(base: IntArray, level: NDArray[Any], top: int) -> IntArray:
    """The positions ``base`` (an array this function may reuse) stably sorted by descending
    ``level`` (every level in ``[0, top]``)."""
    down = top - level[base]
    idx = np.argsort(down.astype(np.uint16) if top < 1 << 16 else down, kind="stable")
    return _gather_into(base, idx.astype(np.int64, copy=False))


def _pooled_order(
    ctx: Context, pool_size: int, laid_keys: NDArray[np.uint16] | None = None
) -> tuple[IntArray, IntArray]:
    """Shuffle (if asked), cut into pools, sort each pool by descending size key: (order, pool
    starts). ``laid_keys`` (of n) receives the keys in that order (the compiled sort writes them
    as it goes: no gather)."""
    n = len(ctx.sizes)
    keys, _ = ctx.keys()
    seg_starts = np.arange(0, n, pool_size, dtype=np.int64) if n else np.zeros(0, np.int64)
    if ctx.shuffle and n > 1 << 16:
        draws = _draws(n, ctx.rng("pools"))
        compiled = _jit.shuffle_in_pools(draws, keys, pool_size, laid_keys)
        if compiled is not None:
            return compiled, seg_starts
        base = SK.stable_argsort_u16(draws)  # _random_positions, from the same draws
        del draws
    elif not ctx.shuffle:  # in index order: the sort's positions are the order (no second array of n)
        order = SK.sort_within_segments(np.uint16(SK.KEY_LEVELS - 1) - keys, pool_size)
        if laid_keys is not None:
            np.take(keys, order, out=laid_keys)
        return order, seg_starts
    else:
        base = _random_positions(n, ctx.rng("pools"))
    down = np.uint16(SK.KEY_LEVELS - 1) - keys[base]
    order = _gather_into(base, SK.sort_within_segments(down, pool_size))
    if laid_keys is not None:
        np.take(keys, order, out=laid_keys)
    return order, seg_starts


def _pooled_layout(ctx: Context, pool_size: int) -> tuple[IntArray, IntArray, Levels]:
    """:func:`_pooled_order` and the levels of its positions (each pool's keys, descending)."""
    order, seg_starts = _pooled_order(ctx, pool_size)
    keys, edges = ctx.keys()
    return order, seg_starts, (keys[order], edges)


# replan: up to this many runs of loose batches are cut out by moving the kept runs between them
REPLAN_RUNS = 4096


def replan(first: Result, loose: NDArray[np.bool_], plan_rest: Callable[[IntArray], Result]) -> Result:
    """Plan the samples of the ``loose`` batches of ``first`` again, together, after the others.

    ``plan_rest(positions)`` plans the loose batches' samples (their positions, in batch order)
    and returns a :class:`Result` over them. Kept batches keep their order and are no longer
    tails; the re-plan's batches follow them. Nothing happens with fewer than two loose batches.
    The gathered sizes (``laid``) follow the order, and the batches' measures (``measured``)
    the batches, when both plans carry them.
    """
    if np.count_nonzero(loose) <= 1:
        return first
    n = first.order.size
    lengths = np.empty_like(first.starts)  # first.starts is not empty: a batch is loose
    np.subtract(first.starts[1:], first.starts[:-1], out=lengths[:-1])
    lengths[-1] = n - first.starts[-1]
    heads, sizes = first.starts[loose], lengths[loose]
    again = plan_rest(first.order[K._concat_ranges(heads, sizes)])
    # compact the kept positions to the front of the order buffer, the re-plan after them
    order, laid = first.order, (first.laid if again.laid is not None else None)
    n_kept = n - again.order.size
    ends = heads + sizes
    runs = np.flatnonzero(np.append(heads[1:] != ends[:-1], True))  # the last loose batch of each run of them
    starts_of_runs = heads[np.append(0, runs[:-1] + 1)]
    if runs.size <= REPLAN_RUNS:  # a few runs of loose batches: move the kept runs between them
        kept_from = np.append(0, ends[runs]).tolist()
        kept_to = np.append(starts_of_runs, n).tolist()
        w = 0
        for a, b in zip(kept_from, kept_to):
            order[w : w + b - a] = order[a:b]
            if laid is not None:
                laid[w : w + b - a] = laid[a:b]
            w += b - a
    else:
        in_loose = np.repeat(loose, lengths)
        order[:n_kept] = order[~in_loose]
        if laid is not None:
            laid[:n_kept] = laid[~in_loose]
    order[n_kept:] = again.order
    if laid is not None:
        laid[n_kept:] = again.laid
    # the kept batches' starts, then the re-plan's, written into one array
    kept_lengths = lengths[~loose]
    del lengths
    n_first = kept_lengths.size
    starts = np.empty(n_first + again.starts.size, dtype=np.int64)
    if n_first:
        starts[0] = 0
        np.cumsum(kept_lengths[:-1], out=starts[1:n_first])
    del kept_lengths
    np.add(again.starts, n_kept, out=starts[n_first:])
    tails = np.concatenate([np.zeros(n_first, bool), again.tails])
    measured = None
    if first.measured is not None and again.measured is not None:
        kept = ~loose
        measured = (
            np.concatenate([first.measured[0][kept], again.measured[0]]),
            np.concatenate([first.measured[1][kept], again.measured[1]]),
        )
    return Result(order, starts, tails, laid=laid, measured=measured)
