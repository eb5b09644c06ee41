"""Batching rules of a pipeline: a fixed count, a ``should_add`` predicate, or a cost budget.

A rule is configuration; :meth:`start` gives the running state that the batching thread feeds
one item at a time. ``push`` returns the batches that the item completed (none, one or two), so
a batch leaves as soon as it is known to be full instead of waiting for the next item.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np

from fitbatch._validate import parse_budget, positive_int
from fitbatch.costs import CostModel, PaddedCost, PaddedPolynomial, SumCost, resolve_cost

logger = logging.getLogger("fitbatch.pipeline")

Batch = list[Any]
Predicate = Callable[[list[Any], Any], bool]


class BatchState(Protocol):
    """Running state of one rule: the batch being built."""

    def push(self, item: Any) -> list[Batch]:
        """Add ``item``; return the batches it completed, oldest first."""

    def flush(self) -> Batch:
        """Return the unfinished batch (possibly empty) and start a new one."""


class _Fixed:
    def __init__(self, size: int) -> None:
        self._size = size
        self._items: Batch = []

    def push(self, item: Any) -> list[Batch]:
        self._items.append(item)
        return [self.flush()] if len(self._items) == self._size else []

    def flush(self) -> Batch:
        items, self._items = self._items, []
        return items


class _Predicate:
    """dpipe's rule: ``should_add(batch, item)`` decides; an empty batch always takes the item."""

    def __init__(self, should_add: Predicate) -> None:
        self._should_add = should_add
        self._items: Batch = []

    def push(self, item: Any) -> list[Batch]:
        if self._items and not self._should_add(self._items, item):
            done, self._items = self._items, [item]
            return [done]
        self._items.append(item)
        return []

    def flush(self) -> Batch:
        items, self._items = self._items, []
        return items


@dataclasses.dataclass(frozen=True, eq=False)
class Budget:
    """Batch by cost: an item joins the batch if the batch with it stays within ``budget``.

    Each item is measured once by ``size`` and the batch's running (count, max size, sum of
    sizes) are kept, so the cost model is evaluated once per item on four candidate batches:
    no re-scan of the batch, unlike a ``should_add`` predicate. A single item whose own cost
    exceeds the budget becomes a batch of one (logged once). A batch is yielded as soon as not
    even an item of size 0 could join it.

    Args:
        budget: a positive number or a string with a byte unit (``"512MiB"``).
        size: ``size(item)`` -> a non-negative number, or a sequence of D numbers for
            D-dimensional sizes (for example an image's shape).
        cost: ``"sum"`` (default), ``"padded"`` (count x max), ``"polynomial"``, a
            :class:`~fitbatch.costs.CostModel` or a vectorised function.

    Raises:
        ValueError, TypeError: for an invalid budget, cost or size function (here); for an
            invalid size of an item (in the consumer, when that item is batched).

    >>> from fitbatch.pipeline import Infinite, combine_batches
    >>> rule = Budget(10, size=len)
    >>> with Infinite(["abc", "defg", "hi", "jklmnop"], batch_size=rule, batches_per_epoch=3,
    ...               combiner=combine_batches) as batches:
    ...     list(batches())
    [('abc', 'defg', 'hi'), ('jklmnop', 'abc'), ('defg', 'hi')]
    """

    budget: float | str
    size: Callable[[Any], Any]
    cost: str | CostModel | Callable[..., Any] = "sum"

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", parse_budget(self.budget))
        if not callable(self.size):
            raise TypeError(f"Budget.size must be a function item -> size, got {self.size!r}")
        object.__setattr__(self, "cost", resolve_cost(self.cost))

    def start(self) -> _BudgetState:
        """A fresh running state for one pipeline."""
        # __post_init__ has coerced both fields
        return _BudgetState(cast(float, self.budget), self.size, cast(CostModel, self.cost))


def _scalar_cost(model: CostModel) -> Callable[[float, float, float], float] | None:
    """Pure-Python twin of a built-in model for 1-D sizes (weights only matter in D dims)."""
    if isinstance(model, SumCost):
        return lambda count, max_size, sum_size: sum_size
    if isinstance(model, PaddedCost):
        return lambda count, max_size, sum_size: count * max_size
    if isinstance(model, PaddedPolynomial):
        f, a, b, q = model.fixed, model.linear, model.per_token, model.quadratic
        return lambda count, max_size, sum_size: f + count * (a + max_size * (b + q * max_size))
    return None


