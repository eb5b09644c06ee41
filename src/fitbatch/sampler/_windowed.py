"""``WindowedBatchSampler``: the name a :class:`~fitbatch.BudgetBatchSampler` planned in windows had.

Deprecated (after 0.2.0), removed in 0.3.0: ``BudgetBatchSampler(sizes, budget, window=...)`` is
the same sampler (one class, one engine: :mod:`fitbatch.sampler._budget`).

>>> import warnings
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore", DeprecationWarning)
...     sampler = WindowedBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 10, window=4, block=2, strategy="sorted",
...                                    num_replicas=1, rank=0)
>>> isinstance(sampler, BudgetBatchSampler), list(sampler)
(True, [[3, 1], [0, 2], [6, 4], [7], [5]])
"""

from __future__ import annotations

import warnings
from typing import Any

from fitbatch.sampler._budget import BudgetBatchSampler


class WindowedBatchSampler(BudgetBatchSampler):
    """Deprecated: ``BudgetBatchSampler(..., window=N)`` (``window=None`` here means ``"auto"``'s
    window size, as it did: :func:`fitbatch.epoch._windows.auto_window`); removed in 0.3.0.

    >>> import pytest
    >>> with pytest.warns(DeprecationWarning, match="0.3.0"):
    ...     sampler = WindowedBatchSampler([5] * 8, 5, window=4, block=1, cost="sum", num_replicas=2, rank=0)
    >>> type(sampler).__mro__[1].__name__, sampler.window
    ('BudgetBatchSampler', 4)
    """

    def __init__(self, sizes: Any, budget: Any, *, window: int | None = None, **kwargs: Any) -> None:
        warnings.warn(
            "fitbatch.sampler.WindowedBatchSampler is deprecated and will be removed in 0.3.0; use "
            "fitbatch.BudgetBatchSampler(sizes, budget, window=...), the same sampler",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(sizes, budget, window=window, **kwargs)
        if window is None:  # its own choice of window, at any size (a resume adopts the saved one)
            from fitbatch.epoch import _windows as W

            self.window = self._window(W.auto_window(self._column, self._opts, self.num_replicas))
            self._auto = True


__all__ = ["WindowedBatchSampler"]
