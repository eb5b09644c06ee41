"""The epoch engine: one global plan laid out as equal, cost-balanced steps over the ranks.

Pure numpy (torch only inside the world probes). ``arrange`` cuts a plan into :class:`Steps`
(``grid[k, r]`` is the batch rank ``r`` runs at step ``k``; equal step counts, each step's
batches of nearly the same cost, per-step totals in :class:`StepTotals`); ``_timeline`` keeps an
epoch that changed part-way (budget, cost model, world size) as segments of arrangements;
``_windows`` plans an epoch of very many samples a window at a time; ``_world`` says who is
running and makes the decisions every rank must share.

>>> from fitbatch import as_sizes, plan_batches
>>> from fitbatch.costs import resolve_cost
>>> from fitbatch.epoch import arrange
>>> sizes = as_sizes([5, 3, 8, 2, 7, 4, 6, 1, 9])
>>> steps = arrange(plan_batches(sizes, 10, strategy="sorted"), sizes, resolve_cost("padded"), 2, seed=0, epoch=0)
>>> steps.grid.shape[1], len(steps.rank_plan(0)) == len(steps.rank_plan(1))
(2, True)
"""

from __future__ import annotations

from fitbatch.epoch._arrange import (
    POLICIES,
    Steps,
    StepTotals,
    TooFewSamples,
    arrange,
    arrange_budgets,
)
from fitbatch.epoch._world import shared_seed, world_info

__all__ = [
    "POLICIES",
    "StepTotals",
    "Steps",
    "TooFewSamples",
    "arrange",
    "arrange_budgets",
    "shared_seed",
    "world_info",
]
