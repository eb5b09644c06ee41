"""Transforms: argument helpers (``unpack_args``, ``apply_at``) and parallel stages.

``Threads`` and ``Processes`` are configuration; the pipeline builds their worker pools when it
starts and kills them when it closes. A pool runs ``fn`` on one item per call and returns a
``concurrent.futures.Future``; the pipeline bounds how many calls are in flight.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import numbers
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, cast

from fitbatch._validate import choice, positive_int
from fitbatch.pipeline import _shutdown

logger = logging.getLogger("fitbatch.pipeline")

BACKENDS = ("auto", "loky", "stdlib")
_POLL = 0.05


def describe(fn: Any) -> str:
    """A short name for a function in messages: its qualified name, else its repr."""
    return getattr(fn, "__qualname__", None) or repr(fn)


def _check_callable(name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be callable, got {fn!r}")


class _UnpackArgs:
    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, item: Sequence[Any]) -> Any:
        return self.fn(*item, *self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"unpack_args({describe(self.fn)})"


def unpack_args(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Callable[[Sequence[Any]], Any]:
    """Call ``fn(*item, *args, **kwargs)``: a transform for functions of several arguments.

    Args:
        fn: the function; ``args`` and ``kwargs`` are passed after the item's components.

    Returns:
        A picklable transform (usable in :class:`Processes` when ``fn`` is picklable).

    >>> unpack_args(lambda image, label, k: (image * k, label), k=10)((2, "cat"))
    (20, 'cat')
    """
    _check_callable("unpack_args(fn)", fn)
    return _UnpackArgs(fn, args, kwargs)


class _ApplyAt:
    def __init__(
        self,
        index: tuple[int, ...],
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.index, self.fn, self.args, self.kwargs = index, fn, args, kwargs

    def __call__(self, item: Sequence[Any]) -> tuple[Any, ...]:
        n = len(item)
        for i in self.index:
            if not -n <= i < n:
                raise IndexError(
                    f"apply_at index {i} is out of range for an item of {n} components"
                )
        chosen = {i % n for i in self.index}
        return tuple(
            self.fn(x, *self.args, **self.kwargs) if i in chosen else x for i, x in enumerate(item)
        )

    def __repr__(self) -> str:
        return f"apply_at({list(self.index)}, {describe(self.fn)})"


def apply_at(
    index: int | Sequence[int], fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """Apply ``fn(component, *args, **kwargs)`` to the components at ``index``; keep the rest.

    Args:
        index: one position or several (negative counts from the end).
        fn: the function applied to each chosen component.

    Returns:
        A picklable transform returning a tuple.

    Raises:
        TypeError: when ``index`` is not an int or a sequence of ints.

    >>> apply_at(0, pow, 2)((3, "label"))
    (9, 'label')
    """
    indices = (
        (index,)
        if isinstance(index, numbers.Integral)
        else tuple(index)
        if isinstance(index, Sequence)
        else ()
    )
    if not indices or any(
        isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in indices
    ):
        raise TypeError(
            f"apply_at index must be an int or a non-empty sequence of ints, got {index!r}"
        )
    _check_callable("apply_at(fn)", fn)
    return _ApplyAt(tuple(int(i) for i in indices), fn, args, kwargs)


class Pool(Protocol):
    """Workers that run the stage's function on one item per call."""

    def submit(self, item: Any) -> Future[Any]: ...

    def kill(self, deadline: float) -> list[str]:
        """Stop the workers by ``deadline`` (``time.monotonic``); name those still running."""


class Parallel:
    """Base of :class:`Threads` and :class:`Processes`: ``fn`` on each item, several at once.

    Subclasses set ``where`` (for messages) and implement :meth:`pool`.
    """

    where = "worker"

    def __init__(
        self,
        fn: Callable[[Any], Any],
        n_workers: int = 1,
        *,
        ordered: bool = True,
        max_in_flight: int | None = None,
    ) -> None:
        _check_callable(f"{type(self).__name__}(fn)", fn)
        self.fn = fn
        self.n_workers = cast(int, positive_int("n_workers", n_workers))
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be True or False, got {ordered!r}")
        self.ordered = ordered
        limit = positive_int("max_in_flight", max_in_flight, allow_none=True)
        if limit is not None and limit < self.n_workers:
            raise ValueError(
                f"max_in_flight must be >= n_workers ({self.n_workers}) to keep every worker busy, got {limit}"
            )
        self.max_in_flight = 2 * self.n_workers if limit is None else limit

    def pool(self, name: str) -> Pool:
        raise NotImplementedError

    def __repr__(self) -> str:
        order = "" if self.ordered else ", ordered=False"
        return f"{type(self).__name__}({describe(self.fn)}, n_workers={self.n_workers}{order})"


