"""``dpipe.batch_iter.expiration_pool``: reuse expensive items a few times before new ones.

Draws come from numpy's global random state, as in dpipe (the signature has no seed), so
``np.random.seed`` reproduces a dpipe run.

>>> from collections import Counter
>>> from fitbatch.compat.dpipe import expiration_pool
>>> sorted(Counter(expiration_pool(range(5), pool_size=2, repetitions=3)).values())
[3, 3, 3, 3, 3]
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from fitbatch._validate import positive_int
from fitbatch.compat.dpipe.pipeline import Iterator as IteratorStage

__all__ = ["ExpirationPool", "expiration_pool"]


def expiration_pool(iterable: Iterable[Any], pool_size: int, repetitions: int, iterations: int = 1) -> Iterator[Any]:
    """Keep up to ``pool_size`` items of ``iterable`` and yield random ones of them.

    Each item is yielded ``repetitions`` times, then leaves the pool and the next item of
    ``iterable`` enters it; after an item enters, ``iterations`` values are yielded (more while
    the pool is full).

    Raises:
        TypeError, ValueError: ``pool_size`` or ``repetitions`` not an int >= 1 (dpipe fails an
            ``assert``), when called.

    >>> from fitbatch.compat.dpipe import expiration_pool
    >>> len(list(expiration_pool("abc", pool_size=1, repetitions=2)))
    6
    """
    positive_int("pool_size", pool_size)
    positive_int("repetitions", repetitions)
    return _pool(iterable, pool_size, repetitions, iterations)


def _pool(iterable: Iterable[Any], pool_size: int, repetitions: int, iterations: int) -> Iterator[Any]:
    pool: dict[int, list[Any]] = {}  # arrival number -> [item, times yielded]

    def draw() -> Any:
        key = np.random.choice(list(pool))  # the global state, as dpipe (module docstring)
        entry = pool[key]
        entry[1] += 1
        if entry[1] == repetitions:
            del pool[key]
        return entry[0]

    for key, item in enumerate(iterable):
        pool[key] = [item, 0]
        for _ in range(iterations):
            if pool:
                yield draw()
        while len(pool) >= pool_size:
            yield draw()
    while pool:
        yield draw()


class ExpirationPool(IteratorStage):
    """:func:`expiration_pool` as a pipeline stage of :class:`~fitbatch.compat.dpipe.Infinite`.

    >>> from fitbatch.compat.dpipe import ExpirationPool, Infinite
    >>> with Infinite(range(3), ExpirationPool(2, 2), batch_size=3, batches_per_epoch=2, combiner=sorted) as batches:
    ...     [len(b) for b in batches()]
    [3, 3]
    """

    def __init__(self, pool_size: int, repetitions: int, iterations: int = 1) -> None:
        positive_int("pool_size", pool_size)
        positive_int("repetitions", repetitions)
        super().__init__(functools.partial(expiration_pool, pool_size=pool_size, repetitions=repetitions, iterations=iterations))
