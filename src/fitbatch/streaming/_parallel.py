"""Streams across DataLoader workers and data-parallel ranks (re-exported by :mod:`fitbatch.streaming`).

* :class:`StreamDataset` — a ``torch.utils.data.IterableDataset`` that batches inside each
  DataLoader worker (use ``DataLoader(dataset, batch_size=None)``). Each (rank, worker) reads its
  own shard: every ``world * workers``-th item of a plain iterable, or what a source *factory*
  returns for the :class:`StreamShard` it is given (a seed that differs per rank, worker and epoch
  and is reproducible, for shuffling shard lists).
* :func:`equal_steps` — wraps any iterator of batches (a :class:`~fitbatch.streaming.BatchStream`,
  a DataLoader over a :class:`StreamDataset`) so that every rank runs the same number of steps
  when ranks read shards of different lengths. Two ways:

  - ``sync_every=k``: every ``k`` steps each rank fetches its next ``k`` batches and one
    ``all_reduce(MIN)`` of how many it got tells every rank how many to run; when a rank's shard
    runs out all ranks stop at the same step. What the other ranks had fetched beyond it is
    dropped and counted (``dropped_batches``/``dropped_items``); the unread rest of their shards
    is not read this epoch (``exhausted`` is False there).
  - ``steps=n``: exactly ``n`` steps per epoch with no communication (for infinite or resampled
    sources, as webdataset's ``with_epoch``); a shard that runs out first is an error.

  Resume: the state saves the collective's results (the agreed window length, whether it is the
  last), so a restore re-fetches exactly that window on every rank with no decision of its own;
  batches without ``state_dict``/``load_state_dict`` cannot resume past step 0 (refused, never
  replayed). ``docs/streaming.md`` ("Resume guarantees") states what is exact and what is refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from fitbatch import _rng
from fitbatch._rng import SeedLike, resolve_seed
from fitbatch._state import OPTIONS_KEY, STEP_KEY
from fitbatch._validate import non_negative_int, positive_int
from fitbatch.sampler._protocol import torch_class
from fitbatch.streaming._state import EQUAL_STEPS_STATE

logger = logging.getLogger("fitbatch.streaming")

_Base = torch_class("IterableDataset")  # so that DataLoader accepts a StreamDataset


@dataclasses.dataclass(frozen=True)
class StreamShard:
    """Which part of a stream one DataLoader worker of one rank reads, and its seed.

    Attributes:
        rank, world: data-parallel rank and world size.
        worker, num_workers: DataLoader worker id and count (0 and 1 in the main process).
        epoch: the epoch (see :meth:`StreamDataset.set_epoch`).
        seed: an int that differs per (rank, worker, epoch), reproducible from the dataset seed.

    A source factory reads the shard's part of the data (here rank 1 of 2, no workers):

    >>> import fitbatch
    >>> def shard_items(shard):
    ...     return range(shard.index, 10, shard.count)
    >>> ds = fitbatch.streaming.StreamDataset(shard_items, sizeof=lambda x: 1, budget=4, cost="sum", num_replicas=2, rank=1)
    >>> shard = ds.shard()
    >>> shard.index, shard.count, shard.seed == ds.shard().seed, list(ds)
    (1, 2, True, [[1, 3, 5, 7], [9]])
    """

    rank: int
    world: int
    worker: int
    num_workers: int
    epoch: int
    seed: int

    @property
    def index(self) -> int:
        """This shard's index among ``count`` shards (rank-major)."""
        return self.rank * self.num_workers + self.worker

    @property
    def count(self) -> int:
        return self.world * self.num_workers

    def rng(self):  # type: ignore[no-untyped-def]
        """A ``numpy.random.Generator`` seeded for this shard."""
        import numpy as np

        return np.random.default_rng(self.seed)


def current_shard(seed: int, epoch: int, rank: int, world: int) -> StreamShard:
    """The shard of the calling process (inside a DataLoader worker, that worker's)."""
    worker, workers = 0, 1
    try:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            worker, workers = int(info.id), int(info.num_workers)
    except ImportError:  # pragma: no cover
        pass
    key = int(_rng.generator(seed, epoch, "stream-shard", rank, worker).integers(1 << 62))
    return StreamShard(rank=rank, world=world, worker=worker, num_workers=workers, epoch=epoch, seed=key)


