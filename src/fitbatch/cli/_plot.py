"""``fitbatch plan --plot``: the size histogram with bucket boundaries, and per-batch fills.

matplotlib is imported here only, without pyplot (no global figure state, no display needed).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

import fitbatch
from fitbatch.strategies import Buckets, Context


def bucket_edges(sizes: fitbatch.Sizes, budget: float, cost: str, max_batch_size: int | None = None) -> NDArray[np.float64]:
    """Upper edges of the size buckets the ``buckets`` strategy fits to these sizes."""
    ctx = Context(sizes=sizes, budget=budget, cost=fitbatch.costs.resolve_cost(cost), cap=max_batch_size,
                  multiple=1, shuffle=False, seed=0, epoch=0)
    return Buckets().bucket_ids(ctx)[1]


def _size_bins(values: NDArray[np.float64]) -> tuple[NDArray[np.float64], bool]:
    """Log-spaced bins for long-tailed sizes (max / smallest positive > 100), else linear."""
    positive = values[values > 0]
    lo, hi = (float(positive.min()), float(values.max())) if positive.size else (0.0, 1.0)
    if positive.size and hi / lo > 100:
        return np.geomspace(lo, hi * 1.0001, 80), True
    return np.linspace(float(values.min()), max(hi, float(values.min()) + 1), 80), False


def plot_plan(
    path: str | os.PathLike[str],
    sizes: fitbatch.Sizes,
    plans: Sequence[tuple[str, fitbatch.BatchPlan]],
    *,
    budget: float,
    cost: str,
    max_batch_size: int | None = None,
) -> None:
    """Write a PNG: left, the size histogram with the fitted bucket edges; right, per plan, the
    distribution of batch fill (cost / budget), with the budget at 1.0."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install 'fitbatch[plot]'") from exc
    values = sizes.real_units()
    fig = Figure(figsize=(12, 4.5), dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2)
    bins, log = _size_bins(values)
    left.hist(values, bins=bins, color="#4C72B0")
    if log:
        left.set_xscale("log")
    left.set_yscale("log")
    if sizes.ndim == 1:
        edges = bucket_edges(sizes, budget, cost, max_batch_size)
        for x in edges[:-1]:
            left.axvline(x, color="#DD8452", lw=0.6, alpha=0.6, zorder=0)
        left.plot([], [], color="#DD8452", label=f"{edges.size} fitted bucket edges")
        left.legend(loc="upper right")
    left.set_title(f"{values.size:,} sizes")
    left.set_xlabel("size")
    left.set_ylabel("samples")
    top = max(1.05, *(float((p.costs / budget).max(initial=0.0)) * 1.02 for _, p in plans))
    fill_bins = np.linspace(0.0, top, 60)
    for name, plan in plans:
        fills = plan.costs / budget
        weights = np.full(fills.size, 1.0 / max(fills.size, 1))  # share of the plan's batches
        right.hist(fills, bins=fill_bins, weights=weights, histtype="step", lw=1.5, label=f"{name} ({len(plan):,} batches)")
    right.axvline(1.0, color="black", ls="--", lw=1, label="budget")
    right.set_title(f"batch fill, budget {budget:g} ({cost} cost)")
    right.set_xlabel("batch cost / budget")
    right.set_ylabel("share of batches")
    right.legend(loc="upper left", fontsize=8)
    fig.savefig(os.fspath(path))
