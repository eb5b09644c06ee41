"""The one statistics object: what a plan costs, how full its batches are, what it left out."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.costs import CostModel, Limits


@dataclasses.dataclass(frozen=True)
class PlanStats:
    """Statistics of one epoch's plan.

    Attributes:
        n_samples: samples placed in batches.
        n_batches: batches in the plan.
        lower_bound: ``ceil(total marginal sample cost / usable budget)``: no plan of these
            samples has fewer batches (for the padded and sum costs it is the classic bound). A
            sample over the budget (``oversized="single"``) counts as one batch; a cost model
            that need not add up over samples (one of your own, unless it sets
            ``superadditive = True``) has the bound 1.
        padding_efficiency: real size units / padded units (``sum(sizes) / sum(count * max)``).
        mean_fill, max_fill: batch cost / budget, averaged and at most.
        skipped: oversized samples left out (``oversized="skip"``).
        dropped: samples in batches dropped by ``drop_last``; ``dropped_batches`` counts those.
        oversized_batches: lone samples over budget planned alone (``oversized="single"``).
        straggler_ratio: for data-parallel plans, the mean over steps of max rank cost / mean
            rank cost (1.0 is perfect balance); ``None`` for a single process.
        plan_seconds: time spent planning.
        loss_units: the tokens that carry loss in all batches (the sum of ``loss_sizes``, see
            :func:`fitbatch.plan_batches`); the real size units when no loss sizes were given.
        fill_by_limit, min_fill_by_limit: with several limits (a budget per named size column),
            each limit's mean and smallest batch fill (the column's cost / its budget); ``None``
            for a plan of one budget, whose fills are ``mean_fill`` and ``max_fill``.
        n_shapes, shape_efficiency: with ``max_shapes``, the distinct ``(rows, length)`` batch
            shapes and real size units / sum of rows x length over the batches' shapes (the
            padding a collate to the shapes leaves); ``None`` without ``max_shapes``.

    Get one from :meth:`fitbatch.BatchPlan.stats`; it is a frozen dataclass.

    >>> import fitbatch
    >>> plan = fitbatch.plan_batches([12, 3, 7, 9, 4, 30], 24, strategy="sorted", oversized="skip")
    >>> stats = plan.stats()
    >>> stats.n_batches, stats.lower_bound, stats.skipped, round(stats.padding_efficiency, 3)
    (2, 2, 1, 0.778)
    >>> stats.summary()
    'sorted/padded: 2 batches (1.000x lower bound), 5 samples, padding efficiency 0.778, fill mean 0.938 max 1.000, skipped 1, dropped 0 in 0 batches, 0 oversized alone'
    >>> stats.as_dict()["batches_vs_lower_bound"]
    1.0
    """

    n_samples: int
    n_batches: int
    lower_bound: int
    padding_efficiency: float
    mean_fill: float
    max_fill: float
    skipped: int
    dropped: int
    dropped_batches: int
    oversized_batches: int
    budget: float
    cost: str
    strategy: str
    plan_seconds: float
    straggler_ratio: float | None = None
    loss_units: float = 0.0
    fill_by_limit: dict[str, float] | None = None
    min_fill_by_limit: dict[str, float] | None = None
    n_shapes: int | None = None
    shape_efficiency: float | None = None

    @property
    def batches_vs_lower_bound(self) -> float:
        """``n_batches / lower_bound`` (1.0 is the best any plan can do)."""
        if self.lower_bound == 0:
            return 1.0 if self.n_batches == 0 else math.inf
        return self.n_batches / self.lower_bound

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able), including ``batches_vs_lower_bound``."""
        out = dataclasses.asdict(self)
        out["batches_vs_lower_bound"] = self.batches_vs_lower_bound
        return out

    def limits_text(self) -> str:
        """Each limit's mean (and smallest) fill: ``"images 0.400 (0.000), tokens 0.950 (0.812)"``."""
        mins = self.min_fill_by_limit or {}
        return ", ".join(f"{n} {f:.3f} ({mins.get(n, 0.0):.3f})" for n, f in (self.fill_by_limit or {}).items())

    def summary(self) -> str:
        """One line for logs."""
        parts = [
            f"{self.n_batches} batches ({self.batches_vs_lower_bound:.3f}x lower bound)",
            f"{self.n_samples} samples",
            f"padding efficiency {self.padding_efficiency:.3f}",
            f"fill mean {self.mean_fill:.3f} max {self.max_fill:.3f}",
        ]
        if self.straggler_ratio is not None:
            parts.append(f"straggler ratio {self.straggler_ratio:.3f}")
        if self.fill_by_limit is not None:
            parts.append("fill by limit " + ", ".join(f"{n} {f:.3f}" for n, f in self.fill_by_limit.items()))
        if self.n_shapes is not None:
            parts.append(f"{self.n_shapes} shapes, efficiency {self.shape_efficiency:.3f}")
        if self.skipped or self.dropped or self.oversized_batches:
            parts.append(
                f"skipped {self.skipped}, dropped {self.dropped} in {self.dropped_batches} batches, "
                f"{self.oversized_batches} oversized alone"
            )
        return f"{self.strategy}/{self.cost}: " + ", ".join(parts)


