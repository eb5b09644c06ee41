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
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from fitbatch import _rng
from fitbatch._plan_sampler import torch_class
from fitbatch._rng import SeedLike, resolve_seed
from fitbatch._validate import non_negative_int, positive_int
from fitbatch.resume import STEP_KEY, StateSchema

logger = logging.getLogger("fitbatch.streaming")

_Base = torch_class("IterableDataset")  # so that DataLoader accepts a StreamDataset

EQUAL_STEPS_STATE = StateSchema("equal_steps", version=1, required=(STEP_KEY, "window_step", "source"))


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
    >>> ds = fitbatch.StreamDataset(shard_items, sizeof=lambda x: 1, budget=4, cost="sum", num_replicas=2, rank=1)
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
        num_replicas, rank: data-parallel world; read from ``torch.distributed`` when omitted.
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
        **stream_options: Any,
    ) -> None:
        from fitbatch.distributed import world_info
        from fitbatch.streaming._stream import batch_stream

        self._source = source
        self.seed = resolve_seed(seed)
        self.num_replicas, self.rank = world_info(num_replicas, rank)
        self.epoch = 0
        self._options = stream_options
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


@dataclasses.dataclass(frozen=True)
class EqualStepsSummary:
    """Steps run, and what this rank fetched but did not run when the ranks stopped together.

    Attributes:
        steps: batches yielded on this rank.
        dropped_batches, dropped_items: fetched here but not run, because another rank ran out.
        exhausted: whether this rank's batches ran out.
        collectives: ``all_reduce`` calls made (one per ``sync_every`` window).

    >>> import fitbatch
    >>> run = fitbatch.equal_steps(iter([[0, 1], [2, 3, 4]]), sync_every=4)  # a world of one
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

    Without an initialised ``torch.distributed``, ``sync_every`` runs as a world of one:

    >>> import fitbatch
    >>> batches = [[0, 1], [2], [3, 4], [5]]
    >>> run = fitbatch.equal_steps(batches, sync_every=3)
    >>> list(run), run.summary.steps, run.summary.collectives
    ([[0, 1], [2], [3, 4], [5]], 4, 2)
    >>> list(fitbatch.equal_steps(batches, steps=2))
    [[0, 1], [2]]
    """

    def __init__(self, batches: Iterable[Any], *, sync_every: int | None, steps: int | None, group: Any) -> None:
        self._batches = batches
        self._it: Iterator[Any] | None = None
        self.sync_every, self.steps, self.group = sync_every, steps, group
        self._window: list[Any] = []
        self._window_state: Any = None  # the source's state when the current window was fetched
        self._window_step = 0  # batches of the current window already run
        self._step = 0
        self._final = False
        self._dropped_batches = 0
        self._dropped_items = 0
        self._exhausted = False
        self._collectives = 0

    def __iter__(self) -> EqualSteps:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self._batches)
        if self.steps is not None:
            return self._next_fixed()
        if self._window_step >= len(self._window):
            if self._final:
                raise StopIteration
            self._fetch()
            if not self._window:
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
        state_dict = getattr(self._batches, "state_dict", None)
        self._window_state = state_dict() if callable(state_dict) else None
        window = list(itertools.islice(self._it, self.sync_every))
        self._exhausted = len(window) < self.sync_every
        run = _all_reduce_min(len(window), self.group)
        self._collectives += 1
        if run < len(window):
            extra = window[run:]
            self._dropped_batches += len(extra)
            self._dropped_items += sum(len(b) for b in extra if hasattr(b, "__len__"))
            logger.info(
                "equal_steps: another rank ran out at step %d; dropped %d fetched batches (%d items) here",
                self._step + run, len(extra), self._dropped_items,
            )
        if run < self.sync_every:
            self._final = True
        self._window, self._window_step = window[:run], 0

    @property
    def summary(self) -> EqualStepsSummary:
        return EqualStepsSummary(
            steps=self._step,
            dropped_batches=self._dropped_batches,
            dropped_items=self._dropped_items,
            exhausted=self._exhausted,
            collectives=self._collectives,
        )

    def state_dict(self) -> dict[str, Any]:
        """Steps run, and the source's state (at the start of the current window) when it has one.

        >>> run = equal_steps(iter([[1], [2], [3]]), steps=2)
        >>> next(run)
        [1]
        >>> run.state_dict()
        {'version': 1, 'step': 1, 'window_step': 0, 'source': None}
        """
        if self.sync_every is None:
            state_dict = getattr(self._batches, "state_dict", None)
            source = state_dict() if callable(state_dict) else None
            return EQUAL_STEPS_STATE.envelope(step=self._step, window_step=0, source=source)
        return EQUAL_STEPS_STATE.envelope(step=self._step, window_step=self._window_step, source=self._window_state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore; the source is restored to the window start and the run batches fetched again."""
        EQUAL_STEPS_STATE.check(state)
        if self._it is not None:
            raise ValueError("load_state_dict must be called before iterating")
        if state["source"] is not None:
            load = getattr(self._batches, "load_state_dict", None)
            if not callable(load):
                raise ValueError("the state holds a source state but these batches have no load_state_dict")
            load(state["source"])
        self._step = non_negative_int("step", state[STEP_KEY])
        skip = non_negative_int("window_step", state["window_step"])
        if skip:
            self._it = iter(self._batches)
            self._window_state = state["source"]
            self._window = list(itertools.islice(self._it, self.sync_every or skip))
            self._final = len(self._window) < (self.sync_every or skip)
            self._window_step = min(skip, len(self._window))


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
