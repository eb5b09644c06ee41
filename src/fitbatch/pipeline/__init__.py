"""Batch pipelines: an endless source, transforms and batching, prepared in the background.

The shape of dpipe's ``batch_iter``, without its hangs: an :class:`Infinite` pipes items from a
source through transforms (plain functions, :class:`Threads`, :class:`Processes`), groups them
by a fixed size, a ``should_add(batch, item)`` predicate or a :class:`Budget`, combines each
batch (:func:`combine_to_arrays`, :func:`combine_pad`, ...) and yields ``batches_per_epoch``
batches per call while the next ones are prepared. Any exception in a stage reaches the
consumer as itself, with a note naming the stage; ``close()`` (or leaving ``with``) stops every
thread and kills every worker process within seconds, and so does the interpreter's exit.

>>> import numpy as np
>>> data = [(np.full((2, n), n), n % 2) for n in (3, 1, 2)]
>>> with Infinite(sample(data, seed=0), batch_size=4, batches_per_epoch=2,
...               combiner=combine_pad) as batches:
...     for epoch in range(2):
...         print([(xs.shape, ys.shape) for xs, ys in batches()])
[((4, 2, 3), (4,)), ((4, 2, 3), (4,))]
[((4, 2, 3), (4,)), ((4, 2, 3), (4,))]
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, cast

from fitbatch._validate import positive_int
from fitbatch.pipeline._batching import Budget, resolve_rule
from fitbatch.pipeline._combiners import (
    combine_batches,
    combine_pad,
    combine_to_arrays,
    combine_to_tensors,
)
from fitbatch.pipeline._runtime import END, Failure, Runtime, annotate
from fitbatch.pipeline._sources import sample
from fitbatch.pipeline._transforms import (
    Loky,
    Parallel,
    Processes,
    Threads,
    apply_at,
    describe,
    unpack_args,
)

__all__ = [
    "Budget",
    "Infinite",
    "Loky",
    "Processes",
    "Threads",
    "apply_at",
    "combine_batches",
    "combine_pad",
    "combine_to_arrays",
    "combine_to_tensors",
    "sample",
    "unpack_args",
]

logger = logging.getLogger(__name__)

# How long close() waits for the stage threads; process workers are killed at once.
CLOSE_TIMEOUT = 2.0


class Infinite:
    """Yield ``batches_per_epoch`` batches per call from an endless, background pipeline.

    Items flow from ``source`` through ``transforms`` in order, are grouped into batches by
    ``batch_size`` and combined by ``combiner``; background threads keep up to ``buffer_size``
    items (or batches) ready between stages. The pipeline starts at the first call (or
    ``with``) and runs across epochs: each call continues the same stream, so breaking out of
    an epoch early loses nothing, and the next call goes on from there.

    The source may be an infinite iterator (:func:`sample`, a generator), or a re-iterable
    (list, range, dataset), which is iterated again each time it ends. A one-shot iterator
    that ends makes its epoch end early (logged, with its partial last batch), and the next
    call raise.

    Close the pipeline with :meth:`close` or ``with``. A forgotten one is closed when it is
    garbage collected or at interpreter exit, which then is not delayed: threads are daemons
    and worker processes are killed.

    Args:
        source: where items come from (see above).
        *transforms: plain functions ``item -> item`` (each runs in its own thread),
            :class:`Threads` or :class:`Processes`.
        batch_size: an int; a ``should_add(batch, item) -> bool`` function (dpipe's rule: the
            item starts a new batch when it returns false; ``batch`` is the list so far); or a
            :class:`Budget`.
        batches_per_epoch: batches yielded by each call.
        combiner: ``combiner(list_of_items) -> batch``; :func:`combine_to_arrays` by default.
        buffer_size: items kept ready between two stages, and batches kept ready for the
            consumer.

    Raises:
        TypeError, ValueError: for invalid arguments, here. Errors of the stages are raised by
            the epoch iterator, with their own type.

    >>> with Infinite(range(7), batch_size=3, batches_per_epoch=2, combiner=list) as batches:
    ...     list(batches()), list(batches())
    ([[0, 1, 2], [3, 4, 5]], [[6, 0, 1], [2, 3, 4]])
    """

    def __init__(
        self,
        source: Iterable[Any],
        *transforms: Callable[[Any], Any] | Parallel,
        batch_size: int | Callable[[list[Any], Any], bool] | Budget,
        batches_per_epoch: int,
        combiner: Callable[[list[Any]], Any] = combine_to_arrays,
        buffer_size: int = 1,
    ) -> None:
        try:
            iter(source)
        except TypeError:
            raise TypeError(
                f"source must be iterable (an iterator, a sequence, a dataset), got {source!r}"
            ) from None
        for i, step in enumerate(transforms, 1):
            if not (isinstance(step, Parallel) or callable(step)):
                raise TypeError(
                    f"transform {i} must be a function, Threads(...) or Processes(...), got {step!r}"
                )
        if not callable(combiner):
            raise TypeError(
                f"combiner must be a function batch -> combined batch, got {combiner!r}"
            )
        self._batching = resolve_rule(batch_size)
        self.batches_per_epoch = cast(int, positive_int("batches_per_epoch", batches_per_epoch))
        self.buffer_size = cast(int, positive_int("buffer_size", buffer_size))
        self._source = source
        self._transforms = list(transforms)
        self._combiner = combiner
        self._runtime: Runtime | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self._ran_dry = False
        self._epoch = 0

    @property
    def epoch(self) -> int:
        """The number of epochs started so far."""
        return self._epoch

    def __call__(self) -> Iterator[Any]:
        """Start the next epoch: an iterator over its ``batches_per_epoch`` batches.

        Raises:
            RuntimeError: once closed, after a stage failed, or after a one-shot source ended.
        """
        runtime = self._start()
        self._epoch += 1
        return self._batches(runtime, self._epoch)

    def __iter__(self) -> Iterator[Any]:
        return self()

    def __len__(self) -> int:
        return self.batches_per_epoch

    def close(self) -> None:
        """Stop all threads and kill all worker processes (idempotent)."""
        self._closed = True
        self._stop_runtime()

    def _stop_runtime(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Infinite:
        self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        steps = ", ".join(
            repr(s) if isinstance(s, Parallel) else describe(s) for s in self._transforms
        )
        state = (
            "closed" if self._closed
            else "failed" if self._failure is not None
            else "ran dry" if self._ran_dry
            else "running" if self._runtime
            else "not started"
        )  # fmt: skip
        return f"<Infinite {state}: {type(self._source).__name__} -> [{steps}], {self.batches_per_epoch} batches per epoch>"

    def _start(self) -> Runtime:
        if self._closed:
            raise RuntimeError("this Infinite is closed; create a new one")
        if self._failure is not None:
            raise RuntimeError(
                f"this Infinite stopped after a stage raised {type(self._failure).__name__}; create a new one"
            ) from self._failure
        if self._ran_dry:
            raise RuntimeError(
                "the source iterator ended in an earlier epoch; pass a re-iterable (list, range, "
                "dataset), which is cycled, or an infinite iterator such as sample(...)"
            )
        if self._runtime is None:
            runtime = Runtime(
                self._source, self._transforms, self._batching, self._combiner, self.buffer_size
            )
            self._runtime = runtime
            self._finalizer = weakref.finalize(self, runtime.close, CLOSE_TIMEOUT)
            self._finalizer.atexit = False  # _shutdown closes it earlier, before the pools' hooks
        return self._runtime

    def _batches(self, runtime: Runtime, epoch: int) -> Iterator[Any]:
        for count in range(self.batches_per_epoch):
            if self._closed or self._failure is not None:
                raise RuntimeError("this Infinite was closed during the epoch")
            if epoch != self._epoch:
                raise RuntimeError(
                    f"epoch {epoch} was abandoned for epoch {self._epoch}; iterate one epoch at a time"
                )
            message = runtime.get()
            if isinstance(message, Failure):
                self._failure = annotate(message.error, message.stage)
                self._stop_runtime()
                raise self._failure
            if message is END:
                self._ran_dry = True
                logger.warning(
                    "the source iterator ended: epoch %d has %d of %d batches; later epochs raise",
                    epoch,
                    count,
                    self.batches_per_epoch,
                )
                self._stop_runtime()
                return
            yield message
