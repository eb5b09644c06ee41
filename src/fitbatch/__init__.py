"""fitbatch: training batches that fit a memory budget instead of a fixed sample count.

>>> import fitbatch
>>> plan = fitbatch.plan_batches([12, 3, 7, 9, 4, 15], 24, cost="padded", strategy="sorted")
>>> plan.to_lists()
[[1, 4, 2], [3, 0], [5]]
"""

from __future__ import annotations

from fitbatch._validate import parse_budget
from fitbatch.collate import PaddedBatch, make_pad_collate, pad_collate
from fitbatch.costs import CostModel, FunctionCost, PaddedCost, PaddedPolynomial, SumCost, resolve_cost
from fitbatch.plan import BatchPlan, PlanOptions, plan_batches
from fitbatch.sampler import BudgetBatchSampler
from fitbatch.sizes import Sizes, as_sizes
from fitbatch.stats import PlanStats
from fitbatch.strategies import Buckets, Packed, Pooled, Sequential, Sorted, Strategy, resolve_strategy

__version__ = "0.1.0"

__all__ = [
    "BatchPlan",
    "Buckets",
    "BudgetBatchSampler",
    "CostModel",
    "FunctionCost",
    "Packed",
    "PaddedBatch",
    "PaddedCost",
    "PaddedPolynomial",
    "PlanOptions",
    "PlanStats",
    "Pooled",
    "Sequential",
    "Sizes",
    "Sorted",
    "Strategy",
    "SumCost",
    "__version__",
    "as_sizes",
    "make_pad_collate",
    "pad_collate",
    "parse_budget",
    "plan_batches",
    "resolve_cost",
    "resolve_strategy",
]
