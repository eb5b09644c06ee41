"""The running pipeline: stage threads joined by bounded queues, and how it stops.

Every stage thread reads its inbox and writes its outbox; the last outbox holds combined
batches for the consumer. Three kinds of message travel besides items: ``END`` (a one-shot
source ran dry), a :class:`Failure` (an exception, with the stage it came from) and nothing
else. A stage that fails sends its ``Failure`` downstream and stops; the others pass it on, so
the consumer receives every batch completed before the error, then the error itself.

Every blocking call waits at most ``POLL`` seconds before checking the stop event, so
``close()`` ends all threads promptly unless user code itself blocks; process workers are
killed outright.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from fitbatch.pipeline import _shutdown
from fitbatch.pipeline._batching import BatchState
from fitbatch.pipeline._sources import endless
from fitbatch.pipeline._transforms import Parallel, Pool, describe

logger = logging.getLogger("fitbatch.pipeline")

POLL = 0.05


class Stopped(Exception):
    """Raised inside a stage when the pipeline is closing: the stage leaves its loop."""


class _End:
    def __repr__(self) -> str:
        return "END"


END = _End()


@dataclasses.dataclass
class Failure:
    """An exception raised in a stage, on its way to the consumer."""

    error: BaseException
    stage: str


def put(box: queue.Queue[Any], message: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise Stopped
        try:
            box.put(message, timeout=POLL)
            return
        except queue.Full:
            continue


def get(box: queue.Queue[Any], stop: threading.Event) -> Any:
    while True:
        if stop.is_set():
            raise Stopped
        try:
            return box.get(timeout=POLL)
        except queue.Empty:
            continue


def annotate(error: BaseException, stage: str) -> BaseException:
    """Add a note saying where ``error`` happened (once) and return it."""
    note = f"raised in fitbatch.pipeline stage {stage}"
    notes = getattr(error, "__notes__", [])
    if note not in notes:
        add_note = getattr(error, "add_note", None)
        if add_note is not None:
            add_note(note)
        else:  # pragma: no cover - Python 3.10 keeps the note without printing it
            error.__notes__ = [*notes, note]  # type: ignore[attr-defined]
    return error


class Runtime:
    """The threads, queues and pools of one started :class:`~fitbatch.pipeline.Infinite`."""

    def __init__(
        self,
        source: Iterable[Any],
        steps: list[Any],
        batching: Callable[[], BatchState],
        combiner: Callable[[list[Any]], Any],
        buffer_size: int,
    ) -> None:
        self.stop = threading.Event()
        self._buffer = buffer_size
        self._threads: list[threading.Thread] = []
        self._pools: list[Pool] = []
        self._closed = False
        try:
            box = self._spawn("source", _source_body, source)
            for i, step in enumerate(steps, 1):
                if isinstance(step, Parallel):
                    box = self._parallel(f"{i} {step!r}", step, box)
                else:
                    box = self._spawn(f"{i} {describe(step)}", _map_body, step, box)
            box = self._spawn("batching", _batch_body, batching, box)
            self.outbox = self._spawn(f"combiner {describe(combiner)}", _map_body, combiner, box)
        except BaseException:
            self.close(1.0)
            raise
        self._last = self._threads[-1]
        _shutdown.track(self)

    def _spawn(
        self,
        stage: str,
        body: Callable[..., None],
        *args: Any,
        outbox: queue.Queue[Any] | None = None,
    ) -> queue.Queue[Any]:
        if outbox is None:
            outbox = queue.Queue(self._buffer)
        thread = threading.Thread(
            target=_guarded,
            args=(stage, body, outbox, self.stop, *args),
            name=f"fitbatch-pipeline-{stage}",
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()
        return outbox

    def _parallel(self, stage: str, spec: Parallel, inbox: queue.Queue[Any]) -> queue.Queue[Any]:
        pool = spec.pool(f"pipeline-{stage}")
        self._pools.append(pool)
        # The feeder's outbox holds futures, in input order (ordered) or as they complete, and
        # the signals (END, failures: its own too); `slots` bounds the number of futures.
        futures: queue.Queue[Any] = queue.Queue()
        slots = _Slots(spec.max_in_flight, self.stop)
        self._spawn(f"{stage} feeder", _feed_body, pool, spec.ordered, slots, inbox, outbox=futures)
        return self._spawn(
            f"{stage} results", _emit_body, slots, futures, f"{stage} in a worker {spec.where}"
        )

    def get(self) -> Any:
        """The next message for the consumer: a batch, ``END`` or a :class:`Failure`."""
        while True:
            try:
                return self.outbox.get(timeout=POLL)
            except queue.Empty:
                if self.stop.is_set():
                    raise RuntimeError(
                        "the pipeline was closed while a batch was awaited"
                    ) from None
                if (
                    not self._last.is_alive()
                ):  # pragma: no cover - stages always report why they end
                    try:  # it may have put a last message between the timeout and the check
                        return self.outbox.get_nowait()
                    except queue.Empty:
                        raise RuntimeError(
                            "the pipeline's last stage stopped without a batch or an error"
                        ) from None

    def close(self, timeout: float, at_exit: bool = False) -> None:
        """Stop every stage and kill the pools; threads blocked in user code are left behind."""
        if self._closed:
            return
        self._closed = True
        self.stop.set()
        deadline = time.monotonic() + timeout
        stuck: list[str] = []
        for pool in self._pools:
            stuck += pool.kill(deadline)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck += [t.name for t in self._threads if t.is_alive()]
        if stuck:
            # At interpreter exit daemon threads simply vanish: nothing worth a warning.
            (logger.debug if at_exit else logger.warning)(
                "closing the pipeline left %d threads blocked in user code (daemons; they end when "
                "the call returns) or workers still stopping: %s",
                len(stuck),
                ", ".join(stuck),
            )
        _shutdown.untrack(self)


def _guarded(
    stage: str,
    body: Callable[..., None],
    outbox: queue.Queue[Any],
    stop: threading.Event,
    *args: Any,
) -> None:
    try:
        body(*args, outbox, stop)
    except Stopped:
        pass
    except BaseException as error:  # every error reaches the consumer, none ends a thread silently
        try:
            put(outbox, Failure(error, stage), stop)
        except Stopped:
            pass


def _source_body(source: Iterable[Any], outbox: queue.Queue[Any], stop: threading.Event) -> None:
    for item in endless(source):
        put(outbox, item, stop)
    put(outbox, END, stop)


def _drain(inbox: queue.Queue[Any], stop: threading.Event, each: Callable[[Any], None]) -> Any:
    """Call ``each`` on every item of ``inbox`` up to the first signal (a failure or the end); return it."""
    while True:
        message = get(inbox, stop)
        if isinstance(message, (Failure, _End)):
            return message
        each(message)


def _map_body(fn: Callable[[Any], Any], inbox: queue.Queue[Any], outbox: queue.Queue[Any], stop: threading.Event) -> None:
    signal = _drain(inbox, stop, lambda item: put(outbox, fn(item), stop))
    put(outbox, signal, stop)


def _batch_body(
    start: Callable[[], BatchState],
    inbox: queue.Queue[Any],
    outbox: queue.Queue[Any],
    stop: threading.Event,
) -> None:
    state = start()
    while True:
        message = get(inbox, stop)
        if isinstance(message, Failure):
            put(outbox, message, stop)
            return
        if message is END:
            rest = state.flush()
            if rest:
                put(outbox, rest, stop)
            put(outbox, END, stop)
            return
        for batch in state.push(message):
            put(outbox, batch, stop)


class _Slots:
    """A counter of items inside a parallel stage, with waits that give up on stop."""

    def __init__(self, limit: int, stop: threading.Event) -> None:
        self._limit = limit
        self._stop = stop
        self._used = 0
        self._changed = threading.Condition()

    def acquire(self) -> None:
        with self._changed:
            self._wait(lambda: self._used < self._limit)
            self._used += 1

    def release(self) -> None:
        with self._changed:
            self._used -= 1
            self._changed.notify_all()

    def wait_empty(self) -> None:
        with self._changed:
            self._wait(lambda: self._used == 0)

    def _wait(self, ready: Callable[[], bool]) -> None:
        # called holding the condition's lock
        while not ready():
            if self._stop.is_set():
                raise Stopped
            self._changed.wait(POLL)


def _feed_body(
    pool: Pool,
    ordered: bool,
    slots: _Slots,
    inbox: queue.Queue[Any],
    futures: queue.Queue[Any],
    stop: threading.Event,
) -> None:
    def submit(item: Any) -> None:
        slots.acquire()
        future = pool.submit(item)
        if ordered:
            futures.put(future)
        else:
            future.add_done_callback(futures.put)

    signal = _drain(inbox, stop, submit)
    # Signals travel with the futures so that they keep their place after the results before
    # them; without order, after all the results in flight.
    if not ordered:
        slots.wait_empty()
    futures.put(signal)


def _emit_body(
    slots: _Slots,
    futures: queue.Queue[Any],
    stage: str,
    outbox: queue.Queue[Any],
    stop: threading.Event,
) -> None:
    while True:
        message = get(futures, stop)
        if not isinstance(message, Future):
            put(outbox, message, stop)
            return
        while not message.done():
            if stop.is_set():
                raise Stopped
            _wait_done(message)
        error = message.exception()
        if error is not None:
            put(outbox, Failure(error, stage), stop)
            return
        put(outbox, message.result(), stop)
        slots.release()


def _wait_done(future: Future[Any]) -> None:
    try:
        future.exception(timeout=POLL)
    except concurrent.futures.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        pass
