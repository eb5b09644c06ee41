"""Plans: one epoch's batches as index arrays, with per-batch costs and statistics.

``plan_batches(sizes, budget, cost=, strategy=, **options)`` screens oversized samples, lets a
strategy order the samples, cuts the order into batches under the budget with the kernels, and
returns a :class:`BatchPlan` (one ``order`` array plus ``offsets``; batches are views of it) with
its :class:`PlanStats`. Also here: :class:`PlanOptions` (every planning option, validated once),
bounded shapes (``max_shapes``), the fixed-batch-size baselines and the randomness metrics.

>>> from fitbatch.plan import plan_batches
>>> plan_batches([12, 3, 7, 9, 4, 15], 24, cost="padded", strategy="sorted").to_lists()
[[1, 4, 2], [3, 0], [5]]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fitbatch._lazy import exports
from fitbatch.plan._batch_plan import BatchPlan
from fitbatch.plan._options import PlanKeywords, PlanOptions
from fitbatch.plan._planner import plan_batches
from fitbatch.plan._rules import OVERSIZED
from fitbatch.plan._stats import PlanStats, lower_bound

if TYPE_CHECKING:  # loaded on first use: a plan needs neither the baselines nor the metrics
    from fitbatch.plan._baseline import fixed_size_plan, largest_safe_batch_size
    from fitbatch.plan._metrics import epoch_repeat_rate, position_size_correlation, repeat_rate

_LAZY = {
    "epoch_repeat_rate": "fitbatch.plan._metrics",
    "fixed_size_plan": "fitbatch.plan._baseline",
    "largest_safe_batch_size": "fitbatch.plan._baseline",
    "position_size_correlation": "fitbatch.plan._metrics",
    "repeat_rate": "fitbatch.plan._metrics",
}


__getattr__, __dir__ = exports(__name__, _LAZY, globals())

__all__ = [
    "BatchPlan",
    "OVERSIZED",
    "PlanKeywords",
    "PlanOptions",
    "PlanStats",
    "epoch_repeat_rate",
    "fixed_size_plan",
    "largest_safe_batch_size",
    "lower_bound",
    "plan_batches",
    "position_size_correlation",
    "repeat_rate",
]
