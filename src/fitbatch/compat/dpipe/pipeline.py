"""``dpipe.batch_iter.pipeline`` on :mod:`fitbatch.pipeline`'s stages and threads.

* :class:`Infinite` — :class:`fitbatch.pipeline.Infinite` with dpipe's signature: extra keywords
  go to the combiner, ``Iterator`` stages (and :class:`~fitbatch.compat.dpipe.ExpirationPool`)
  are accepted, and a closed one starts again when called, as in dpipe.
* :func:`Threads`, :func:`Loky` — :class:`fitbatch.pipeline.Threads` / ``Processes`` running
  ``func(item, *args, **kwargs)``.
* :class:`Iterator` — a stage that transforms the whole stream (``transform(items) -> items``),
  run in its own background thread(s).
* :func:`wrap_pipeline` — a finite pipeline over ``source``: iterate it (or use ``with``) to
  get every transformed item once.
* :func:`combine_batches`, :func:`combine_to_arrays`, :func:`combine_pad` — dpipe's combiners:
  items are zipped component by component (``[(x, y), (x, y)] -> ((x, x), (y, y))``).

>>> from fitbatch.compat.dpipe.pipeline import wrap_pipeline
>>> list(wrap_pipeline(range(4), lambda x: x * 10))
[0, 10, 20, 30]
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Iterator as _Iter
from types import TracebackType
from typing import Any

import numpy as np

from fitbatch import pipeline
from fitbatch.compat.dpipe.utils import pad_batch_equal
from fitbatch.pipeline._batching import resolve_rule
from fitbatch.pipeline._runtime import END, POLL, Failure, Runtime, annotate
from fitbatch.pipeline._sources import endless

__all__ = [
    "Infinite",
    "Iterator",
    "Loky",
    "Threads",
    "combine_batches",
    "combine_pad",
    "combine_to_arrays",
]

CLOSE_TIMEOUT = 2.0


def combine_batches(inputs: Iterable[Any]) -> tuple[Any, ...]:
    """Zip the items component by component: ``[(x, y), (x, y)] -> ((x, x), (y, y))``.

    Raises:
        ValueError: items of different lengths.

    >>> combine_batches([(1, "a"), (2, "b")])
    ((1, 2), ('a', 'b'))
    """
    items = list(inputs)
    lengths = [_length(x) for x in items]
    known = [n for n in lengths if n is not None]
    if known and any(n != known[0] for n in known):
        shown = ", ".join("?" if n is None else str(n) for n in lengths)
        raise ValueError(f"The arguments have different lengths: {shown}.")
    try:
        return tuple(zip(*items, strict=True))
    except ValueError:
        raise ValueError("The iterables did not exhaust simultaneously.") from None


def _length(item: Any) -> int | None:
    try:
        return len(item)
    except TypeError:
        return None


def combine_to_arrays(inputs: Iterable[Any]) -> tuple[np.ndarray, ...]:
    """:func:`combine_batches`, each component stacked into a numpy array.

    >>> xs, ys = combine_to_arrays([([1, 2], 0), ([3, 4], 1)])
    >>> xs.shape, ys
    ((2, 2), array([0, 1]))
    """
    return tuple(np.array(column) for column in combine_batches(inputs))


def combine_pad(inputs: Iterable[Any], padding_values: Any = 0, ratio: Any = 0.5) -> tuple[np.ndarray, ...]:
    """:func:`combine_batches`, each component padded to its largest shape and stacked.

    Args:
        inputs: the items of a batch.
        padding_values: the fill value, a function ``array -> value``, or one per component.
        ratio: the share of the padding put before the data (a number or one per axis).

    >>> xs, ys = combine_pad([([1, 2, 3], 0), ([4], 1)])
    >>> xs
    array([[1, 2, 3],
           [0, 4, 0]])
    """
    columns = combine_batches(inputs)
    values = np.broadcast_to(np.asarray(padding_values, dtype=object), [len(columns)])
    return tuple(pad_batch_equal(column, value, ratio) for column, value in zip(columns, values))


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


def _counts(n_workers: Any, buffer_size: Any) -> None:
    for name, value in (("n_workers", n_workers), ("buffer_size", buffer_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def Threads(  # noqa: N802 - dpipe's name
    func: Callable[..., Any], *args: Any, n_workers: int = 1, buffer_size: int = 1, **kwargs: Any
) -> pipeline.Threads:
    """``func(item, *args, **kwargs)`` in ``n_workers`` threads (:class:`fitbatch.pipeline.Threads`).

    >>> Threads(pow, 2, n_workers=2).fn(3)
    9
    """
    _counts(n_workers, buffer_size)
    return pipeline.Threads(_bound(func, args, kwargs), n_workers, max_in_flight=n_workers + buffer_size)


def Loky(  # noqa: N802 - dpipe's name
    func: Callable[..., Any], *args: Any, n_workers: int = 1, buffer_size: int = 1, **kwargs: Any
) -> pipeline.Processes:
    """``func(item, *args, **kwargs)`` in ``n_workers`` processes (:class:`fitbatch.pipeline.Processes`).

    A negative ``n_workers`` counts from the number of CPUs, as in dpipe (-1: all of them).

    >>> Loky(divmod, 3, n_workers=-1).n_workers == (os.cpu_count() or 1)
    True
    """
    if isinstance(n_workers, int) and not isinstance(n_workers, bool) and n_workers < 0:
        n_workers = max(1, (os.cpu_count() or 1) + n_workers + 1)
    _counts(n_workers, buffer_size)
    return pipeline.Processes(_bound(func, args, kwargs), n_workers, max_in_flight=n_workers + buffer_size)


class Iterator:
    """A stage that transforms the stream: ``transform(items, *args, **kwargs)`` yields new items.

    It runs in a background thread of the pipeline; with ``n_workers > 1``, ``n_workers`` copies
    of ``transform`` share the incoming items, each in its own thread (their outputs are merged
    as they come). ``buffer_size`` items are kept ready after it.

    >>> def pairs(items):
    ...     items = iter(items)
    ...     for first in items:
    ...         yield first, next(items, None)
    >>> list(wrap_pipeline(range(5), Iterator(pairs)))
    [(0, 1), (2, 3), (4, None)]
    """

    def __init__(self, transform: Callable[..., Iterable[Any]], *args: Any, n_workers: int = 1, buffer_size: int = 1, **kwargs: Any) -> None:
        if not callable(transform):
            raise TypeError(f"transform must be callable, got {transform!r}")
        _counts(n_workers, buffer_size)
        self.transform, self.args, self.kwargs = transform, args, kwargs
        self.n_workers, self.buffer_size = n_workers, buffer_size

    def _run(self, stream: Iterable[Any], started: list[Runtime]) -> Iterable[Any]:
        if self.n_workers == 1:
            return self.transform(stream, *self.args, **self.kwargs)  # type: ignore[no-any-return]
        shared = _Shared(stream)
        runtimes = [_runtime(self.transform(shared, *self.args, **self.kwargs), [], self.buffer_size, started) for _ in range(self.n_workers)]
        return _merge(runtimes)

    def __repr__(self) -> str:
        return f"Iterator({getattr(self.transform, '__qualname__', self.transform)!r}, n_workers={self.n_workers})"


class _Shared(_Iter[Any]):
    """One iterator read by several threads."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._items, self._lock = iter(items), threading.Lock()

    def __next__(self) -> Any:
        with self._lock:
            return next(self._items)