class _BudgetState:
    def __init__(self, budget: float, size: Callable[[Any], Any], model: CostModel) -> None:
        self._budget = budget
        self._size = size
        self._model = model
        self._scalar = _scalar_cost(model)
        self._items: Batch = []
        self._max: Any = 0.0
        self._sum: Any = 0.0
        self._dims: int | None = None  # 0 for scalar sizes, D for D-dimensional ones
        self._warned = False

    def push(self, item: Any) -> list[Batch]:
        s = self._measure(item)
        n = len(self._items)
        grown_max, grown_sum = self._grow(s)
        # Candidates: the batch with the item; that batch plus one more zero-size item; the
        # item alone; the item plus a zero-size item. Monotone costs make the zero-size
        # candidates the cheapest possible next step, so "over budget" there means "full".
        joined, joined_full, alone, alone_full = self._costs(
            (n + 1, grown_max, grown_sum), (n + 2, grown_max, grown_sum), (1, s, s), (2, s, s)
        )
        done: list[Batch] = []
        if n == 0 or joined <= self._budget:
            self._items.append(item)
            self._max, self._sum, full = grown_max, grown_sum, joined_full > self._budget
        else:
            done.append(self._items)
            self._items, self._max, self._sum, full = [item], s, s, alone_full > self._budget
        if len(self._items) == 1 and alone > self._budget:
            self._warn_oversized(s, alone)
        if full:
            done.append(self.flush())
        return done

    def flush(self) -> Batch:
        items, self._items = self._items, []
        self._max = self._sum = 0.0
        return items

    def _measure(self, item: Any) -> Any:
        raw = self._size(item)
        if isinstance(raw, numbers.Real) and not isinstance(raw, bool):
            value: Any = float(raw)
            dims, ok = 0, math.isfinite(value) and value >= 0
        else:
            value = np.asarray(raw, dtype=np.float64)
            dims = value.size if value.ndim == 1 else -1
            ok = dims > 0 and bool(np.all(np.isfinite(value) & (value >= 0)))
        if not ok:
            raise ValueError(f"Budget.size returned {raw!r}; sizes must be finite numbers >= 0 or 1-D sequences of them")
        if self._dims is None:
            self._dims = dims
        elif dims != self._dims:
            raise ValueError(f"Budget.size returned {raw!r} with {dims} dimensions after sizes with {self._dims}; keep one shape")
        return value

    def _grow(self, s: Any) -> tuple[Any, Any]:
        if not self._items:
            return s, s
        if self._dims == 0:
            return max(self._max, s), self._sum + s
        return np.maximum(self._max, s), self._sum + s

    def _costs(self, *candidates: tuple[int, Any, Any]) -> list[float]:
        if self._scalar is not None and self._dims == 0:
            return [self._scalar(c, m, s) for c, m, s in candidates]
        counts, maxima, sums = zip(*candidates, strict=True)
        out = self._model.evaluate(np.array(counts, dtype=np.float64), np.array(maxima), np.array(sums))
        return [float(x) for x in out]

    def _warn_oversized(self, s: Any, cost: float) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "an item of size %s costs %g alone, over the budget %g; it is yielded as a batch "
                "of one (further such items are not logged)", s, cost, self._budget,
            )


def resolve_rule(batch_size: Any) -> Callable[[], BatchState]:
    """Validate ``batch_size`` (int, predicate or :class:`Budget`) into a state factory."""
    if isinstance(batch_size, Budget):
        return batch_size.start
    if isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool):
        size = cast(int, positive_int("batch_size", batch_size))
        return lambda: _Fixed(size)
    if callable(batch_size):
        return lambda: _Predicate(batch_size)
    raise TypeError(
        "batch_size must be an int >= 1, a should_add(batch, item) function or a "
        f"fitbatch.pipeline.Budget, got {batch_size!r}"
    )
