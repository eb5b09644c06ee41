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

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import batches as K
from fitbatch._kernels import jit as _jit
from fitbatch._validate import loss_sizes as check_loss_sizes
from fitbatch._validate import non_negative_int
from fitbatch.costs import CostModel, Limits
from fitbatch.costs._limits import check_limits, describer
from fitbatch.plan import _shapes as S
from fitbatch.plan._batch_plan import BatchPlan, _measure, _measure_kinds, measure_batches
from fitbatch.plan._options import PlanKeywords, PlanOptions
from fitbatch.plan._rules import OVERSIZED, planning_budget, screen_oversized
from fitbatch.plan._stats import lower_bound, samples_bound
from fitbatch.sizes import Sizes, SizesLike, as_sizes
from fitbatch.strategies import Context, Strategy

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["OVERSIZED", "BatchPlan", "PlanOptions", "lower_bound", "measure_batches", "plan_batches", "plan_with"]

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


def plan_batches(
    sizes: SizesLike,
    budget: float | str | Mapping[str, float | str],
    *,
    cost: str | CostModel | Any = "padded",
    strategy: str | Strategy = "pooled",
    epoch: int = 0,
    n: int | None = None,
    loss_sizes: Any = None,
    **options: Unpack[PlanKeywords],
) -> BatchPlan:
    """Plan one epoch of batches whose cost fits ``budget``.

    Args:
        sizes: one size per sample (see :func:`fitbatch.sizes.as_sizes` for accepted forms), or
            a mapping of named columns (``{"tokens": t, "images": k}``) for several limits.
        budget: the most cost one batch may have; for several limits a mapping of the sizes'
            column names to budgets (each a number or a string such as ``"2GiB"``).
        cost: the cost model; for several limits one for every column, or a mapping of column
            names to costs (a column left out costs ``"padded"``).
        strategy: how samples are grouped.
        epoch: the epoch; with ``seed`` it determines every random choice.
        n: the number of samples when ``sizes`` is a callable.
        loss_sizes: optional, one number per sample: its tokens that carry loss (labels !=
            -100). Batches are planned on ``sizes`` alone; the plan carries these as
            ``plan.loss_units`` (per batch) and ``plan.stats().loss_units`` (in all).
        **options: ``max_batch_size``, ``batch_size_multiple``, ``shuffle``, ``seed``,
            ``oversized``, ``drop_last``, ``saturation``, ``max_shapes``, with the meaning and the defaults of
            the :class:`PlanOptions` attributes (typed: :class:`~fitbatch.plan._options.PlanKeywords`).

    Returns:
        A :class:`BatchPlan`.

    Raises:
        ValueError: bad sizes, budget or option values, a budget mapping whose names are not
            the sizes' column names, or oversized samples under ``oversized="error"`` (the
            message lists them, and the limits they exceed).
        TypeError: arguments of the wrong type.

    >>> plan = plan_batches([5, 1, 4, 2, 3, 3], 6, strategy="sorted", loss_sizes=[4, 0, 3, 2, 2, 1])
    >>> plan.to_lists(), plan.loss_units.tolist(), plan.stats().loss_units
    ([[1, 3], [5, 4], [2], [0]], [2.0, 3.0, 3.0, 4.0], 12.0)
    """
    opts = PlanOptions.build(budget, cost=cost, strategy=strategy, **options)
    checked = [as_sizes(sizes, n)]
    loss = check_loss_sizes(loss_sizes, len(checked[0]), checked[0].values)
    # plan_with gets the only reference to the converted sizes, so that it can let them go once a
    # skip screen has copied the kept ones (a name here would hold them for the whole call)
    return plan_with(checked.pop(), opts, epoch, loss_sizes=loss)


