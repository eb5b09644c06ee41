"""Baselines to compare plans against: a fixed batch size, and the largest safe one.

A careful user without fitbatch picks the largest fixed batch size that never runs out of
memory: the one whose worst case — the largest samples together — fits the budget. These two
functions build that baseline and measure it with the same statistics as any plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fitbatch._rng import SeedLike
from fitbatch._validate import parse_budget
from fitbatch.costs import CostModel, resolve_cost
from fitbatch.plan._options import PlanOptions
from fitbatch.plan._planner import BatchPlan, plan_with
from fitbatch.sizes import SizesLike, as_sizes
from fitbatch.strategies import Fixed


def fixed_size_plan(
    sizes: SizesLike,
    batch_size: int,
    *,
    budget: float | str,
    cost: str | CostModel | Any = "padded",
    shuffle: bool = True,
    seed: SeedLike = 0,
    epoch: int = 0,
) -> BatchPlan:
    """The baseline: batches of ``batch_size`` samples in (shuffled) order, measured on ``budget``.

    Batches are not fitted to the budget: their fills show what a fixed batch size wastes or
    overshoots. Use :func:`largest_safe_batch_size` for the size a careful user would pick.
    The same plan as ``plan_batches(sizes, budget, strategy=Fixed(batch_size), oversized="single")``.

    >>> fixed_size_plan([4, 1, 3, 2, 5], 2, budget=8, shuffle=False).to_lists()
    [[0, 1], [2, 3], [4]]
    """
    sz = as_sizes(sizes)
    opts = PlanOptions.build(
        budget, cost=cost, strategy=Fixed(batch_size), shuffle=bool(shuffle), seed=seed, oversized="single"
    )
    return plan_with(sz, opts, epoch)


def largest_safe_batch_size(sizes: SizesLike, budget: float | str, cost: str | CostModel | Any = "padded") -> int:
    """The largest fixed batch size whose worst case (the largest samples together) fits ``budget``.

    >>> largest_safe_batch_size([10, 30, 20], 100)
    3
    >>> largest_safe_batch_size([10, 30, 20], 50)
    1
    """
    sz = as_sizes(sizes)
    model, cap = resolve_cost(cost), parse_budget(budget)
    if len(sz) == 0:
        return 1
    values = sz.values
    key = model.sample_cost(values)
    worst = values[np.argsort(-key, kind="stable")]
    csum_max = np.maximum.accumulate(worst, axis=0)
    csum_sum = np.cumsum(worst, axis=0)
    counts = np.arange(1, len(sz) + 1, dtype=np.float64)
    fits = model.evaluate(counts, csum_max, csum_sum) <= cap
    return max(1, int(np.count_nonzero(np.logical_and.accumulate(fits))))