class StreamDataset(_Base):  # type: ignore[misc,valid-type]
    """Batches of a stream inside DataLoader workers (``DataLoader(ds, batch_size=None)``).

    Args:
        source: an iterable (each shard takes every ``shard.count``-th item, starting at
            ``shard.index``; it must be re-iterable for more than one epoch), or a callable
            ``source(shard: StreamShard) -> iterable`` returning the shard's items itself.
        seed: int or ``SeedSequence``; shard seeds derive from it, the epoch, rank and worker.
        shuffle: shuffle each shard's stream with its shard seed (``batch_stream(seed=...)``):
            other batches every epoch, the same ones for the same (seed, epoch, rank, worker).
        num_replicas: data-parallel world size; read from ``torch.distributed`` when omitted.
        rank: this process's rank; read from ``torch.distributed`` when omitted.
        **stream_options: passed to :func:`fitbatch.streaming.batch_stream` (``sizeof``,
            ``budget``, ``cost``, ``strategy``, ...).

    >>> ds = StreamDataset(list(range(10)), sizeof=lambda x: 1, budget=4, cost="sum")
    >>> list(ds)
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    def __init__(
        self,
        source: Iterable[Any] | Callable[[StreamShard], Iterable[Any]],
        *,
        seed: SeedLike = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = False,
        **stream_options: Any,
    ) -> None:
        from fitbatch.epoch._world import world_info
        from fitbatch.streaming._stream import batch_stream

        self._source = source
        self.seed = resolve_seed(seed)
        self.num_replicas, self.rank = world_info(num_replicas, rank)
        self.epoch = 0
        self._options = stream_options
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be True or False, got {shuffle!r}")
        self.shuffle = shuffle
        batch_stream([], **stream_options)  # validate the options now, not in a worker

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (changes the shard seeds)."""
        self.epoch = non_negative_int("epoch", epoch)

    def shard(self) -> StreamShard:
        """The shard the calling process (or DataLoader worker) reads."""
        return current_shard(self.seed, self.epoch, self.rank, self.num_replicas)

    def __iter__(self) -> Iterator[Any]:
        from fitbatch.streaming._stream import batch_stream

        shard = self.shard()
        if callable(self._source) and not isinstance(self._source, Iterable):
            items: Iterable[Any] = self._source(shard)
        else:
            items = itertools.islice(self._source, shard.index, None, shard.count)
        if self.shuffle:
            return batch_stream(items, seed=shard.seed, epoch=shard.epoch, **self._options)
        return batch_stream(items, **self._options)


def _all_reduce_min(value: int, group: Any) -> int:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return value
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


_FAILED = -1  # what a rank whose batches raised contributes to the MIN: every rank stops, none hangs


@dataclasses.dataclass(frozen=True)
class EqualStepsSummary:
    """Steps run, and what this rank fetched but did not run when the ranks stopped together.

    Attributes:
        steps: batches yielded on this rank.
        dropped_batches, dropped_items: fetched here but not run, because another rank ran out.
        exhausted: whether this rank's batches ran out.
        collectives: ``all_reduce`` calls made (one per ``sync_every`` window).

    >>> import fitbatch
    >>> run = fitbatch.streaming.equal_steps(iter([[0, 1], [2, 3, 4]]), sync_every=4)  # a world of one
    >>> list(run)
    [[0, 1], [2, 3, 4]]
    >>> run.summary
    EqualStepsSummary(steps=2, dropped_batches=0, dropped_items=0, exhausted=True, collectives=1)
    """

    steps: int
    dropped_batches: int
    dropped_items: int
    exhausted: bool
    collectives: int