def plan_with(
    sizes: Sizes, opts: PlanOptions, epoch: int = 0, *, loss_sizes: FloatArray | None = None, shapes_over: Sizes | None = None,
    population: int | None = None,
) -> BatchPlan:
    """Plan with already validated sizes and options (the samplers' entry point; ``loss_sizes`` checked too).

    ``population``: the samples of the epoch when ``sizes`` are one window of it (see
    :attr:`fitbatch.strategies.Context.population`).

    ``shapes_over``: with ``max_shapes``, the samples the shape set is chosen over (default:
    ``sizes``; the rest of an epoch re-planned after a change passes all of the dataset).

    When a skip screen leaves samples out, a copy of the kept sizes is planned and ``sizes`` is
    no longer referenced (but for several limits, whose plan keeps them): a caller that passes
    its only reference (as :func:`plan_batches` does) has them freed while the strategy plans.
    """
    epoch = non_negative_int("epoch", epoch)
    t0 = time.perf_counter()
    model, budget = check_limits(sizes.columns, opts.cost), opts.budget
    skipped, sub, kept_alone = _screen(sizes, model, opts)
    if skipped.size:
        logger.warning("skipping %d oversized samples (budget %g)", skipped.size, budget)
    shape_set, plan_model, strategy = None, model, opts.strategy
    kept = sub  # the sizes measured: the strategy may plan them rounded up to shapes
    if opts.max_shapes is not None:  # plan sizes rounded up to the shape lengths (module _shapes)
        shape_set, sub, plan_model = S.bounded(sub, opts, shapes_over or sizes)
        strategy = S.grid_strategy(strategy)
    n_all, limits = len(sizes), ((model, sizes.values) if isinstance(model, Limits) else None)
    # from here on the kept samples stand for the dataset (a plan of several limits keeps its
    # rows): after a skip screen plan_batches' sizes, whose only reference it hands over, are
    # let go while the strategy plans (one array of n fewer)
    del sizes
    ctx = Context(
        sizes=sub,
        budget=planning_budget(budget, sub.integral),
        cost=plan_model,
        cap=opts.max_batch_size,
        multiple=opts.batch_size_multiple,
        shuffle=opts.effective_shuffle,
        seed=opts.seed,
        epoch=epoch,
        population=population,
    )
    with _jit.planning():  # numba, when a plan asks for it, loads in the background after it
        result = strategy.plan(ctx)
    # from here on the strategy needs its random streams only: the planned sizes are let go
    # (an empty selection by index: an empty slice would be a view that keeps them)
    ctx = dataclasses.replace(ctx, sizes=sub.subset(np.zeros(0, np.int64)), _keys=None, _counts=None)
    del sub
    # measured in positions among the kept samples, before they become dataset indices
    order, n, identity = result.order, result.order.size, result.identity
    # batches of kinds (see Result.kinds) are in the epoch's order already
    ordered = result.kinds is not None
    kinds = result.kinds if opts.max_shapes is None else None
    offsets = np.append(result.starts, n).astype(np.int64, copy=False) if kinds is None else kinds[0]
    # the sizes the kernel gathered (in plan order) are the ones measured, unless it planned
    # rounded-up shapes: then the kept sizes themselves are let go before measuring
    laid = result.laid if opts.max_shapes is None else None
    # the batches' longest and total sizes, where the strategy knew them (1-D sizes)
    measured = result.measured if opts.max_shapes is None else None
    in_plan_order = laid is not None or identity
    # a fresh Sizes over the same values: not the strategy's cached sort keys (2 B a sample)
    kept = Sizes(laid if laid is not None else kept.values, kept.integral, kept.columns)
    del laid
    result = dataclasses.replace(result, order=np.zeros(0, np.int64), starts=np.zeros(0, np.int64), laid=None, kinds=None, measured=None)
    if identity:  # 0..n-1: made once the sizes are let go (below), not held beside them
        order = np.zeros(0, np.int64)
    with _jit.planning(counted=False):  # (its compiled reductions are the plan's: see LOAD_PLANS)
        if kinds is None:
            costs, real, padded = _measure(kept, model, None if in_plan_order else order, offsets, measured=measured)
        else:
            costs, real, padded = _measure_kinds(model, kinds[1:], later=True)
    del kinds, measured
    dropped_ids = np.zeros(0, np.int64)
    if opts.drop_last:
        dropped_ids = np.flatnonzero(result.tails & (costs < opts.saturation * budget))
    n_batches = costs.size
    # (the dropped batches' counts only: no per-batch counts array)
    at = K._concat_ranges(offsets[:-1][dropped_ids], offsets[1:][dropped_ids] - offsets[:-1][dropped_ids])
    dropped = at if identity else order[at]
    # the dropped samples' costs alone, in the order of dropped (as over the dataset's sizes)
    dropped_alone = float(model.sample_cost(kept.values[at if in_plan_order else dropped]).sum()) if dropped.size else 0.0
    del kept, at  # (before the batch order is drawn: the sizes are not held beside it)
    if identity and not skipped.size:
        order = np.arange(n, dtype=np.int64)
    # batch_ids: the kept batches in plan order, None for all of them as planned
    batch_ids = None if not dropped_ids.size else np.delete(np.arange(n_batches, dtype=np.int64), dropped_ids)
    perm = None if ordered else strategy.batch_order(ctx, n_batches - dropped_ids.size)
    if perm is not None:
        batch_ids = np.asarray(perm, dtype=np.int64) if batch_ids is None else batch_ids[perm]
    if skipped.size:  # positions among the kept samples become dataset indices
        order, dropped = _dataset_indices(skipped, n_all, order, dropped, identity)
    if limits is not None:  # several limits: every limit's bound (a per-sample total is not one)
        bound = samples_bound(model, budget, np.delete(limits[1], np.concatenate([skipped, dropped]), axis=0))
    else:
        bound = lower_bound(model, budget, kept_alone - dropped_alone, n - dropped.size)
    plan = BatchPlan(
        order,
        offsets,
        costs=costs,
        real_units=real,
        padded_units=padded,
        budget=budget,
        cost_name=model.name,
        strategy_name=opts.strategy.plan_name,
        lower_bound=bound,
        skipped=skipped,
        dropped=dropped,
        dropped_batches=int(dropped_ids.size),
        batch_ids=batch_ids,
        ids_permute_all=not dropped_ids.size,
        loss_sizes=loss_sizes,
        shape_set=shape_set,
    )
    plan._limits = limits
    plan.plan_seconds = time.perf_counter() - t0
    if dropped.size:
        logger.info("drop_last dropped %d samples in %d under-filled batches", dropped.size, dropped_ids.size)
    return plan