class Threads(Parallel):
    """Run a transform in ``n_workers`` threads (for I/O, sleeps and GIL-releasing code).

    Results keep the input order unless ``ordered=False`` (then: completion order). At most
    ``max_in_flight`` items (default ``2 * n_workers``) are being transformed or waiting to be
    passed on. The threads are daemons and end when the pipeline closes.

    Args:
        fn: ``fn(item) -> item``.
        n_workers: the number of threads.
        ordered: keep the input order (default) or pass results on as they complete.
        max_in_flight: the bound on items inside the stage, >= ``n_workers``.

    >>> from fitbatch.pipeline import Infinite, combine_batches
    >>> with Infinite(range(4), Threads(abs, n_workers=2), batch_size=2, batches_per_epoch=2,
    ...               combiner=combine_batches) as batches:
    ...     list(batches())
    [(0, 1), (2, 3)]
    """

    where = "thread"

    def pool(self, name: str) -> Pool:
        return _ThreadPool(self.fn, self.n_workers, name)


class Processes(Parallel):
    """Run a transform in ``n_workers`` processes (for CPU-bound Python code).

    Uses loky when it is installed (``pip install 'fitbatch[pipeline]'``), else the standard
    library's ``ProcessPoolExecutor`` with the ``spawn`` start method. The function and the
    items must be picklable: with loky, lambdas and local functions work (cloudpickle); with
    the standard library, ``fn`` must be importable (defined at module level) and the main
    script needs an ``if __name__ == "__main__":`` guard. Workers are killed when the pipeline
    closes or the interpreter exits, even in the middle of a call. An error ``fn`` raises
    arrives with its own type, unless it cannot be pickled (or unpickled): then as a
    ``RuntimeError`` naming the stage and the error's type and message, with the worker's
    traceback. ``Loky`` is another name.

    Args:
        fn: ``fn(item) -> item``, sent to the workers with each item.
        n_workers: the number of processes.
        backend: ``"auto"`` (loky if importable), ``"loky"`` or ``"stdlib"``.
        **options: as for every parallel stage: ``ordered`` keeps the input order (default)
            or passes results on as they complete; ``max_in_flight`` bounds the items inside
            the stage (>= ``n_workers``).

    Raises:
        TypeError: when ``fn`` cannot be pickled by the chosen backend.
        ImportError: for ``backend="loky"`` without loky.

    >>> from fitbatch.pipeline import Infinite, combine_batches
    >>> with Infinite(range(4), Processes(abs), batch_size=2, batches_per_epoch=1,
    ...               combiner=combine_batches) as batches:
    ...     list(batches())
    [(0, 1)]
    """

    where = "process"

    def __init__(self, fn: Callable[[Any], Any], n_workers: int = 1, *, backend: str = "auto", **options: Any) -> None:
        # options: ``ordered`` and ``max_in_flight``, as for every Parallel stage
        super().__init__(fn, n_workers, **options)
        self.backend = _resolve_backend(choice("backend", backend, BACKENDS))
        _check_picklable(fn, self.backend)

    def pool(self, name: str) -> Pool:
        return _ProcessPool(_Portable(self.fn, name.removeprefix("pipeline-"), self.backend), self.n_workers, self.backend)


#: dpipe's name for :class:`Processes`.
Loky = Processes


def _resolve_backend(backend: str) -> str:
    if backend == "stdlib":
        return backend
    try:
        import loky  # noqa: F401
    except ImportError:
        if backend == "loky":
            raise ImportError(
                "Processes(backend='loky') needs loky: pip install 'fitbatch[pipeline]'"
            ) from None
        return "stdlib"
    return "loky"


def _dumps(backend: str) -> Callable[[Any], bytes]:
    """How ``backend`` pickles what it sends between processes."""
    if backend == "loky":
        try:
            import cloudpickle

            return cast("Callable[[Any], bytes]", cloudpickle.dumps)
        except ImportError:  # pragma: no cover - loky depends on cloudpickle
            pass
    return pickle.dumps


