"""``dpipe.batch_iter.sources``: endless random draws from a sequence.

:func:`sample` is :func:`fitbatch.pipeline.sample` with dpipe's ``random_state``: its draws come
from a numpy ``Generator`` keyed by the seed, so they differ from dpipe's for the same number.

>>> from itertools import islice
>>> from fitbatch.compat.dpipe import load_by_random_id
>>> list(islice(load_by_random_id(str.upper, ids=["a"]), 2))
['A', 'A']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fitbatch import pipeline
from fitbatch._rng import SeedLike
from fitbatch.compat.dpipe.utils import squeeze_first

__all__ = ["load_by_random_id", "sample"]


def sample(
    sequence: Sequence[Any],
    weights: Sequence[float] | None = None,
    random_state: SeedLike | np.random.RandomState = None,
) -> Any:
    """Items of ``sequence`` drawn at random with replacement, forever (:func:`fitbatch.pipeline.sample`).

    Args:
        sequence: the items (``len`` and indexing).
        weights: one non-negative weight per item, or ``None`` for uniform draws.
        random_state: an int seed, ``None`` (fresh entropy, kept in the iterator's ``seed``),
            a ``numpy.random.SeedSequence``, or a ``numpy.random.RandomState`` (one seed is
            drawn from it).

    >>> from itertools import islice
    >>> list(islice(sample("ab", [0, 1], random_state=3), 4))
    ['b', 'b', 'b', 'b']
    """
    if isinstance(random_state, np.random.RandomState):
        random_state = int(random_state.randint(0, 2**31 - 1))
    return pipeline.sample(sequence, weights, seed=random_state)


def load_by_random_id(
    *loaders: Callable[[Any], Any],
    ids: Sequence[Any],
    weights: Sequence[float] | None = None,
    random_state: SeedLike | np.random.RandomState = None,
) -> Iterator[Any]:
    """Forever: an id drawn by :func:`sample`, loaded by each loader (one loader: its value alone).

    >>> from itertools import islice
    >>> list(islice(load_by_random_id(len, str, ids=["xyz"]), 1))
    [(3, 'xyz')]
    """
    for loader in loaders:
        if not callable(loader):
            raise TypeError(f"each loader must be callable, got {loader!r}")
    draws = sample(ids, weights, random_state)
    return (squeeze_first(tuple(load(i) for load in loaders)) for i in draws)