def _screen(sizes: Sizes, model: CostModel, opts: PlanOptions) -> tuple[IntArray, Sizes, float]:
    """The oversized policy applied: positions skipped, the kept sizes (``sizes`` itself when
    none is skipped, else a copy) and the sum of the kept samples' costs alone."""
    values = sizes.values
    if opts.max_shapes is not None and values.ndim == 1:
        values = np.ceil(values)  # a shape has a whole length: a sample costs its length rounded up
    alone = model.sample_cost(values)
    # one pass tells that no sample is over the budget (max propagates NaN): nothing to screen
    within = bool(alone.size and alone.max() <= opts.budget)
    if within:
        skipped, kept = np.zeros(0, np.int64), None
    else:
        skipped, kept = screen_oversized(alone, opts.budget, opts.oversized, sizes=values, describe=describer(model, values))
        # a sample over the budget (oversized="single") fills one batch alone: it counts as one
        # budget's worth towards the lower bound, not as its whole cost
        alone = np.minimum(alone, opts.budget)
    with np.errstate(over="ignore"):
        kept_alone = float(alone.sum()) - float(alone[skipped].sum())
        # the kept sizes' own total: as finite as kept_alone unless the budget is vast (rare)
        wide = len(values) * opts.budget > 1e300
        total = float(np.delete(values, skipped, axis=0).sum()) if wide else kept_alone
    if not (math.isfinite(kept_alone) and math.isfinite(total)):
        raise ValueError(
            "the sizes add up past float64's range (1.8e308), which the plan's sums and statistics "
            "need: count in a coarser unit (KiB, not bytes)"
        )
    return skipped, (sizes if kept is None else sizes.subset(kept)), kept_alone


def _dataset_indices(
    skipped: IntArray, n_all: int, order: IntArray, dropped: IntArray, identity: bool
) -> tuple[IntArray, IntArray]:
    """``order`` and ``dropped``, positions among the samples a skip screen kept (those not in
    ``skipped``, of ``n_all``), as dataset indices; ``identity``: ``order`` is all of them in order."""
    mask = np.ones(n_all, dtype=bool)
    mask[skipped] = False
    kept = np.flatnonzero(mask).astype(np.int64, copy=False)
    del mask
    dropped = kept[dropped]
    if identity:  # in index order: the kept samples' indices themselves
        return kept, dropped
    # in place; mode "clip" does not buffer (every position is in range)
    return np.take(kept, order, out=order, mode="clip"), dropped