def _check_picklable(fn: Any, backend: str) -> None:
    dumps = _dumps(backend)
    try:
        dumps(fn)
    except Exception as error:
        way_out = (
            "define it at module level"
            if backend == "stdlib"
            else "avoid capturing locks, files or generators"
        )
        raise TypeError(
            f"Processes needs a picklable function; {describe(fn)} is not ({error}); {way_out}"
        ) from error


class _Portable:
    """The stage function as a worker process runs it: an exception that would not survive the
    way back to the main process (it does not pickle, or would not unpickle: the pool would
    report only a broken pool) is replaced by a ``RuntimeError`` that names the stage, the
    original type and message, and carries the worker's traceback as text."""

    def __init__(self, fn: Callable[[Any], Any], stage: str, backend: str) -> None:
        self.fn, self.stage, self.backend = fn, stage, backend

    def __call__(self, item: Any) -> Any:
        try:
            return self.fn(item)
        except Exception as error:
            why = _not_portable(error, self.backend)
            if why is None:
                raise
            kind = f"{type(error).__module__}.{type(error).__qualname__}"
            raise RuntimeError(
                f"pipeline stage {self.stage}, in worker process {os.getpid()}, raised {kind}: {error}\n"
                f"(this RuntimeError stands in for it: it cannot be sent back to the main process, "
                f"{why})\nThe worker's traceback:\n" + "".join(traceback.format_exception(error)).rstrip()
            ) from None


def _not_portable(error: BaseException, backend: str) -> str | None:
    """Why ``error`` cannot travel from a worker to the main process, or ``None`` if it can."""
    try:
        data = _dumps(backend)(error)
    except Exception as exc:
        return f"pickling it fails: {type(exc).__name__}: {exc}"
    try:
        pickle.loads(data)
    except Exception as exc:
        return f"unpickling it fails: {type(exc).__name__}: {exc}"
    return None


class _ThreadPool:
    def __init__(self, fn: Callable[[Any], Any], n: int, name: str) -> None:
        self._fn = fn
        self._tasks: queue.SimpleQueue[tuple[Future[Any], Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"fitbatch-{name}-{i}", daemon=True)
            for i in range(n)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, item: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._tasks.put((future, item))
        return future

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                future, item = self._tasks.get(timeout=_POLL)
            except queue.Empty:
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._fn(item))
            except BaseException as error:  # handed to the consumer through the future
                future.set_exception(error)

    def kill(self, deadline: float) -> list[str]:
        self._stop.set()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]


class _ProcessPool:
    def __init__(self, fn: Callable[[Any], Any], n: int, backend: str) -> None:
        self._fn = fn
        self._backend = backend
        self._executor: concurrent.futures.Executor
        if backend == "loky":
            from loky import ProcessPoolExecutor

            self._executor = ProcessPoolExecutor(max_workers=n)
        else:
            import concurrent.futures.process  # registers its exit hook before ours

            self._executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=n, mp_context=multiprocessing.get_context("spawn")
            )
        # The first submission starts the workers and the pool's manager thread, which is when
        # the pool registers its exit hook; ours must come after it to run before it.
        self._executor.submit(int)
        _shutdown.hook_after()

    def submit(self, item: Any) -> Future[Any]:
        return self._executor.submit(self._fn, item)

    def kill(self, deadline: float) -> list[str]:
        executor: Any = self._executor
        manager = getattr(executor, "_executor_manager_thread", None)
        if self._backend == "loky":
            executor.shutdown(wait=False, kill_workers=True)
            processes = []
        else:
            # The standard library cannot kill running calls: terminate its workers ourselves.
            processes = list((getattr(executor, "_processes", None) or {}).values())
            for process in processes:
                process.terminate()
            executor.shutdown(wait=False, cancel_futures=True)
        for waitable in [*processes, *([manager] if manager is not None else [])]:
            waitable.join(max(0.0, deadline - time.monotonic()))
        alive = [p for p in processes if p.is_alive()] + (
            [manager] if manager is not None and manager.is_alive() else []
        )
        return [f"{self._backend} {getattr(w, 'name', w)}" for w in alive]
