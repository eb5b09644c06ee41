"""Baselines to compare plans against: a fixed batch size, and the largest safe one.

A careful user without fitbatch picks the largest fixed batch size that never runs out of
memory: the one whose worst case — the largest samples together — fits the budget. These two
functions build that baseline and measure it with the same statistics as any plan.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fitbatch import _rng
from fitbatch._rng import SeedLike, resolve_seed
from fitbatch._validate import non_negative_int, parse_budget, positive_int
from fitbatch.costs import CostModel, resolve_cost
from fitbatch.plan import BatchPlan, lower_bound
from fitbatch.sizes import SizesLike, as_sizes


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

    >>> fixed_size_plan([4, 1, 3, 2, 5], 2, budget=8, shuffle=False).to_lists()
    [[0, 1], [2, 3], [4]]
    """
    sz = as_sizes(sizes)
    bs = int(positive_int("batch_size", batch_size) or 1)
    model, cap = resolve_cost(cost), parse_budget(budget)
    t0 = time.perf_counter()
    n = len(sz)
    rng = _rng.generator(resolve_seed(seed), non_negative_int("epoch", epoch), "fixed-order")
    order = rng.permutation(n).astype(np.int64) if shuffle else np.arange(n, dtype=np.int64)
    offsets = np.append(np.arange(0, n, bs), n).astype(np.int64) if n else np.zeros(1, np.int64)
    alone = model.sample_cost(sz.values)
    plan = BatchPlan.from_batches(
        sz, model, order, offsets, budget=cap, strategy_name=f"fixed({bs})",
        lower_bound=lower_bound(model, cap, float(alone.sum()), n),
    )
    plan.plan_seconds = time.perf_counter() - t0
    return plan


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
