"""``plan_batches()`` and ``BatchPlan``: one epoch of batches as index arrays, with costs and stats.

>>> import fitbatch
>>> plan = fitbatch.plan_batches([6, 10, 7, 57, 9, 7, 10], 60, cost="sum", strategy="sequential")
>>> [b.tolist() for b in plan]
[[0, 1, 2], [3], [4, 5, 6]]
>>> plan.costs.tolist()
[23.0, 57.0, 26.0]
>>> plan.stats().lower_bound
2
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, overload

import numpy as np
from numpy.typing import NDArray

from fitbatch import _kernels as K
from fitbatch import _shapes as S
from fitbatch._rules import OVERSIZED, planning_budget, screen_oversized
from fitbatch._validate import non_negative_int, parse_budget
from fitbatch.costs import CostModel, resolve_cost
from fitbatch.options import PlanKeywords, PlanOptions
from fitbatch.sizes import Sizes, SizesLike, as_sizes
from fitbatch.stats import PlanStats
from fitbatch.strategies import Context, Strategy

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["OVERSIZED", "BatchPlan", "PlanOptions", "lower_bound", "measure_batches", "plan_batches", "plan_with"]

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


def _per_batch(name: str, doc: str) -> Any:
    """A read-only per-batch array of a plan (selected for the plan's batches on first use)."""
    return property(lambda plan: plan._pick(name), doc=doc)


class BatchPlan(Sequence[IntArray]):
    """One epoch's batches: a sequence of int64 index arrays (views of one ``order`` array).

    Attributes:
        order: sample indices in batch order; ``offsets`` cut it into batches.
        offsets: int64, ``len(plan) + 1`` entries.
        costs: cost of each batch under the plan's cost model.
        counts, real_units, padded_units: per batch, samples, real (unpadded) size units and
            padded units (count x padded length), for padding statistics and loss normalisation.
        skipped, dropped: indices of samples left out (oversized, ``drop_last``).
        shape_set: with ``max_shapes``, the (K, 2) int64 ``(rows, length)`` shapes every batch
            fits (by length), the same every epoch and rank; else ``None``. See :attr:`shapes`.

    Made by :func:`plan_batches`; batches made elsewhere become a plan with :meth:`from_batches`.

    >>> import fitbatch
    >>> plan = fitbatch.plan_batches([4, 1, 9, 3, 2, 5], 6, cost="sum", strategy="sequential", oversized="skip")
    >>> plan
    BatchPlan(3 batches, 5 samples, strategy='sequential', cost='sum')
    >>> plan[1].tolist(), plan.order.tolist(), plan.offsets.tolist()
    ([3, 4], [0, 1, 3, 4, 5], [0, 2, 4, 5])
    >>> plan.costs.tolist(), plan.skipped.tolist()
    ([5.0, 5.0, 5.0], [2])
    """

    def __init__(
        self,
        order: IntArray,
        offsets: IntArray,
        *,
        costs: FloatArray, real_units: FloatArray, padded_units: FloatArray,
        budget: float, cost_name: str, strategy_name: str, lower_bound: int = 0,
        skipped: IntArray | None = None, dropped: IntArray | None = None, dropped_batches: int = 0,
        plan_seconds: float = 0.0, straggler_ratio: float | None = None,
        batch_ids: IntArray | None = None, ids_permute_all: bool = False, shape_set: IntArray | None = None,
    ) -> None:
        # The plan's batch k is batch batch_ids[k] of (order, offsets); per-batch arrays given
        # here describe (order, offsets) and are selected on first use (a shuffled epoch of
        # millions of batches never pays for arrays nobody reads).
        self._base_order = order
        self._base_offsets = offsets
        self._ids = batch_ids
        self._base: dict[str, Any] = {
            "costs": costs,
            "real_units": real_units,
            "padded_units": padded_units,
            "counts": np.diff(offsets),
            "heads": offsets[:-1],
        }
        self._picked: dict[str, Any] = {}
        # whether batch_ids reorders every batch (then sums and extremes equal the base arrays')
        self._all = batch_ids is None or (ids_permute_all and batch_ids.size == offsets.size - 1)
        self.budget = budget
        self.cost_name = cost_name
        self.strategy_name = strategy_name
        self.lower_bound = lower_bound
        self.skipped = np.zeros(0, np.int64) if skipped is None else skipped
        self.dropped = np.zeros(0, np.int64) if dropped is None else dropped
        self.dropped_batches = dropped_batches
        self.plan_seconds = plan_seconds
        self.straggler_ratio = straggler_ratio
        self._order: IntArray | None = order if batch_ids is None else None
        self.shape_set = shape_set

    @classmethod
    def from_batches(
        cls,
        sizes: SizesLike,
        cost: str | CostModel | Any,
        order: Any,
        offsets: Any,
        *,
        budget: float | str | None,
        strategy_name: str,
        lower_bound: int = 0,
        skipped: IntArray | None = None,
        dropped: IntArray | None = None,
        dropped_batches: int = 0,
        plan_seconds: float = 0.0,
        shape_set: IntArray | None = None,
    ) -> BatchPlan:
        """A plan of given batches, measured: the constructor for batches not planned here.

        Batch ``k`` is ``order[offsets[k]:offsets[k + 1]]``; costs, real and padded units come
        from :func:`measure_batches` under ``cost``, so baselines, schedules, per-rank plans
        and other planners' batches get the same statistics as :func:`plan_batches`' plans.

        Args:
            sizes: every sample's size (see :func:`fitbatch.as_sizes`).
            cost: the cost model the batches are measured with (its name names the plan's cost).
            order: sample indices in batch order.
            offsets: batch boundaries in ``order``: 0, ..., ``len(order)``, non-decreasing.
            budget: the budget fills are measured against; ``None`` when the batches were not
                planned against one (the costliest batch stands for it, at least 1).
            strategy_name: how the batches were made (shown in stats and reports).
            lower_bound, skipped, dropped, dropped_batches, plan_seconds: as in the plan's
                stats (``skipped`` and ``dropped``: indices of samples in no batch).
            shape_set: the shapes the batches were planned to fit (``max_shapes``), if any.

        Raises:
            ValueError: offsets that do not cut ``order``, or indices outside ``sizes``.

        >>> plan = BatchPlan.from_batches([4, 1, 3, 2], "padded", [1, 3, 2, 0], [0, 2, 4], budget=8, strategy_name="by hand")
        >>> plan.to_lists(), plan.costs.tolist(), plan.stats().max_fill
        ([[1, 3], [2, 0]], [4.0, 8.0], 1.0)
        """
        sz, model = as_sizes(sizes), resolve_cost(cost)
        order, offsets = np.asarray(order, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
        if order.ndim != 1 or (order.size and (order.min() < 0 or order.max() >= len(sz))):
            raise ValueError(f"order must be a 1-D array of indices of the {len(sz)} samples, got {order[:8].tolist()}")
        if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != order.size:
            raise ValueError(f"offsets must run from 0 to len(order) = {order.size}, got {offsets[:8].tolist()}")
        if np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must not decrease, got {offsets[:8].tolist()}")
        _, costs, real, padded = measure_batches(sz, model, order, offsets)
        cap = float(max(costs.max(initial=0.0), 1.0)) if budget is None else parse_budget(budget)
        return cls(
            order, offsets, costs=costs, real_units=real, padded_units=padded, budget=cap, cost_name=model.name,
            strategy_name=strategy_name, lower_bound=lower_bound, skipped=skipped, dropped=dropped,
            dropped_batches=dropped_batches, plan_seconds=plan_seconds, shape_set=shape_set,
        )

    def _pick(self, name: str) -> Any:
        if self._ids is None:
            return self._base[name]
        if name not in self._picked:
            self._picked[name] = self._base[name][self._ids]
        return self._picked[name]

    # per-batch arrays (read-only properties; see _per_batch)
    costs: FloatArray = _per_batch("costs", "Cost of each batch under the plan's cost model.")
    real_units: FloatArray = _per_batch("real_units", "Real (unpadded) size units of each batch.")
    padded_units: FloatArray = _per_batch("padded_units", "Padded units of each batch: count x padded length.")
    counts: IntArray = _per_batch("counts", "Samples in each batch.")
    _heads: IntArray = _per_batch("heads", "Where each batch starts in the base order.")

    @property
    def shapes(self) -> IntArray | None:
        """Each batch's ``(rows, length)`` of :attr:`shape_set` ((n_batches, 2) int64), or ``None``.

        The shape the collates pick: among the shapes with rows >= the batch's samples and length
        >= its longest sample, the smallest length, then the smallest rows.

        >>> import fitbatch
        >>> plan = fitbatch.plan_batches([3, 5, 9, 10, 4, 10], 40, strategy="sorted", max_shapes=2)
        >>> plan.shape_set.tolist(), plan.shapes.tolist()
        ([[8, 5], [4, 10]], [[8, 5], [4, 10]])
        """
        if self.shape_set is None:
            return None
        if "shapes" not in self._base:
            counts = self._base["counts"]
            longest = S.batch_longest(counts, self._base["padded_units"])
            self._base["shapes"] = S.pick_shapes(self.shape_set, counts, longest)
        shapes: IntArray = self._pick("shapes")
        return shapes

    def _totals(self, name: str) -> Any:
        """The per-batch array for order-free reductions (the base one when no batch is left out)."""
        return self._base[name] if self._all else self._pick(name)

    @property
    def order(self) -> IntArray:
        """Sample indices in batch order (materialised on first use)."""
        if self._order is None:
            self._order = self._base_order[K._concat_ranges(self._heads, self.counts)]
        return self._order

    @property
    def offsets(self) -> IntArray:
        """Batch boundaries in :attr:`order` (``len(plan) + 1`` entries)."""
        if self._ids is None:
            return self._base_offsets
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    @property
    def n_samples(self) -> int:
        return int(self._totals("counts").sum())

    def __len__(self) -> int:
        return int(self._base["counts"].size if self._ids is None else self._ids.size)

    @overload
    def __getitem__(self, i: int) -> IntArray: ...

    @overload
    def __getitem__(self, i: slice) -> list[IntArray]: ...

    def __getitem__(self, i: int | slice) -> IntArray | list[IntArray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"batch index must be an int or a slice, got {i!r}")
        if not -n <= i < n:
            raise IndexError(f"batch {i} out of range for a plan of {n} batches")
        i = int(i) % n
        head = int(self._heads[i])
        return self._base_order[head : head + int(self.counts[i])]

    def __iter__(self) -> Iterator[IntArray]:
        order = self._base_order
        for head, count in zip(self._heads.tolist(), self.counts.tolist()):
            yield order[head : head + count]

    def to_lists(self) -> list[list[int]]:
        """The batches as lists of Python ints."""
        flat = self.order.tolist()
        bounds = self.offsets.tolist()
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def select(self, batches: IntArray, *, straggler_ratio: float | None = None) -> BatchPlan:
        """A plan of the given batches of this plan, in the given order (e.g. one rank's share)."""
        batches = np.asarray(batches, dtype=np.int64)
        base_ids = batches if self._ids is None else self._ids[batches]
        per_batch = (self._base["costs"], self._base["real_units"], self._base["padded_units"])
        ratio = straggler_ratio if straggler_ratio is not None else self.straggler_ratio
        return self._derived(self._base_order, self._base_offsets, per_batch, straggler_ratio=ratio, batch_ids=base_ids)

    def rebatched(
        self,
        order: IntArray,
        offsets: IntArray,
        per_batch: tuple[FloatArray, FloatArray, FloatArray],
        *,
        index_map: IntArray | None = None,
    ) -> BatchPlan:
        """Other batches with this plan's metadata (budget, names, bound, skipped, dropped).

        ``per_batch`` is (costs, real units, padded units) of the new batches; ``index_map``
        renames sample indices (a plan of a subset mapped back to the whole dataset).
        """
        if index_map is None:
            return self._derived(order, offsets, per_batch)
        return self._derived(order, offsets, per_batch, skipped=index_map[self.skipped], dropped=index_map[self.dropped])

    def _derived(
        self, order: IntArray, offsets: IntArray, per_batch: tuple[FloatArray, FloatArray, FloatArray], **changes: Any
    ) -> BatchPlan:
        """A plan of other batches with this plan's metadata, ``changes`` applied."""
        costs, real, padded = per_batch
        meta: dict[str, Any] = {
            "budget": self.budget, "cost_name": self.cost_name, "strategy_name": self.strategy_name,
            "lower_bound": self.lower_bound, "skipped": self.skipped, "dropped": self.dropped,
            "dropped_batches": self.dropped_batches, "plan_seconds": self.plan_seconds,
            "straggler_ratio": self.straggler_ratio, "shape_set": self.shape_set,
        }
        return BatchPlan(order, offsets, costs=costs, real_units=real, padded_units=padded, **{**meta, **changes})

    def stats(self) -> PlanStats:
        """Statistics of this plan (see :class:`PlanStats`)."""
        padded = float(self._totals("padded_units").sum())
        fills = self._totals("costs") / self.budget
        return PlanStats(
            n_samples=self.n_samples,
            n_batches=len(self),
            lower_bound=self.lower_bound,
            padding_efficiency=float(self._totals("real_units").sum()) / padded if padded > 0 else 1.0,
            mean_fill=float(fills.mean()) if fills.size else 0.0,
            max_fill=float(fills.max()) if fills.size else 0.0,
            skipped=int(self.skipped.size),
            dropped=int(self.dropped.size),
            dropped_batches=self.dropped_batches,
            oversized_batches=int(np.count_nonzero(self.costs > self.budget)),
            budget=self.budget,
            cost=self.cost_name,
            strategy=self.strategy_name,
            plan_seconds=self.plan_seconds,
            straggler_ratio=self.straggler_ratio,
            **S.shape_stats(self.shapes, self._totals("real_units")),
        )

    def report(self) -> str:
        """A short human-readable report (the CLI prints the same numbers)."""
        s = self.stats()
        rows = [
            ("strategy / cost", f"{s.strategy} / {s.cost}"),
            ("budget", f"{s.budget:g}"),
            ("samples", f"{s.n_samples}"),
            ("batches", f"{s.n_batches} ({s.batches_vs_lower_bound:.3f}x lower bound {s.lower_bound})"),
            ("padding efficiency", f"{s.padding_efficiency:.4f}"),
            ("fill mean / max", f"{s.mean_fill:.3f} / {s.max_fill:.3f}"),
            ("skipped / dropped", f"{s.skipped} / {s.dropped} ({s.dropped_batches} batches)"),
            ("plan time", f"{s.plan_seconds * 1e3:.1f} ms"),
        ]
        if s.straggler_ratio is not None:
            rows.append(("straggler ratio", f"{s.straggler_ratio:.4f}"))
        if s.n_shapes is not None:
            rows.append(("shapes / efficiency", f"{s.n_shapes} / {s.shape_efficiency:.4f}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def __repr__(self) -> str:
        return f"BatchPlan({len(self)} batches, {self.n_samples} samples, strategy={self.strategy_name!r}, cost={self.cost_name!r})"


def plan_batches(
    sizes: SizesLike,
    budget: float | str,
    *,
    cost: str | CostModel | Any = "padded",
    strategy: str | Strategy = "pooled",
    epoch: int = 0,
    n: int | None = None,
    **options: Unpack[PlanKeywords],
) -> BatchPlan:
    """Plan one epoch of batches whose cost fits ``budget``.

    Args:
        sizes: one size per sample (see :func:`fitbatch.sizes.as_sizes` for accepted forms).
        budget: the most cost one batch may have.
        cost: the cost model.
        strategy: how samples are grouped.
        epoch: the epoch; with ``seed`` it determines every random choice.
        n: the number of samples when ``sizes`` is a callable.
        **options: ``max_batch_size``, ``batch_size_multiple``, ``shuffle``, ``seed``,
            ``oversized``, ``drop_last``, ``saturation``, ``max_shapes``, with the meaning and the defaults of
            the :class:`PlanOptions` attributes (typed: :class:`~fitbatch.options.PlanKeywords`).

    Returns:
        A :class:`BatchPlan`.

    Raises:
        ValueError: bad sizes, budget or option values, or oversized samples under
            ``oversized="error"`` (the message lists them).
        TypeError: arguments of the wrong type.

    >>> plan = plan_batches([5, 1, 4, 2, 3, 3], 6, strategy="sorted")
    >>> plan.to_lists()
    [[1, 3], [5, 4], [2], [0]]
    """
    opts = PlanOptions.build(budget, cost=cost, strategy=strategy, **options)
    return plan_with(as_sizes(sizes, n), opts, epoch)


def plan_with(sizes: Sizes, opts: PlanOptions, epoch: int = 0, *, shapes_over: Sizes | None = None) -> BatchPlan:
    """Plan with already validated sizes and options (the samplers' entry point).

    ``shapes_over``: with ``max_shapes``, the samples the shape set is chosen over (default:
    ``sizes``; the rest of an epoch re-planned after a change passes all of the dataset).
    """
    epoch = non_negative_int("epoch", epoch)
    t0 = time.perf_counter()
    values = sizes.values
    model, budget = opts.cost, opts.budget
    alone = model.sample_cost(values)
    skipped, kept = screen_oversized(alone, budget, opts.oversized, sizes=values)
    if skipped.size:
        logger.warning("skipping %d oversized samples (budget %g)", skipped.size, budget)
    sub = sizes if kept is None else Sizes(values[kept], sizes.integral)
    shape_set, plan_model = None, model
    if opts.max_shapes is not None:  # plan sizes rounded up to the shape lengths (module _shapes)
        shape_set, sub, plan_model = S.bounded(sub, opts, shapes_over or sizes)
    ctx = Context(
        sizes=sub,
        budget=planning_budget(budget, sub.integral),
        cost=plan_model,
        cap=opts.max_batch_size,
        multiple=opts.batch_size_multiple,
        shuffle=opts.effective_shuffle,
        seed=opts.seed,
        epoch=epoch,
    )
    result = opts.strategy.plan(ctx)
    order = result.order if kept is None else kept[result.order]
    n = order.size
    offsets = np.append(result.starts, n).astype(np.int64)
    in_order = result.identity and kept is None
    counts, costs, real, padded = measure_batches(sizes, model, None if in_order else order, offsets)
    keep_batch = np.ones(counts.size, dtype=bool)
    if opts.drop_last:
        keep_batch = ~(result.tails & (costs < opts.saturation * budget))
    batch_ids = np.flatnonzero(keep_batch)
    perm = opts.strategy.batch_order(ctx, batch_ids.size)
    if perm is not None:
        batch_ids = batch_ids[perm]
    dropped_ids = np.flatnonzero(~keep_batch)
    dropped = order[K._concat_ranges(offsets[:-1][dropped_ids], counts[dropped_ids])]
    total_alone = float(alone.sum()) - float(alone[skipped].sum()) - float(alone[dropped].sum())
    plan = BatchPlan(
        order,
        offsets,
        costs=costs,
        real_units=real,
        padded_units=padded,
        budget=budget,
        cost_name=model.name,
        strategy_name=opts.strategy.plan_name,
        lower_bound=lower_bound(model, budget, total_alone, n - dropped.size),
        skipped=skipped,
        dropped=dropped,
        dropped_batches=int(dropped_ids.size),
        batch_ids=None if (perm is None and not dropped_ids.size) else batch_ids,
        ids_permute_all=not dropped_ids.size,
        shape_set=shape_set,
    )
    plan.plan_seconds = time.perf_counter() - t0
    if dropped.size:
        logger.info("drop_last dropped %d samples in %d under-filled batches", dropped.size, dropped_ids.size)
    return plan


def measure_batches(
    sizes: Sizes, model: CostModel, order: IntArray | None, offsets: IntArray
) -> tuple[IntArray, FloatArray, FloatArray, FloatArray]:
    """Per batch: count, cost, real (unpadded) units and padded units (count x padded length).

    ``order=None`` means the samples are in index order (no gather).
    """
    values = sizes.values
    counts, mx, sm = K.batch_reduce(values if order is None else values[order], offsets)
    costs = model.evaluate(counts.astype(np.float64), mx, sm)
    if values.ndim == 1:
        real, length = sm, mx
    else:
        units = sizes.real_units() if order is None else sizes.real_units()[order]
        real = np.add.reduceat(units, offsets[:-1]) if units.size else np.zeros(0)
        length = np.prod(mx, axis=1)
    return counts, costs, np.asarray(real, dtype=np.float64), np.asarray(counts * length, dtype=np.float64)


def lower_bound(model: CostModel, budget: float, total_alone: float, n_samples: int) -> int:
    """``ceil(sum of marginal sample costs / usable budget)``, at least 1 for a non-empty plan.

    The marginal cost of a sample is its cost alone (``total_alone`` sums them) less the cost
    of an empty batch (the fixed part of a polynomial model); the usable budget is the budget
    less that fixed part. The ratio is taken exactly (as fractions of the float values). With
    whole-number costs and budget it is rounded up as it is; otherwise the float sum of ``n``
    costs may exceed the true sum by about ``n`` units in the last place, so the ratio is first
    lowered by that relative error (a bound may then be low by one, never high). A non-empty
    plan's bound is at least 1, also when no batch can hold any marginal cost.

    >>> from fitbatch.costs import SumCost
    >>> lower_bound(SumCost(), 70e9, 3.0, 2), lower_bound(SumCost(), 0.1, 0.1 + 0.2, 3), lower_bound(SumCost(), 4, 9, 3)
    (1, 3, 3)
    """
    if n_samples == 0:
        return 0
    base = float(model.evaluate(np.zeros(1), np.zeros(1), np.zeros(1))[0])
    marginal, usable = Fraction(total_alone) - Fraction(base) * n_samples, Fraction(budget) - Fraction(base)
    if usable <= 0 or marginal <= 0:
        return 1
    ratio = marginal / usable
    if all(float(x).is_integer() for x in (total_alone, base, budget)):  # whole numbers: no rounding
        return max(1, math.ceil(ratio))
    slack = Fraction(n_samples + 1, 2**52)  # the relative rounding error of a float sum of n terms
    return max(1, math.ceil(ratio * (1 - min(slack, Fraction(1, 2)))))
