"""``equibatch``'s ``EquiarealBatchSampler`` on fitbatch's engine.

Migrating: ``from equibatch import EquiarealBatchSampler`` becomes
``from fitbatch.compat.equibatch import EquiarealBatchSampler``; nothing else changes.

The batches are the original's: greedy in the sampler's order, a batch closes before the sample
that would push its summed footprint over ``max_footprint`` or its count over ``max_size``, and a
sample over ``max_footprint`` on its own gets a batch of its own. They are planned by
:func:`fitbatch.plan._planner.plan_with` (``strategy="sequential"``, ``cost="sum"``,
``max_batch_size=max_size``, ``oversized="single"``) over the order the sampler yields.

Deliberate differences from equibatch 0.1.3 (bugs not reproduced):

* ``len()``, ``list()`` and ``DataLoader(batch_sampler=...)`` work with torch installed. The
  original subclasses torch's ``BatchSampler`` without calling its ``__init__``, so ``len()``
  (and ``list()``, which asks for a length hint) raise ``AttributeError: drop_last``.
* An empty sampler yields no batch; the original yields one empty batch ``[]``.
* ``max_size`` and ``max_footprint`` are validated (``max_size`` an int >= 1, or ``None`` /
  ``math.inf`` for no limit; ``max_footprint`` positive), and a negative, NaN or infinite
  footprint raises ``ValueError`` naming the sample; the original accepts them and produces
  batches over the limits.
* Zero footprints count like any other: the original treats a batch whose footprint is still 0
  as empty, so zero-footprint samples never close a batch and ``max_size`` is not enforced on
  them.
* Fractional footprints are planned against ``max_footprint * (1 - 1e-12)`` (as everywhere in
  fitbatch), so float rounding never lets a batch overshoot; ties within that margin may close
  a batch one sample earlier than the original.

>>> from fitbatch.compat.equibatch import EquiarealBatchSampler
>>> data = ["London", "Birmingham", "Glasgow", "Leeds"]
>>> sampler = EquiarealBatchSampler(range(len(data)), lambda ix: len(data[ix]), 10, 20)
>>> list(sampler), len(sampler)
([[0, 1], [2, 3]], 2)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from fitbatch._validate import parse_budget, positive_int
from fitbatch.compat import OrderedPlanSampler, lazy_torch_classes, measure, plan_in_order
from fitbatch.plan._planner import BatchPlan

__all__ = ["EquiarealBatchSampler"]


def _max_size(value: Any) -> int | None:
    if value is None or (isinstance(value, float) and value == math.inf):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"max_size must be an int >= 1, None or math.inf (no limit), got {value!r}")
    return positive_int("max_size", value)


class _EquiarealBatchSampler(OrderedPlanSampler):
    """Batches whose summed footprint is at most ``max_footprint`` (equibatch's API).

    A subclass of torch's ``BatchSampler`` when torch is installed. ``len()`` draws the order
    of the next iteration (the sampler may be random), so ``len()`` and the iteration after it
    agree.

    Args:
        sampler: an iterable of indices, traversed once per iteration (``range``, a torch
            ``Sampler``); its order is kept.
        len_checker: ``index -> footprint`` (a non-negative number).
        max_size: at most this many samples per batch (``None`` or ``math.inf``: no limit).
        max_footprint: the most summed footprint one batch may have.

    Raises:
        TypeError: ``sampler`` not iterable, ``len_checker`` not callable, bad types.
        ValueError: non-positive limits; while iterating, negative or non-finite footprints.
    """

    def __init__(
        self,
        sampler: Iterable[Any],
        len_checker: Callable[[Any], float],
        max_size: int | float | None,
        max_footprint: float,
    ) -> None:
        if not isinstance(sampler, Iterable) or isinstance(sampler, str):
            raise TypeError(f"sampler must be an iterable of indices, got {sampler!r}")
        if not callable(len_checker):
            raise TypeError(f"len_checker must be callable (index -> footprint), got {len_checker!r}")
        self.sampler = sampler
        self.len_checker = len_checker
        self.max_size = max_size
        self.max_footprint = max_footprint
        self.drop_last = False  # read by code that inspects torch BatchSamplers
        self._cap = _max_size(max_size)
        self._budget = parse_budget(max_footprint, "max_footprint")

    def _draw(self) -> tuple[list[Any], BatchPlan]:
        order = list(self.sampler)
        sizes = measure(order, self.len_checker, "len_checker")
        plan = plan_in_order(order, sizes, self._budget, max_batch_size=self._cap, oversized="single")
        return order, plan

    def __repr__(self) -> str:
        return f"EquiarealBatchSampler(max_size={self.max_size!r}, max_footprint={self.max_footprint!r})"


if TYPE_CHECKING:
    EquiarealBatchSampler = _EquiarealBatchSampler
else:
    # torch's BatchSampler as a base class costs importing torch: paid on first use only
    __getattr__ = lazy_torch_classes(__name__, {"EquiarealBatchSampler": (_EquiarealBatchSampler, "BatchSampler")})