class EqualSteps(Iterator[Any]):
    """An iterator of batches whose length is the same on every rank (see :func:`equal_steps`).

    How many steps remain is never decided by one rank alone. With ``sync_every`` the length
    of each window is the ``all_reduce(MIN)`` result, and it is the last window exactly when
    that result is below ``sync_every``; both are kept, saved in the state, and a restore
    fetches that many batches again on every rank, with no collective and no decision of its
    own. With ``steps`` the count is the same constant on every rank.

    Without an initialised ``torch.distributed``, ``sync_every`` runs as a world of one:

    >>> import fitbatch
    >>> batches = [[0, 1], [2], [3, 4], [5]]
    >>> run = fitbatch.streaming.equal_steps(batches, sync_every=3)
    >>> list(run), run.summary.steps, run.summary.collectives
    ([[0, 1], [2], [3, 4], [5]], 4, 2)
    >>> list(fitbatch.streaming.equal_steps(batches, steps=2))
    [[0, 1], [2]]
    """

    def __init__(self, batches: Iterable[Any], *, sync_every: int | None, steps: int | None, group: Any) -> None:
        self._batches = batches
        self._it: Iterator[Any] | None = None
        self.sync_every, self.steps, self.group = sync_every, steps, group
        self._agreed = 0  # the current window's length, as the collective agreed it
        self._window: list[Any] = []  # its batches (not kept once a restore finds it fully run)
        self._window_state: Any = None  # the source's state when the current window was fetched
        self._window_step = 0  # batches of the current window already run
        self._step = 0
        self._final = False  # the current window is the last: a rank ran out
        self._dropped_batches = 0
        self._dropped_items = 0
        self._exhausted = False
        self._collectives = 0
        self._warned = False

    def __iter__(self) -> EqualSteps:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self._batches)
        if self.steps is not None:
            return self._next_fixed()
        if self._window_step >= self._agreed:
            if self._final:
                raise StopIteration
            self._fetch()
            if not self._agreed:
                raise StopIteration
        batch = self._window[self._window_step]
        self._window_step += 1
        self._step += 1
        return batch

    def _next_fixed(self) -> Any:
        assert self._it is not None and self.steps is not None
        if self._step >= self.steps:
            raise StopIteration
        try:
            batch = next(self._it)
        except StopIteration:
            self._exhausted = True
            raise RuntimeError(
                f"the stream ended after {self._step} of steps={self.steps} steps; use an infinite or "
                "resampled source with steps=, or sync_every= to stop all ranks when one runs out"
            ) from None
        self._step += 1
        return batch

    def _fetch(self) -> None:
        assert self._it is not None and self.sync_every is not None
        self._window_state = self._source_state()
        try:
            window = list(itertools.islice(self._it, self.sync_every))
        except Exception:
            self._collectives += 1
            _all_reduce_min(_FAILED, self.group)  # the other ranks learn it and stop too
            raise
        run = _all_reduce_min(len(window), self.group)
        self._collectives += 1
        if run == _FAILED:
            self._final, self._agreed, self._window, self._window_step = True, 0, [], 0
            raise RuntimeError(
                f"equal_steps: another rank's batches raised while fetching the window at step {self._step}; "
                "every rank stops here (that rank's error says why)"
            )
        self._exhausted = len(window) < self.sync_every
        if run < len(window):
            extra = window[run:]
            self._dropped_batches += len(extra)
            self._dropped_items += sum(len(b) for b in extra if hasattr(b, "__len__"))
            logger.info(
                "equal_steps: another rank ran out at step %d; dropped %d fetched batches (%d items) here",
                self._step + run, len(extra), self._dropped_items,
            )
        self._final = run < self.sync_every
        self._agreed, self._window, self._window_step = run, window[:run], 0

    @property
    def summary(self) -> EqualStepsSummary:
        return EqualStepsSummary(
            steps=self._step,
            dropped_batches=self._dropped_batches,
            dropped_items=self._dropped_items,
            exhausted=self._exhausted,
            collectives=self._collectives,
        )

    # ------------------------------------------------------------------ state

    def _resumable(self) -> bool:
        return callable(getattr(self._batches, "state_dict", None)) and callable(
            getattr(self._batches, "load_state_dict", None)
        )

    def _source_state(self) -> Any:
        return self._batches.state_dict() if self._resumable() else None  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        """Steps run, the agreed window, the counters and the source's state (see :func:`equal_steps`).

        Inside a window the source's state is the one at the window's start, with the window's
        agreed length; between windows it is the source's state now. Over batches without
        ``state_dict()``/``load_state_dict()`` (a plain DataLoader) the state records
        ``resumable: False`` (logged once): it loads at step 0 only.

        >>> run = equal_steps(iter([[1], [2], [3]]), steps=2)
        >>> next(run)
        [1]
        >>> state = run.state_dict()
        >>> state["step"], state["resumable"], state["source"]
        (1, False, None)
        """
        resumable = self._resumable()
        if not resumable and not self._warned:
            self._warned = True
            logger.warning(
                "equal_steps.state_dict(): %s has no state_dict()/load_state_dict(), so this state loads at "
                "step 0 only; iterate a BatchStream or torchdata's StatefulDataLoader to resume mid-epoch",
                type(self._batches).__name__,
            )
        between = self.steps is not None or (self._window_step >= self._agreed and not self._final)
        return EQUAL_STEPS_STATE.envelope(
            options=self._options(),
            step=self._step,
            window=0 if between else self._agreed,
            window_step=0 if between else self._window_step,
            final=self._final,
            resumable=resumable,
            source=self._source_state() if between else self._window_state,
            exhausted=self._exhausted,
            dropped_batches=self._dropped_batches,
            dropped_items=self._dropped_items,
            collectives=self._collectives,
        )

    def _options(self) -> dict[str, int | None]:
        return {"steps": self.steps, "sync_every": self.sync_every}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after ``state``: the source is restored, and inside a window its agreed
        batches are fetched again (exactly that many, on every rank, with no collective).

        Raises:
            TypeError: a value of the state has the wrong type.
            ValueError: unknown or missing keys, another version, inconsistent values, other
                options, a run already started, a state taken over batches that cannot resume
                (past step 0), or a source that replays fewer batches than the window held.
        """
        EQUAL_STEPS_STATE.check(state)
        if dict(state[OPTIONS_KEY]) != self._options():
            raise ValueError(
                f"equal_steps state was saved with {dict(state[OPTIONS_KEY])!r}; build equal_steps with the "
                f"same options (now {self._options()!r})"
            )
        if self._it is not None:
            raise ValueError("load_state_dict must be called before iterating")
        step, window, done, final = state[STEP_KEY], state["window"], state["window_step"], state["final"]
        _check_window(self.sync_every, self.steps, step, window, done, final)
        if not state["resumable"]:
            if step:
                raise ValueError(
                    f"cannot resume equal_steps at step {step}: the state was saved over batches without "
                    f"state_dict()/load_state_dict() (these are a {type(self._batches).__name__}), so where they "
                    f"were is unknown and restarting them would run up to {step} batches twice. Iterate "
                    "batches that can resume (a BatchStream from batch_stream(...), or torchdata's "
                    "StatefulDataLoader over the StreamDataset), or start the epoch over without this state"
                )
        elif not self._resumable():
            raise ValueError(
                f"the equal_steps state holds its source's state, but these batches (a {type(self._batches).__name__}) "
                "have no state_dict()/load_state_dict(); wrap the kind of source the state was saved over"
            )
        else:
            self._batches.load_state_dict(state["source"])  # type: ignore[attr-defined]
        self._step, self._final, self._exhausted = step, final, state["exhausted"]
        self._dropped_batches, self._dropped_items = state["dropped_batches"], state["dropped_items"]
        self._collectives = state["collectives"]
        self._agreed, self._window_step, self._window_state = window, done, state["source"]
        if done < window:
            self._it = iter(self._batches)
            self._window = list(itertools.islice(self._it, window))
            if len(self._window) < window:
                raise ValueError(
                    f"the source replays {len(self._window)} batches of the {window} of the window the state was "
                    "saved in; resume over the same source, replayed in the same order"
                )


def _check_window(sync_every: int | None, steps: int | None, step: int, window: int, done: int, final: bool) -> None:
    """The window of an equal_steps state must be one that the collective could have agreed."""
    if sync_every is None:
        ok = window == done == 0 and not final and steps is not None and step <= steps
    else:
        # a fetched window is the last exactly when the agreed length is below sync_every
        ok = done <= window <= sync_every and done <= step and (window == 0 or final == (window < sync_every))
    if not ok:
        raise ValueError(
            f"inconsistent equal_steps state (step {step}, window {window}, window_step {done}, final {final}) "
            f"for sync_every={sync_every}, steps={steps}; pass what state_dict() returned, unchanged"
        )


def equal_steps(
    batches: Iterable[Any], *, sync_every: int | None = None, steps: int | None = None, group: Any = None
) -> EqualSteps:
    """Keep every data-parallel rank's step count equal (see the module docstring).

    Args:
        batches: this rank's batches (a ``BatchStream``, a DataLoader, any iterable).
        sync_every: fetch ``k`` batches ahead and agree with one ``all_reduce(MIN)`` per ``k``
            steps (on the default group, or ``group``) how many every rank runs. Without an
            initialised ``torch.distributed`` it runs as a world of one.
        steps: run exactly this many steps, with no communication. Exactly one of
            ``sync_every`` and ``steps`` is required.
        group: a ``torch.distributed`` process group for ``sync_every`` (default group).

    Returns:
        An :class:`EqualSteps` iterator with ``summary`` and ``state_dict``/``load_state_dict``.

    >>> run = equal_steps(iter([[1], [2], [3]]), sync_every=2)
    >>> list(run), run.summary.steps
    ([[1], [2], [3]], 3)
    """
    if (sync_every is None) == (steps is None):
        raise TypeError("pass exactly one of sync_every (steps between collectives) and steps (steps per epoch)")
    return EqualSteps(
        batches,
        sync_every=positive_int("sync_every", sync_every, allow_none=True),
        steps=positive_int("steps", steps, allow_none=True),
        group=group,
    )
