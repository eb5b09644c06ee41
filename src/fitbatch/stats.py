"""The one statistics object: what a plan costs, how full its batches are, what it left out."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class PlanStats:
    """Statistics of one epoch's plan.

    Attributes:
        n_samples: samples placed in batches.
        n_batches: batches in the plan.
        lower_bound: ``ceil(total marginal sample cost / usable budget)``: no plan of these
            samples has fewer batches (for the padded and sum costs it is the classic bound).
        padding_efficiency: real size units / padded units (``sum(sizes) / sum(count * max)``).
        mean_fill, max_fill: batch cost / budget, averaged and at most.
        skipped: oversized samples left out (``oversized="skip"``).
        dropped: samples in batches dropped by ``drop_last``; ``dropped_batches`` counts those.
        oversized_batches: lone samples over budget planned alone (``oversized="single"``).
        straggler_ratio: for data-parallel plans, the mean over steps of max rank cost / mean
            rank cost (1.0 is perfect balance); ``None`` for a single process.
        plan_seconds: time spent planning.
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
        if self.n_shapes is not None:
            parts.append(f"{self.n_shapes} shapes, efficiency {self.shape_efficiency:.3f}")
        if self.skipped or self.dropped or self.oversized_batches:
            parts.append(
                f"skipped {self.skipped}, dropped {self.dropped} in {self.dropped_batches} batches, "
                f"{self.oversized_batches} oversized alone"
            )
        return f"{self.strategy}/{self.cost}: " + ", ".join(parts)
