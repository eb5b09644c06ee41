"""Streaming: size-aware batches from an iterable of unknown length, in bounded memory.

:func:`batch_stream` reads a source (a generator, a webdataset or Hugging Face streaming
dataset, lines of a file) in chunks, measures each item with ``sizeof`` (or a whole chunk with
``sizeof=per_chunk(fn)``) and yields batches whose cost fits ``budget`` under the same cost models and
kernels as :func:`fitbatch.plan_batches`:

* ``strategy="sequential"`` keeps the source order and batches greedily (bionemo's
  ``size_aware_batching``): the batches equal the indexed ``sequential`` plan of the same sizes.
  Memory: one round of ``min(buffer_size, 32768)`` items plus the batch still open.
* ``strategy="buckets"`` (or ``fitbatch.Buckets(boundaries=...)``) holds at most
  ``buffer_size`` items in size buckets whose boundaries are fitted to the sizes seen so far
  (refitted as the stream grows, up to 65,536 sizes) or given; a bucket emits a batch as soon as
  it is full, the fullest bucket emits when the buffer is full, and the rest is planned sorted
  at the end. Memory: ``buffer_size`` items.

The returned :class:`BatchStream` has a :attr:`~BatchStream.summary` (items read and emitted,
batches, skipped items, padding efficiency so far) and ``state_dict()``/``load_state_dict()``:
the state records how many source items were read and the positions of the items read but not
yet emitted (at most ``buffer_size`` plus one chunk, stored as runs). A restarted stream reads
the source again from its start, skips what was emitted, re-buffers what was not, and continues:
**exact when the source replays the same items in the same order**; a state of other options or
of another source (its last item read measures otherwise) is refused.

Data-parallel training and DataLoader workers: see :class:`StreamDataset` and
:func:`equal_steps` (in :mod:`fitbatch.streaming._parallel`, imported on first use:
:func:`batch_stream` alone never imports torch).

>>> stream = batch_stream([6, 10, 7, 57, 9, 7, 10], sizeof=int, budget=60, cost="sum")
>>> list(stream)
[[6, 10, 7], [57], [9, 7, 10]]
>>> stream.summary.batches, stream.summary.items_emitted
(3, 7)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitbatch.streaming._rounds import StreamSummary
from fitbatch.streaming._sizeof import PerChunk, per_chunk
from fitbatch.streaming._stream import BatchStream, batch_stream

if TYPE_CHECKING:  # imported lazily below: StreamDataset subclasses torch's IterableDataset
    from fitbatch.streaming._parallel import (
        EqualSteps,
        EqualStepsSummary,
        StreamDataset,
        StreamShard,
        equal_steps,
    )

# Names from fitbatch.streaming._parallel, which imports torch (seconds): loaded on first use, so
# that batch_stream alone never imports torch.
_LAZY = frozenset({"EqualSteps", "EqualStepsSummary", "StreamDataset", "StreamShard", "equal_steps"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from fitbatch.streaming import _parallel

        return getattr(_parallel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchStream",
    "EqualSteps",
    "EqualStepsSummary",
    "PerChunk",
    "StreamDataset",
    "StreamShard",
    "StreamSummary",
    "batch_stream",
    "equal_steps",
    "per_chunk",
]
