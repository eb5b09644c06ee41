"""Bookkeeping of :mod:`fitbatch.streaming`: what a stream has yielded, round by round.

A planning round's batches are cut out of the round's items on demand; nothing is recorded per
batch. The summary and the resume state read how far the consumer got from the iterator's
length hint and take the totals from the round's cumulative arrays.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]


@dataclasses.dataclass(frozen=True)
class StreamSummary:
    """What a stream has done so far (a snapshot; read :attr:`BatchStream.summary` again later).

    Attributes:
        items_read: items taken from the source.
        items_emitted: items in the batches yielded.
        batches: batches yielded.
        held: items read but not yet yielded (buffered).
        skipped: oversized items left out (``oversized="skip"``); ``skipped_positions`` holds
            the stream positions of the first ten.
        oversized_batches: lone items over budget yielded alone (``oversized="single"``).
        padding_efficiency: real size units / padded units of the batches yielded.
        finished: whether the source is exhausted and every batch was yielded.

    >>> import fitbatch
    >>> stream = fitbatch.batch_stream([2, 9, 3, 1], sizeof=int, budget=4, cost="sum", oversized="skip")
    >>> list(stream)
    [[2], [3, 1]]
    >>> stream.summary
    StreamSummary(items_read=4, items_emitted=3, batches=2, held=0, skipped=1, skipped_positions=(1,),
                  oversized_batches=0, padding_efficiency=0.75, finished=True)
    """

    items_read: int
    items_emitted: int
    batches: int
    held: int
    skipped: int
    skipped_positions: tuple[int, ...]
    oversized_batches: int
    padding_efficiency: float
    finished: bool


Totals = tuple[int, int, float, float, int]
_NO_BATCHES = np.zeros(0, np.int64)


@dataclasses.dataclass
class _Round:
    """The batches of one planning round, sliced out of the round's items on demand, in C.

    Nothing is recorded per batch: how many were yielded is read off the length hint of the
    iterator over the batch heads when the summary or the state is asked for, and the totals at
    that point come from the round's cumulative arrays (``[j - 1]`` after ``j`` batches).
    """

    batches: Iterator[Any]  # slices items[head:tail] on demand (short-lived lists: cheap to collect)
    heads: Iterator[int]  # the list iterator over the batch heads: its length hint is what is left
    size: int
    base: Totals  # (batches, items, real units, padded units, oversized batches) before the round
    emitted: IntArray  # cumulative totals after each batch of the round, base included
    real: NDArray[np.float64]
    padded: NDArray[np.float64]
    over: IntArray
    runs: list[tuple[IntArray, int, int]]  # the batches' items are positions[a:z] of these, in order

    @staticmethod
    def empty(base: Totals) -> _Round:
        none = np.zeros(0)
        return _Round(iter([]), iter([]), 0, base, _NO_BATCHES, none, none, _NO_BATCHES, [])

    def yielded(self) -> int:
        return self.size - operator.length_hint(self.heads)

    def totals(self, j: int) -> Totals:
        """The totals after ``j`` batches of the round."""
        if not j:
            return self.base
        k = j - 1
        return (self.base[0] + j, int(self.emitted[k]), float(self.real[k]), float(self.padded[k]), int(self.over[k]))

    def pending(self) -> IntArray:
        """Stream positions of the items of the batches not yet yielded."""
        j = self.yielded()
        if j == self.size:
            return _NO_BATCHES
        first = int(self.emitted[j - 1]) - self.base[1] if j else 0
        return np.concatenate([p[a:z] for p, a, z in self.runs])[first:]
