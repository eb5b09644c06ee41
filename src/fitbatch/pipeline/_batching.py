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
        if self._scalar is not None and self._dims == 0:
            return self._push_scalar(item, s, self._scalar)
        return self._push_vector(item, s)

    def _push_scalar(
        self, item: Any, s: float, cost: Callable[[float, float, float], float]
    ) -> list[Batch]:
        # The pure-Python twin of _push_vector: same decisions, candidates computed as needed.
        n, budget = len(self._items), self._budget
        if n:
            m, t = max(self._max, s), self._sum + s
            if cost(n + 1, m, t) <= budget:
                self._items.append(item)
                self._max, self._sum = m, t
                return [self.flush()] if cost(n + 2, m, t) > budget else []
        done = [self._items] if n else []
        self._items, self._max, self._sum = [item], s, s
        if cost(1, s, s) > budget:
            self._warn_oversized(s, cost(1, s, s))
        if cost(2, s, s) > budget:
            done.append(self.flush())
        return done

    def _push_vector(self, item: Any, s: Any) -> list[Batch]:
        n = len(self._items)
        grown_max, grown_sum = (np.maximum(self._max, s), self._sum + s) if n else (s, s)
        # One evaluation, four candidates: the batch with the item; that batch plus one more
        # zero-size item; the item alone; the item plus a zero-size item. Monotone costs make
        # a zero-size item the cheapest possible next step, so "over budget" there means "full".
        joined, joined_full, alone, alone_full = (
            float(x)
            for x in self._model.evaluate(
                np.array([n + 1, n + 2, 1, 2], dtype=np.float64),
                np.array([grown_max, grown_max, s, s]),
                np.array([grown_sum, grown_sum, s, s]),
            )
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
        value, dims = _as_size(raw)
        if dims != self._dims:
            if self._dims is not None:
                raise ValueError(
                    f"Budget.size returned {raw!r} with {dims} dimensions after sizes with {self._dims}; keep one shape"
                )
            self._dims = dims
        return value

    def _warn_oversized(self, s: Any, cost: float) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "an item of size %s costs %g alone, over the budget %g; it is yielded as a batch "
                "of one (further such items are not logged)",
                s,
                cost,
                self._budget,
            )


def _as_size(raw: Any) -> tuple[Any, int]:
    """(a float, 0) or (a 1-D float64 array, D) from what ``Budget.size`` returned."""
    # exact int/float first: the common case skips the slower ABC check
    if (
        type(raw) is float
        or type(raw) is int
        or (isinstance(raw, numbers.Real) and not isinstance(raw, bool))
    ):
        value = float(raw)
        if 0.0 <= value < math.inf:
            return value, 0
    else:
        try:
            array = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError):
            array = np.empty(0)
        if array.ndim == 1 and array.size and bool(np.all(np.isfinite(array) & (array >= 0))):
            return array, array.size
    raise ValueError(
        f"Budget.size returned {raw!r}; sizes must be finite numbers >= 0 or 1-D sequences of them"
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