def _only(batch: list[Any]) -> Any:
    return batch[0]


def _runtime(stream: Iterable[Any], steps: list[Any], buffer_size: int, started: list[Runtime]) -> Runtime:
    """A fitbatch pipeline runtime passing items one by one (batches of one, unwrapped)."""
    runtime = Runtime(stream, steps, resolve_rule(1), _only, buffer_size)
    started.append(runtime)
    return runtime


def _drain(runtime: Runtime) -> _Iter[Any]:
    while True:
        message = runtime.get()
        if message is END:
            return
        if isinstance(message, Failure):
            raise annotate(message.error, message.stage)
        yield message


def _merge(runtimes: list[Runtime]) -> _Iter[Any]:
    live = list(runtimes)
    while live:
        for runtime in list(live):
            try:
                message = runtime.outbox.get(timeout=POLL / len(live))
            except queue.Empty:
                if runtime.stop.is_set():
                    raise RuntimeError("the pipeline was closed while an item was awaited") from None
                continue
            if message is END:
                live.remove(runtime)
            elif isinstance(message, Failure):
                raise annotate(message.error, message.stage)
            else:
                yield message


def _chain(stream: Iterable[Any], stages: Sequence[Any], buffer_size: int, started: list[Runtime], *, last: bool) -> Iterable[Any]:
    """Run ``stages`` over ``stream``: item stages in fitbatch runtimes, an ``Iterator`` stage in
    the thread that reads it (the next runtime's source thread). With ``last``, a final runtime
    reads the end of the chain; without it, the caller's thread does."""
    pending: list[Any] = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, Iterator):
            pending.append(stage)
            continue
        if i:  # each stream stage in a thread of its own
            stream = _drain(_runtime(stream, pending, buffer_size, started))
            pending = []
        stream = stage._run(stream, started)
    if pending or last:
        stream = _drain(_runtime(stream, pending, buffer_size, started))
    return stream


def _close(started: list[Runtime]) -> None:
    # every stop first: a stage blocked on the runtime before it then ends at once
    for runtime in started:
        runtime.stop.set()
    for runtime in started:
        runtime.close(CLOSE_TIMEOUT)


