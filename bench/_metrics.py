"""Quality metrics of plans shared by the benchmarks: randomness and optimality."""

from __future__ import annotations

import numpy as np

import fitbatch


def batch_ids(plan: fitbatch.BatchPlan, n: int) -> np.ndarray:
    """Batch id of every sample (-1 for samples not in the plan)."""
    ids = np.full(n, -1, dtype=np.int64)
    ids[plan.order] = np.repeat(np.arange(len(plan)), plan.counts)
    return ids


def repeat_rate(plan_a: fitbatch.BatchPlan, plan_b: fitbatch.BatchPlan, n: int) -> float:
    """Share of sample pairs sharing a batch in plan_a that share one again in plan_b."""
    a, b = batch_ids(plan_a, n), batch_ids(plan_b, n)
    counts = plan_a.counts.astype(np.float64)
    pairs_a = float((counts * (counts - 1) / 2).sum())
    if pairs_a == 0:
        return 0.0
    ok = (a >= 0) & (b >= 0)
    # pairs together in both = sum over (a, b) cells of C(cell size, 2)
    key = a[ok] * (int(b.max()) + 1) + b[ok]
    _, cell = np.unique(key, return_counts=True)
    cell = cell.astype(np.float64)
    return float((cell * (cell - 1) / 2).sum()) / pairs_a


def spearman_position_size(plan: fitbatch.BatchPlan, sizes: np.ndarray) -> float:
    """Spearman correlation between a batch's position in the epoch and its mean size."""
    if len(plan) < 3:
        return 0.0
    mean = np.add.reduceat(sizes[plan.order].astype(np.float64), plan.offsets[:-1]) / plan.counts
    rx = np.argsort(np.argsort(np.arange(len(plan)))).astype(np.float64)
    ry = _rank(mean)
    return float(np.corrcoef(rx, ry)[0, 1])


def _rank(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(x.size)
    # average ranks of ties
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]


def optimal_padded_batches(sizes: np.ndarray, budget: float, cost="padded", **kw) -> int:
    """Greedy over globally sorted sizes: optimal batch count for the padded cost."""
    return len(fitbatch.plan_batches(sizes, budget, cost=cost, strategy="sorted", **kw))
