"""``dpipe.batch_iter``'s pipeline API on :mod:`fitbatch.pipeline`.

Migrating: ``from dpipe.batch_iter import Infinite, sample, ...`` becomes
``from fitbatch.compat.dpipe import Infinite, sample, ...``; nothing else changes.

:func:`unpack_args`, :func:`apply_at`, :func:`combine_pad` and :func:`combine_to_arrays` are
fitbatch's own (same signatures and results). Three names keep dpipe's signatures over
fitbatch's: :class:`Infinite` passes extra keyword arguments to the combiner; :func:`Threads`
and :func:`Loky` pass extra arguments to the function (``func(item, *args, **kwargs)``) and take
``buffer_size``; :func:`sample` takes ``random_state``.

Deliberate differences from deep-pipe 0.5.0 (bugs not reproduced):

* Errors in a stage reach the consumer as themselves (with a note naming the stage) and
  ``close()`` stops every thread and worker process within seconds; dpipe can hang on a
  failing transform or at exit when a pipeline was not closed.
* :func:`sample` draws from a numpy ``Generator`` keyed by the seed (``random_state``: an int,
  ``None`` for fresh entropy kept in the iterator's ``seed``, or a ``RandomState`` from which
  one seed is drawn), never from global state, so its draws differ from dpipe's for the same
  number; invalid weights raise ``ValueError`` instead of failing an ``assert``.
* ``Loky`` falls back to the standard library's processes when loky is not installed.
* ``batch_size`` may also be a :class:`fitbatch.pipeline.Budget` (batches that fit a memory
  budget); ints and ``should_add(batch, item)`` functions behave as in dpipe (an empty batch
  always takes the item).

>>> import numpy as np
>>> from fitbatch.compat.dpipe import Infinite, apply_at, sample
>>> data = [(np.zeros((2, 2)), 0), (np.ones((2, 2)), 1)]
>>> with Infinite(sample(data, random_state=0), apply_at(0, np.multiply, 3),
...               batch_size=4, batches_per_epoch=2) as batch_iter:
...     [(xs.shape, ys.shape) for xs, ys in batch_iter()]
[((4, 2, 2), (4,)), ((4, 2, 2), (4,))]
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from fitbatch import pipeline
from fitbatch._rng import SeedLike
from fitbatch.pipeline import apply_at, combine_pad, combine_to_arrays, unpack_args

__all__ = [
    "Infinite",
    "Loky",
    "Threads",
    "apply_at",
    "combine_pad",
    "combine_to_arrays",
    "sample",
    "unpack_args",
]


class Infinite(pipeline.Infinite):
    """dpipe's ``Infinite``: :class:`fitbatch.pipeline.Infinite`, extra keywords go to ``combiner``.

    Args:
        source: an endless iterable (:func:`sample`) or a re-iterable, cycled.
        *transformers: functions ``item -> item``, :func:`Threads` or :func:`Loky`.
        batch_size: an int, or ``should_add(batch, item) -> bool``.
        batches_per_epoch: batches per call.
        buffer_size: items (or batches) kept ready between stages.
        combiner: ``list of items -> batch`` (:func:`combine_to_arrays` by default).
        **kwargs: passed to ``combiner`` (``combiner(batch, **kwargs)``).
    """

    def __init__(
        self,
        source: Iterable[Any],
        *transformers: Callable[[Any], Any] | pipeline.Threads | pipeline.Processes,
        batch_size: int | Callable[[list[Any], Any], bool],
        batches_per_epoch: int,
        buffer_size: int = 1,
        combiner: Callable[..., Any] = combine_to_arrays,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            if not callable(combiner):
                raise TypeError(f"combiner must be a function batch -> combined batch, got {combiner!r}")
            combiner = functools.partial(combiner, **kwargs)
        super().__init__(
            source,
            *transformers,
            batch_size=batch_size,
            batches_per_epoch=batches_per_epoch,
            combiner=combiner,
            buffer_size=buffer_size,
        )


class _Call:
    """``func(item, *args, **kwargs)`` as a picklable object (for worker processes)."""

    def __init__(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self.__qualname__ = getattr(func, "__qualname__", repr(func))

    def __call__(self, item: Any) -> Any:
        return self.func(item, *self.args, **self.kwargs)


def _bound(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[Any], Any]:
    if not callable(func):
        raise TypeError(f"func must be callable, got {func!r}")
    return _Call(func, args, kwargs) if (args or kwargs) else func


def _in_flight(n_workers: int, buffer_size: int) -> int:
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
    return n_workers + buffer_size


def Threads(  # noqa: N802 - dpipe's name
    func: Callable[..., Any], *args: Any, n_workers: int = 1, buffer_size: int = 1, **kwargs: Any
) -> pipeline.Threads:
    """``func(item, *args, **kwargs)`` in ``n_workers`` threads (:class:`fitbatch.pipeline.Threads`).

    >>> Threads(pow, 2, n_workers=2).fn(3)
    9
    """
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers must be an int >= 1, got {n_workers!r}")
    return pipeline.Threads(_bound(func, args, kwargs), n_workers, max_in_flight=_in_flight(n_workers, buffer_size))


def Loky(  # noqa: N802 - dpipe's name
    func: Callable[..., Any], *args: Any, n_workers: int = 1, buffer_size: int = 1, **kwargs: Any
) -> pipeline.Processes:
    """``func(item, *args, **kwargs)`` in ``n_workers`` processes (:class:`fitbatch.pipeline.Processes`).

    A negative ``n_workers`` counts from the number of CPUs, as in dpipe (-1: all of them).
    """
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers == 0:
        raise ValueError(f"n_workers must be a non-zero int, got {n_workers!r}")
    if n_workers < 0:
        n_workers = max(1, (os.cpu_count() or 1) + n_workers + 1)
    return pipeline.Processes(_bound(func, args, kwargs), n_workers, max_in_flight=_in_flight(n_workers, buffer_size))


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