class Pipeline:
    """A finite pipeline (:func:`wrap_pipeline`): iterate it, or use ``with`` and iterate.

    It starts on ``with`` or the first ``iter()``; the items come once, and the pipeline closes
    when the source is exhausted or a stage raised (the error is raised here, as itself).
    ``close()`` stops every thread and worker process. Iterated again after it closed, it starts
    over from the source.
    """

    def __init__(self, source: Iterable[Any], stages: Sequence[Any], buffer_size: int) -> None:
        self._source, self._stages, self._buffer = source, list(stages), buffer_size
        self._started: list[Runtime] | None = None
        self._stream: _Iter[Any] = iter(())

    @property
    def pipeline_active(self) -> bool:
        return self._started is not None

    def _start(self) -> None:
        if self._started is None:
            started: list[Runtime] = []
            try:
                self._stream = iter(_chain(iter(self._source), self._stages, self._buffer, started, last=True))
            except BaseException:
                _close(started)
                raise
            self._started = started
            weakref.finalize(self, _close, started)

    def __iter__(self) -> _Iter[Any]:
        self._start()
        try:
            yield from self._stream
        except GeneratorExit:  # a loop left early: the pipeline stays open for the next one
            raise
        except BaseException:
            self.close()
            raise
        self.close()

    def close(self) -> None:
        """Stop every thread and worker process (idempotent)."""
        if self._started is not None:
            started, self._started = self._started, None
            _close(started)

    def __enter__(self) -> Pipeline:
        self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def wrap_pipeline(source: Iterable[Any], *transformers: Any, buffer_size: int = 1) -> Pipeline:
    """``source`` through ``transformers`` (functions, :func:`Threads`, :func:`Loky`, :class:`Iterator`).

    >>> with wrap_pipeline(range(3), Threads(abs), lambda x: -x) as items:
    ...     list(items)
    [0, -1, -2]
    """
    _counts(1, buffer_size)
    for step in transformers:
        if not isinstance(step, (Iterator, pipeline.Parallel)) and not callable(step):
            raise TypeError(f"each transformer must be a function, Threads, Loky or Iterator, got {step!r}")
    return Pipeline(source, transformers, buffer_size)


class _StreamSource:
    """The stream stages of an :class:`Infinite` (up to its last ``Iterator``), as its source."""

    def __init__(self, source: Iterable[Any], stages: Sequence[Any], buffer_size: int) -> None:
        self._source, self._stages, self._buffer = source, list(stages), buffer_size
        self._runs: list[list[Runtime]] = []

    def __iter__(self) -> _Iter[Any]:
        started: list[Runtime] = []
        self._runs.append(started)
        try:
            yield from _chain(endless(self._source), self._stages, self._buffer, started, last=False)
        finally:
            _close(started)
            self._runs.remove(started)

    def close(self) -> None:
        for started in list(self._runs):
            _close(started)


class Infinite(pipeline.Infinite):
    """dpipe's ``Infinite``: :class:`fitbatch.pipeline.Infinite`, extra keywords go to ``combiner``.

    Args:
        source: an endless iterable (:func:`~fitbatch.compat.dpipe.sample`) or a re-iterable,
            cycled.
        *transformers: functions ``item -> item``, :func:`Threads`, :func:`Loky`, or
            :class:`Iterator` stages.
        batch_size: an int, or ``should_add(batch, item) -> bool``.
        batches_per_epoch: batches per call.
        buffer_size: items (or batches) kept ready between stages.
        combiner: ``list of items -> batch`` (:func:`combine_to_arrays` by default), or a
            :func:`Threads`/:func:`Loky` of one (its function runs in the combiner thread).
        **kwargs: passed to ``combiner`` (``combiner(batch, **kwargs)``).

    >>> with Infinite(range(5), batch_size=2, batches_per_epoch=2, combiner=list) as batches:
    ...     list(batches())
    [[0, 1], [2, 3]]
    """

    def __init__(
        self,
        source: Iterable[Any],
        *transformers: Any,
        batch_size: int | Callable[[list[Any], Any], bool],
        batches_per_epoch: int,
        buffer_size: int = 1,
        combiner: Any = combine_to_arrays,
        **kwargs: Any,
    ) -> None:
        if isinstance(combiner, pipeline.Parallel):
            if kwargs:
                raise ValueError("The `combiner` is already wrapped in a `Transform`, passing `kwargs` has no effect")
            combiner = combiner.fn
        elif kwargs:
            if not callable(combiner):
                raise TypeError(f"combiner must be a function batch -> combined batch, got {combiner!r}")
            combiner = functools.partial(combiner, **kwargs)
        cut = max((i + 1 for i, t in enumerate(transformers) if isinstance(t, Iterator)), default=0)
        self._streams = _StreamSource(source, transformers[:cut], buffer_size) if cut else None
        super().__init__(
            source if self._streams is None else self._streams,
            *transformers[cut:],
            batch_size=batch_size,
            batches_per_epoch=batches_per_epoch,
            combiner=combiner,
            buffer_size=buffer_size,
        )

    def _start(self) -> Runtime:
        if self._closed:  # dpipe builds a new pipeline when a closed one is called again
            self._closed, self._runtime, self._finalizer = False, None, None
        return super()._start()

    def _stop_runtime(self) -> None:
        if self._streams is not None:
            self._streams.close()
        super()._stop_runtime()

    @property
    def closing_callback(self) -> Any:
        """A Lightning ``Callback`` that closes this pipeline on teardown or on an exception."""
        from lightning.pytorch.callbacks import Callback

        owner = self

        class ClosingCallback(Callback):  # type: ignore[misc]
            def teardown(self, trainer: Any, pl_module: Any, stage: Any) -> None:
                owner.close()

            def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
                owner.close()

        return ClosingCallback()
