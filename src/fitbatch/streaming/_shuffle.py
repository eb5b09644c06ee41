"""Randomness of a seeded stream: a bounded shuffle buffer and a random emission order.

Both are functions of ``(seed, epoch)`` and of the source alone, so a restarted stream that reads
its source again replays the same shuffled order (the resume contract of
:mod:`fitbatch.streaming` holds over the shuffled positions):

* :func:`shuffled` reads the source in windows and yields each window drawn at random from the
  items held (at most ``buffer`` of them), so an item moves up to about ``buffer`` positions;
* :func:`emission_key` orders the batches a bucket round emits by a keyed hash of each batch's
  first position instead of by the position itself, so small and large batches interleave at
  random.

>>> import numpy as np

from fitbatch._rng import SeedLike, generator, resolve_seed
from fitbatch._validate import non_negative_int, positive_int
>>> from fitbatch import _rng
>>> list(shuffled(range(8), 4, _rng.generator(0, 0, "stream-shuffle")))
[1, 3, 0, 5, 4, 6, 7, 2]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from fitbatch._rng import SeedLike, generator, resolve_seed
from fitbatch._validate import non_negative_int, positive_int

_MASK = (1 << 64) - 1


def shuffled(items: Iterable[Any], buffer: int, rng: np.random.Generator) -> Iterator[Any]:
    """``items`` in a random order, holding at most ``buffer`` items (``buffer >= 2``).

    Every ``buffer // 2`` items read, the ``buffer // 2`` yielded next are drawn uniformly from
    all the items held; the source's end yields what is held in a random order.
    """
    window = max(1, buffer // 2)
    it = iter(items)
    held: list[Any] = []
    while True:
        chunk = list(itertools.islice(it, window))
        held.extend(chunk)
        if len(held) >= 2 * window or not chunk:
            perm = rng.permutation(len(held)).tolist()
            if not chunk:
                yield from map(held.__getitem__, perm)
                return
            yield from map(held.__getitem__, perm[:window])
            held = list(map(held.__getitem__, perm[window:]))


def emission_salt(seed: int, epoch: int) -> int:
    """The 64-bit salt of :func:`emission_key` for one (seed, epoch)."""
    return int(generator(seed, epoch, "stream-emission").integers(0, 1 << 63))


def emission_key(position: int, salt: int) -> int:
    """A keyed 64-bit hash of a stream position (splitmix64's finaliser over ``position ^ salt``).

    >>> emission_key(3, 1) == emission_key(3, 1), emission_key(3, 1) == emission_key(3, 2)
    (True, False)
    """
    z = ((position ^ salt) + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def shuffle_options(seed: SeedLike | bool, epoch: int, shuffle_buffer: int | None, buffer_size: int) -> dict[str, Any]:
    """The seed options of :func:`~fitbatch.batch_stream`, checked: none when ``seed is False``.

    >>> shuffle_options(7, 2, None, 100)
    {'seed': 7, 'epoch': 2, 'shuffle_buffer': 100}
    """
    if seed is False:
        if shuffle_buffer is not None:
            raise ValueError("shuffle_buffer= shuffles a seeded stream: pass seed= too (an int)")
        return {}
    if seed is True:
        raise TypeError("seed must be an int (or None for fresh entropy), got True; pass e.g. seed=0")
    window = positive_int("shuffle_buffer", shuffle_buffer, allow_none=True) or max(2, buffer_size)
    if window < 2:
        raise ValueError(f"shuffle_buffer must be at least 2 to shuffle anything, got {window}")
    return {"seed": resolve_seed(seed), "epoch": non_negative_int("epoch", epoch), "shuffle_buffer": window}