def lower_bound(model: CostModel, budget: float, total_alone: float, n_samples: int) -> int:
    """``ceil(sum of marginal sample costs / usable budget)``, at least 1 for a non-empty plan.

    The marginal cost of a sample is its cost alone (``total_alone`` sums them) less the cost
    of an empty batch (the fixed part of a polynomial model); the usable budget is the budget
    less that fixed part. The ratio is taken exactly (as fractions of the float values). With
    whole-number costs and budget it is rounded up as it is; otherwise the float sum of ``n``
    costs may exceed the true sum by about ``n`` units in the last place, so the ratio is first
    lowered by that relative error (a bound may then be low by one, never high). A non-empty
    plan's bound is at least 1, also when no batch can hold any marginal cost.

    The bound holds for models whose batch costs at least its fixed part plus every sample's
    marginal cost (``CostModel.superadditive``: the built-ins). For any other model (a cost of
    your own need only be non-decreasing: ``max_size`` alone is one) it is 1, the only bound
    that holds for every such model; so it is where a sum of costs overflows float64.

    >>> from fitbatch.costs import SumCost
    >>> lower_bound(SumCost(), 70e9, 3.0, 2), lower_bound(SumCost(), 0.1, 0.1 + 0.2, 3), lower_bound(SumCost(), 4, 9, 3)
    (1, 3, 3)
    """
    if n_samples == 0:
        return 0
    if not model.superadditive or not math.isfinite(total_alone):
        return 1
    base = float(model.evaluate(np.zeros(1), np.zeros(1), np.zeros(1))[0])
    if all(float(x).is_integer() for x in (total_alone, base, budget)):  # whole numbers: exact in ints, no rounding
        whole_marginal, whole_usable = int(total_alone) - int(base) * n_samples, int(budget) - int(base)
        if whole_usable <= 0 or whole_marginal <= 0:
            return 1
        return max(1, -(-whole_marginal // whole_usable))
    # imported here: fractions loads decimal (~1.5 ms), which whole sizes and costs never need
    from fractions import Fraction

    marginal, usable = Fraction(total_alone) - Fraction(base) * n_samples, Fraction(budget) - Fraction(base)
    if usable <= 0 or marginal <= 0:
        return 1
    ratio = marginal / usable
    slack = Fraction(n_samples + 1, 2**52)  # the relative rounding error of a float sum of n terms
    return max(1, math.ceil(ratio * (1 - min(slack, Fraction(1, 2)))))


def samples_bound(model: CostModel, budget: float, values: NDArray[np.float64]) -> int:
    """:func:`lower_bound` of a plan of the samples of sizes ``values``; with several limits
    the largest of the limits' own bounds (each column's costs against its budget).

    >>> from fitbatch.costs import resolve_limits
    >>> limits = resolve_limits({"tokens": 10, "images": 2}, cost="sum")
    >>> samples_bound(limits, 1.0, np.array([[2.0, 1.0], [0.0, 9.0], [2.0, 3.0]]))   # images 4 / 2, tokens 13 / 10
    2
    """
    n = int(values.shape[0])
    # a sample over a budget fills a batch alone: one budget's worth, not its whole cost
    if not isinstance(model, Limits):
        return lower_bound(model, budget, float(np.minimum(model.sample_cost(values), budget).sum()), n)
    totals = (
        float(np.minimum(c.sample_cost(values[:, j]), b * budget).sum())
        for j, (c, b) in enumerate(zip(model.costs, model.budgets))
    )
    return max(lower_bound(c, b * budget, t, n) for c, b, t in zip(model.costs, model.budgets, totals))
