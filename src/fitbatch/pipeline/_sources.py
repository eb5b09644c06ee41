"""Pipeline sources: weighted infinite sampling, and how any iterable becomes an endless stream."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from fitbatch._rng import SeedLike, generator, resolve_seed

logger = logging.getLogger("fitbatch.pipeline")

# Indices are drawn in blocks: one numpy call per block instead of one per item. The block size
# is part of the stream's definition (a different size would give a different sequence).
_BLOCK = 1024
_PURPOSE = "pipeline.sample"


class Sampler(Iterator[Any]):
    """The infinite iterator returned by :func:`sample`; ``seed`` is the int it was keyed with."""

    def __init__(
        self, sequence: Sequence[Any], probabilities: np.ndarray | None, seed: int
    ) -> None:
        self.sequence = sequence
        self.seed = seed
        self._p = probabilities
        self._rng = generator(seed, 0, _PURPOSE)
        self._block: list[int] = []
        self._pos = 0

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> Any:
        if self._pos == len(self._block):
            n = len(self.sequence)
            drawn = (
                self._rng.choice(n, size=_BLOCK, p=self._p)
                if self._p is not None
                else self._rng.integers(n, size=_BLOCK)
            )
            self._block = drawn.tolist()
            self._pos = 0
        index = self._block[self._pos]
        self._pos += 1
        return self.sequence[index]

    def __repr__(self) -> str:
        kind = "uniform" if self._p is None else "weighted"
        return (
            f"<fitbatch.pipeline sampler: {kind} over {len(self.sequence)} items, seed={self.seed}>"
        )


def sample(
    sequence: Sequence[Any], weights: Sequence[float] | None = None, seed: SeedLike = None
) -> Sampler:
    """Yield items of ``sequence`` drawn at random with replacement, forever.

    The stream depends only on ``seed`` (numpy ``Generator`` keyed by a ``SeedSequence``, never
    the global random state). With ``seed=None`` fresh entropy is drawn once and kept in the
    returned iterator's ``seed`` attribute, so a run can be replayed.

    Args:
        sequence: items to draw from; anything with ``len`` and integer indexing (a list, an
            array, a map-style dataset).
        weights: one non-negative weight per item (normalised here); ``None`` for uniform.
        seed: an int >= 0, a root ``numpy.random.SeedSequence`` or ``None``.

    Returns:
        An infinite iterator; its ``seed`` attribute holds the int seed used.

    Raises:
        ValueError: for an empty sequence, or weights of the wrong length, negative, not finite
            or all zero.
        TypeError: for a sequence without ``len`` / indexing, or a bad seed.

    >>> from itertools import islice
    >>> draws = list(islice(sample("abc", weights=[0, 1, 3], seed=0), 8))
    >>> draws == list(islice(sample("abc", weights=[0, 1, 3], seed=0), 8)), "a" in draws
    (True, False)
    """
    if not hasattr(sequence, "__len__") or not hasattr(sequence, "__getitem__"):
        raise TypeError(
            f"sample needs a sequence (len and indexing), got {type(sequence).__name__}; wrap an iterable in list()"
        )
    n = len(sequence)
    if n == 0:
        raise ValueError("sample needs a non-empty sequence, got one of length 0")
    return Sampler(sequence, _probabilities(weights, n), resolve_seed(seed))


def _probabilities(weights: Sequence[float] | None, n: int) -> np.ndarray | None:
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"weights must hold one number per item ({n}), got shape {w.shape}")
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        raise ValueError(f"weights must be finite and >= 0; index {int(bad[0])} is {w[bad[0]]!r}")
    total = w.sum()
    if total <= 0:
        raise ValueError("weights must not all be zero")
    return w / total


def endless(source: Iterable[Any]) -> Iterator[Any]:
    """Items of ``source`` forever: a re-iterable is iterated again each time it ends.

    A one-shot iterator (``iter(x) is x``: generators, :func:`sample`) is used as it is and may
    end; the pipeline then ends the epoch early and says so.
    """
    first = iter(source)
    if first is source:
        yield from first
        return
    passes = 0
    iterator = first
    while True:
        count = 0
        for item in iterator:
            count += 1
            yield item
        if count == 0:
            raise ValueError(
                f"the source {type(source).__name__} yielded no items"
                + (f" on pass {passes + 1}" if passes else "")
                + "; Infinite needs a non-empty source"
            )
        passes += 1
        iterator = iter(source)
