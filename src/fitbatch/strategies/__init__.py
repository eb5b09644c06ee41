"""Strategies: which samples go together. Each orders the samples, then calls a kernel.

* :class:`Sequential` — greedy in the given order (or a shuffled one); the seed tools' behaviour.
* :class:`Sorted` — greedy over samples sorted by size; for evaluation.
* :class:`Pooled` — shuffle, sort by size level (or, with ``randomness=None``, by exact size
  within pools), greedy, shuffle the batch order.
* :class:`Buckets` — size buckets fitted to the data; shuffle inside buckets, equal-count batches
  per bucket, the buckets' leftovers planned together; batches interleaved at random.

``randomness=`` on both is the co-batch repeat rate aimed at (:func:`fitbatch.plan.repeat_rate`
between consecutive epochs); ``"auto"`` picks it from the data (docs/plan_quality.md).
* :class:`Packed` — bin packing within pools: for costs that grow with the sum, first-fit
  decreasing (each sample, largest first, into the first batch with room for it), then the
  loosely filled batches of every pool packed again together; other costs are already
  count-bound, so it plans like :class:`Pooled`.
* :class:`Fixed` — ``batch_size`` samples per batch whatever they cost (the baseline; not a
  name, since it needs its batch size).

Any strategy works with any cost model. A strategy is a frozen dataclass; the names
``"sequential"``, ``"sorted"``, ``"pooled"``, ``"buckets"`` and ``"packed"`` give the defaults.

>>> resolve_strategy("pooled")
Pooled(pool_size=65536, randomness='auto', spread=0.02)
>>> resolve_strategy(Buckets(spread=0.05)).spread
0.05
"""

from __future__ import annotations

from collections.abc import Sequence

from fitbatch._validate import choice
from fitbatch.strategies._base import Context, Result, Strategy
from fitbatch.strategies._buckets import Buckets
from fitbatch.strategies._fixed import Fixed
from fitbatch.strategies._ordered import Packed, Pooled, Sequential, Sorted

__all__ = [
    "Buckets",
    "Context",
    "Fixed",
    "Packed",
    "Pooled",
    "Result",
    "STRATEGIES",
    "Sequential",
    "Sorted",
    "Strategy",
    "resolve_strategy",
    "strategy_names",
]


STRATEGIES: dict[str, type[Strategy]] = {
    "buckets": Buckets,
    "packed": Packed,
    "pooled": Pooled,
    "sequential": Sequential,
    "sorted": Sorted,
}


def resolve_strategy(strategy: str | Strategy) -> Strategy:
    """Coerce a strategy name or instance into a :class:`Strategy`.

    >>> resolve_strategy("sorted"), resolve_strategy(Fixed(4))
    (Sorted(descending=False), Fixed(batch_size=4))
    """
    if isinstance(strategy, Strategy):
        return strategy
    name = choice("strategy", strategy, tuple(STRATEGIES))
    return STRATEGIES[name]()


def strategy_names() -> Sequence[str]:
    """The names ``strategy=`` accepts.

    >>> strategy_names()
    ('buckets', 'packed', 'pooled', 'sequential', 'sorted')
    """
    return tuple(STRATEGIES)
