"""``batch_stream`` and ``BatchStream``: size-aware batches from one iterable of unknown length.

See :mod:`fitbatch.streaming` for the strategies, the memory bounds and the resume contract.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch import _rng
from fitbatch._kernels import jit as _jit
from fitbatch._rng import SeedLike
from fitbatch._state import OPTIONS_KEY
from fitbatch._validate import choice, parse_budget, positive_int
from fitbatch.costs import CostModel, resolve_cost
from fitbatch.costs._limits import one_budget
from fitbatch.plan._rules import OVERSIZED, screen_oversized
from fitbatch.strategies import Buckets, Strategy
from fitbatch.streaming._plan import (
    BucketPlanner,
    Run,
    Segment,
    SequentialPlanner,
    from_runs,
    lower_budget,
    mark_fractional,
    resolve_stream_strategy,
    to_runs,
    whole_runs,
)
from fitbatch.streaming._rounds import StreamSummary, Totals, _Round
from fitbatch.streaming._shuffle import emission_salt, shuffle_options, shuffled
from fitbatch.streaming._sizeof import PerChunk, _sizers, measure
from fitbatch.streaming._state import SHOWN, STREAM_STATE, check_counts

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]


class BatchStream(Iterator[Any]):
    """An iterator of batches over a source of unknown length (built by :func:`batch_stream`).

    Iterating yields each batch once (a stream is read once): ``next(stream)`` and every
    ``iter(stream)`` share one position, and ``summary``/``state_dict()`` describe it.

    >>> import fitbatch
    >>> stream = fitbatch.batch_stream(iter([3, 1, 2, 4, 2]), sizeof=int, budget=4, cost="sum")
    >>> next(stream)
    [3, 1]
    >>> stream
    BatchStream(strategy='sequential', cost='sum', budget=4, read=5, batches=1, held=3)
    >>> list(stream), stream.summary.finished
    ([[2], [4], [2]], True)
    """

    def __init__(
        self,
        source: Iterable[Any],
        *,
        sizeof: Callable[[Any], float] | None,
        sizeof_batch: Callable[[list[Any]], Any] | None,
        budget: float,
        cost: CostModel,
        strategy: Strategy,
        buffer_size: int,
        max_batch_size: int | None,
        oversized: str,
        collate_fn: Callable[[list[Any]], Any] | None,
        seed: int | None = None,
        epoch: int = 0,
        shuffle_buffer: int = 0,
    ) -> None:
        self._source = source
        self.seed, self.epoch, self.shuffle_buffer = seed, epoch, shuffle_buffer
        self._sizeof, self._sizeof_batch = sizeof, sizeof_batch
        self.budget, self.cost, self.strategy = budget, cost, strategy
        self.buffer_size, self.max_batch_size, self.oversized = buffer_size, max_batch_size, oversized
        self._collate = collate_fn
        self._planner: SequentialPlanner | BucketPlanner
        if isinstance(strategy, Buckets):
            salt = None if seed is None else emission_salt(seed, epoch)
            self._planner = BucketPlanner(budget, cost, max_batch_size, buffer_size, strategy, salt)
        else:
            self._planner = SequentialPlanner(budget, cost, max_batch_size, buffer_size)
        self._it: Iterator[Any] | None = None
        # the batches planned and not all yielded yet, and the iterator that yields them all
        self._round = _Round.empty((0, 0, 0.0, 0.0, 0))
        self._batches: Iterator[Any] | None = None
        self._done = False
        self._read = 0
        self._partial: list[Any] = []  # a chunk's items read before the source raised
        self._skipped = 0
        self._skipped_positions: list[int] = []
        self._last_size: float | None = None  # of the last item read: a restore checks the source with it

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        # A C-level chain over the rounds' list iterators: a batch costs no Python call.
        return self._batches or self._start()

    def __next__(self) -> Any:
        return next(self._batches or self._start())

    def _start(self) -> Iterator[Any]:
        self._batches = itertools.chain.from_iterable(self._rounds())
        return self._batches

    def _rounds(self) -> Iterator[Iterator[Any]]:
        try:
            if self._it is None:
                self._it = self._open()
            while True:
                if operator.length_hint(self._round.heads):
                    batches = self._round.batches
                    yield batches if self._collate is None else map(self._collate, batches)
                elif self._done:
                    return
                else:
                    self._next_round()
        except BaseException:
            self._batches = None  # an error ends this chain; the next call continues in a new one
            raise

    def _open(self) -> Iterator[Any]:
        """The source's items in stream order: as given, or through the seeded shuffle buffer."""
        if self.seed is None:
            return iter(self._source)
        return shuffled(self._source, self.shuffle_buffer, _rng.generator(self.seed, self.epoch, "stream-shuffle"))

    def _next_round(self) -> None:
        assert self._it is not None  # set by _rounds (an internal invariant, not user input)
        # what the source yielded before it raised stays in _partial (extend keeps it) for the next call
        self._partial.extend(itertools.islice(self._it, self._planner.want() - len(self._partial)))
        items, self._partial = self._partial, []
        if not items:
            self._done = True
            self._enqueue(self._planner.finish())
            if self._skipped:
                logger.warning(
                    "stream ended: %d oversized items skipped (first positions %s), budget %g",
                    self._skipped, self._skipped_positions, self.budget,
                )
            return
        first = self._read
        self._read += len(items)  # a chunk whose sizes fail is lost (the error names its items)
        self._last_size = None
        sizes = self._measure(items, first)
        self._last_size = float(sizes[-1])
        seg = Segment(items, np.arange(first, self._read, dtype=np.int64), sizes)
        self._enqueue(self._ingest(self._screen(seg)))

    def _ingest(self, seg: Segment, resume: bool = False) -> list[Run]:
        runs: list[Run] = []
        if isinstance(self._planner, BucketPlanner) and self.oversized == "single":
            alone = self.cost.sample_cost(seg.sizes) > self.budget
            if alone.any():  # lone items go out at once; buckets only hold what fits
                runs = whole_runs([seg.take(np.array([i])) for i in np.flatnonzero(alone)])
                seg = seg.take(np.flatnonzero(~alone))
        if resume and isinstance(self._planner, BucketPlanner) and self._planner.tops is not None:
            return runs + self._planner.place(seg)
        return runs + self._planner.absorb(seg)

    def _enqueue(self, runs: Iterable[Run]) -> None:
        """Start a round with the batches of planner runs (the last round is fully yielded)."""
        base = self._round.totals(self._round.size)
        runs = [run for run in runs if len(run.bounds) > 1]
        if not runs:
            self._round = _Round.empty(base)
            return
        if len(runs) == 1:  # the sequential case: one segment, batches back to back
            seg, bounds, cuts = runs[0]
            items = seg.items
            heads, tails = bounds[:-1], bounds[1:]
            if cuts is None:
                cuts = np.fromiter(bounds, dtype=np.int64, count=len(bounds))
            totals = _jit.run_totals(seg.sizes, cuts, self.cost, self.budget, base)
            if totals is None:
                # each batch reduced over the same items as with [head, tail) pairs, in one pass
                real = np.add.reduceat(seg.sizes[: bounds[-1]], cuts[:-1])
                top = np.maximum.reduceat(seg.sizes[: bounds[-1]], cuts[:-1])
                totals = self._running_totals(base, np.diff(cuts), real, top)
        else:
            items = []
            heads = []
            tails = []
            offsets: list[int] = []
            offset = 0
            for run in runs:
                items.extend(run.seg.items)
                heads.extend(run.bounds[:-1])
                tails.extend(run.bounds[1:])
                offsets.append(offset)
                offset += len(run.seg)
            # a run may leave items out (the open batch): reduce over [head, tail) pairs
            sizes = np.concatenate([*(run.seg.sizes for run in runs), np.zeros(1)])
            shift = np.repeat(np.asarray(offsets, dtype=np.int64), [len(run.bounds) - 1 for run in runs])
            pairs = np.empty(2 * len(heads), dtype=np.int64)
            pairs[0::2], pairs[1::2] = heads, tails
            pairs[0::2] += shift
            pairs[1::2] += shift
            heads, tails = pairs[0::2].tolist(), pairs[1::2].tolist()
            real = np.add.reduceat(sizes, pairs)[0::2]
            top = np.maximum.reduceat(sizes, pairs)[0::2]
            totals = self._running_totals(base, pairs[1::2] - pairs[0::2], real, top)
        head_it = iter(heads)
        self._round = _Round(
            map(items.__getitem__, map(slice, head_it, tails)), head_it, len(heads), base, *totals,
            [(run.seg.positions, run.bounds[0], run.bounds[-1]) for run in runs],
        )

    def _running_totals(
        self, base: Totals, counts: IntArray, real: NDArray[np.float64], top: NDArray[np.float64]
    ) -> tuple[IntArray, NDArray[np.float64], NDArray[np.float64], IntArray]:
        """(items, real units, padded units, batches over budget) after each batch, from ``base``."""
        over = self.cost.evaluate(counts.astype(np.float64), top, real) > self.budget
        _, e0, r0, p0, o0 = base
        return e0 + np.cumsum(counts), r0 + np.cumsum(real), p0 + np.cumsum(counts * top), o0 + np.cumsum(over)

    # ------------------------------------------------------------------ sizes

    def _measure(self, items: list[Any], first: int) -> NDArray[np.float64]:
        sizes = measure(items, first, self._sizeof, self._sizeof_batch)
        lower_budget(self._planner, sizes)
        return sizes

    def _screen(self, seg: Segment) -> Segment:
        """Apply the oversized policy; lone items under ``"single"`` stay (planned alone)."""
        over, kept = screen_oversized(
            self.cost.sample_cost(seg.sizes), self.budget, self.oversized,
            sizes=seg.sizes, positions=seg.positions, label="stream item", noun="item",
            counted_in="stream's summary",
        )
        if kept is None:
            return seg
        if not self._skipped:
            logger.warning(
                "skipping oversized stream item %d (size %g, budget %g); further skips are counted "
                "in the stream's summary", int(seg.positions[over[0]]), seg.sizes[over[0]], self.budget,
            )
        self._skipped += int(over.size)
        room = SHOWN - len(self._skipped_positions)
        self._skipped_positions.extend(int(p) for p in seg.positions[over[:room]])
        return seg.take(kept)

    # ------------------------------------------------------------------ summary and state

    def _totals(self) -> Totals:
        """(batches, items, real units, padded units, oversized batches) of the batches yielded."""
        return self._round.totals(self._round.yielded())

    @property
    def summary(self) -> StreamSummary:
        """A snapshot of the counters (see :class:`StreamSummary`)."""
        batches, emitted, real, padded, over = self._totals()
        return StreamSummary(
            items_read=self._read,
            items_emitted=emitted,
            batches=batches,
            held=self._read - emitted - self._skipped,
            skipped=self._skipped,
            skipped_positions=tuple(self._skipped_positions),
            oversized_batches=int(over),
            padding_efficiency=real / padded if padded > 0 else 1.0,
            finished=self._done and not operator.length_hint(self._round.heads),
        )

    def _options(self) -> dict[str, Any]:
        strategy: dict[str, Any] = {"kind": self.strategy.name, **dataclasses.asdict(self.strategy)}  # type: ignore[call-overload]
        if strategy.get("boundaries") is not None:
            strategy["boundaries"] = list(strategy["boundaries"])
        options = {
            "budget": self.budget,
            "cost": self.cost.to_dict(),
            "strategy": strategy,
            "buffer_size": self.buffer_size,
            "max_batch_size": self.max_batch_size,
            "oversized": self.oversized,
        }
        if self.seed is not None:  # unseeded streams keep the options (and states) they always had
            options.update(seed=self.seed, epoch=self.epoch, shuffle_buffer=self.shuffle_buffer)
        return options

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able state after the batches yielded so far (see the module docstring).

        >>> stream = batch_stream(range(6), sizeof=lambda x: 1, budget=2, cost="sum")
        >>> next(stream)
        [0, 1]
        >>> state = stream.state_dict()
        >>> state["version"], state["read"], state["batches"], state["pending"]
        (2, 6, 1, [[2, 4]])
        """
        parts = [self._round.pending()] + [s.positions for s in self._planner.held_segments()]
        pending = np.concatenate(parts)
        batches, emitted, real, padded, over = self._totals()
        extra: dict[str, Any] = {}
        if isinstance(self._planner, BucketPlanner):
            p = self._planner
            extra["buckets"] = {
                "tops": None if p.tops is None else p.tops.tolist(),
                "next_fit": p.next_fit,
            }
        return STREAM_STATE.envelope(
            options=self._options(),
            read=self._read,
            pending=to_runs(pending),
            batches=batches,
            emitted=emitted,
            real=real,
            padded=padded,
            skipped=self._skipped,
            skipped_positions=list(self._skipped_positions),
            oversized_batches=int(over),
            integral=self._planner.integral,
            done=self._done,
            last_size=self._last_size,
            **extra,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the batches recorded in ``state`` (call before iterating).

        The source is iterated from its start: the first ``read`` items are skipped (and the
        not-yet-emitted ones among them buffered again, measured with ``sizeof`` once more).
        The last item read is measured again too: a source that replays other items than the
        one the state was taken over (another rank's or worker's shard) is refused.

        Raises:
            TypeError: a value of the state has the wrong type.
            ValueError: unknown or missing keys, another version, a value out of range or
                inconsistent with the others, other options, a stream already started, or a
                source that replays fewer or other items than the state recorded.
        """
        STREAM_STATE.check(state)
        if state[OPTIONS_KEY] != self._options():
            raise ValueError(
                "state was saved with other stream options; build the stream with the same ones "
                f"(saved: {state['options']!r}, now: {self._options()!r})"
            )
        if self._it is not None:
            raise ValueError("load_state_dict must be called before the stream is iterated")
        read = int(state["read"])
        pending = from_runs(state["pending"])
        check_counts(state, read, pending, isinstance(self._planner, BucketPlanner))
        self._it = self._open()
        if not state["integral"]:
            mark_fractional(self._planner)
        reservoir = self._restore_planner(state.get("buckets"))
        held = self._replay(read, pending, reservoir, state["last_size"])
        self._read, self._last_size, self._done = read, state["last_size"], state["done"]
        self._round = _Round.empty((
            int(state["batches"]), int(state["emitted"]), float(state["real"]), float(state["padded"]),
            int(state["oversized_batches"]),
        ))
        self._skipped = int(state["skipped"])
        self._skipped_positions = [int(p) for p in state["skipped_positions"]]
        if self._done:  # the source had ended: the held items are the rest of the final plan
            self._enqueue(self._planner.final(held))
        elif len(held):
            self._enqueue(self._ingest(held, resume=True))

    def _restore_planner(self, saved: Mapping[str, Any] | None) -> bool:
        """Set saved bucket boundaries; True when the replay must rebuild the size reservoir."""
        p = self._planner
        if not isinstance(p, BucketPlanner) or saved is None or saved["tops"] is None:
            return False
        p.restore(np.asarray(saved["tops"], dtype=np.float64), saved["next_fit"])
        return p.fitting

    def _replay(self, read: int, pending: IntArray, reservoir: bool, last_size: float | None) -> Segment:
        """Skip the first ``read`` source items, keeping those at ``pending`` positions."""
        assert self._it is not None
        parts: list[Segment] = []
        pos = 0
        items: list[Any] = []
        while pos < read:
            items = list(itertools.islice(self._it, min(8192, read - pos)))
            if not items:
                raise ValueError(
                    f"the source replays {pos} items, fewer than the {read} the state recorded; resume over "
                    "the source the state was taken over, replayed in the same order"
                )
            positions = np.arange(pos, pos + len(items), dtype=np.int64)
            lo, hi = np.searchsorted(pending, [pos, pos + len(items)])
            keep = pending[lo:hi] - pos
            if reservoir and isinstance(self._planner, BucketPlanner) and self._planner.wants_sizes():
                sizes = self._measure(items, pos)
                fits = self.cost.sample_cost(sizes) <= self.budget
                self._planner.observe(sizes[fits])
                parts.append(Segment([items[i] for i in keep.tolist()], positions[keep], sizes[keep]))
            elif keep.size:
                picked = [items[i] for i in keep.tolist()]
                parts.append(Segment(picked, positions[keep], self._measure(picked, pos)))
            pos += len(items)
        if last_size is not None and items:
            size = float(self._measure(items[-1:], read - 1)[0])
            if size != last_size:
                raise ValueError(
                    f"the source replays other items than the state was taken over: stream item {read - 1} "
                    f"has size {size:g} now and had {last_size:g}; resume each stream (each rank's, each "
                    "worker's shard) over its own source, replayed in the same order"
                )
        return Segment.join(parts) if parts else Segment([], np.zeros(0, np.int64), np.zeros(0))

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"BatchStream(strategy={self.strategy.name!r}, cost={self.cost.name!r}, budget={self.budget:g}, "
            f"read={s.items_read}, batches={s.batches}, held={s.held})"
        )


def batch_stream(
    iterable: Iterable[Any],
    *,
    sizeof: Callable[[Any], float] | PerChunk | None = None,
    budget: float | str,
    cost: str | CostModel | Any = "padded",
    strategy: str | Strategy = "sequential",
    buffer_size: int = 10_000,
    max_batch_size: int | None = None,
    oversized: str = "error",
    collate_fn: Callable[[list[Any]], Any] | None = None,
    sizeof_batch: Callable[[list[Any]], Any] | None = None,
    seed: SeedLike | bool = False,
    epoch: int = 0,
    shuffle_buffer: int | None = None,
) -> BatchStream:
    """Batches of a stream whose cost fits ``budget`` (see the module docstring).

    Args:
        iterable: the source; read once, in chunks.
        sizeof: the size of one item (``item -> number``), or :func:`per_chunk` around a function
            that sizes a list of items at once (``items -> array``, one number per item):
            faster when sizes come from a vectorised computation.
        budget: the most cost one batch may have (number or string such as ``"16GiB"``).
        cost: cost model (``"padded"``, ``"sum"``, ``"polynomial"``, a ``CostModel`` or function).
        strategy: ``"sequential"``, ``"buckets"``, or ``fitbatch.Buckets(boundaries=...)``
            (given bucket upper edges; ``spread`` and ``min_batches`` tune fitted ones).
        buffer_size: items held at most by ``"buckets"``; ``"sequential"`` reads
            ``min(buffer_size, 32768)`` items per round and holds them plus the open batch.
        max_batch_size: at most this many items per batch (``None``: no limit).
        oversized: an item whose own cost exceeds the budget: ``"error"``, ``"single"`` (a
            batch of its own) or ``"skip"`` (left out, counted in the summary and logged).
        collate_fn: applied to each batch (a list of items) before it is yielded.
        sizeof_batch: deprecated since 0.2.0 (removed in 0.3.0): pass
            ``sizeof=per_chunk(fn)``.
        seed: ``False`` (default) keeps the source order; an int (or ``None``: fresh entropy,
            kept in ``stream.seed`` and the state) shuffles the stream through a bounded shuffle
            buffer and emits each round's bucket batches in a random order, both drawn from
            (``seed``, ``epoch``): the same seed, epoch and source give the same batches, a new
            epoch new ones. Stream positions (summary, state) count items in the shuffled order.
        epoch: the epoch of a seeded stream (``0``, ``1``, ...).
        shuffle_buffer: items a seeded stream holds for shuffling (default ``buffer_size``,
            at least 2); they add to the planner's ``buffer_size`` items.

    Returns:
        A :class:`BatchStream` (an iterator of batches with ``summary`` and state).

    Raises:
        TypeError: no ``sizeof`` (or both it and ``sizeof_batch``), or options of the wrong type.
        ValueError: bad option values; while iterating, an oversized item under
            ``oversized="error"``, bad sizes, or a failing ``sizeof`` (re-raised with the
            item's stream position).

    >>> lengths = {"a": 3, "bb": 5, "c": 2, "ddd": 4}
    >>> list(batch_stream(lengths, sizeof=lengths.get, budget=10, cost="padded"))
    [['a', 'bb'], ['c', 'ddd']]
    >>> from fitbatch.streaming import per_chunk
    >>> list(batch_stream(["ab", "c", "def"], sizeof=per_chunk(lambda xs: [len(x) for x in xs]), budget=4, cost="sum"))
    [['ab', 'c'], ['def']]
    """
    per_item, per_items = _sizers(sizeof, sizeof_batch)
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable or None, got {collate_fn!r}")
    if not isinstance(iterable, Iterable):
        raise TypeError(f"iterable must be iterable, got {type(iterable).__name__}")
    return BatchStream(
        iterable,
        sizeof=per_item,
        sizeof_batch=per_items,
        budget=parse_budget(one_budget("batch_stream", budget, cost)),
        cost=resolve_cost(cost),
        strategy=resolve_stream_strategy(strategy),
        buffer_size=int(positive_int("buffer_size", buffer_size) or 1),
        max_batch_size=positive_int("max_batch_size", max_batch_size, allow_none=True),
        oversized=choice("oversized", oversized, OVERSIZED),
        collate_fn=collate_fn,
        **shuffle_options(seed, epoch, shuffle_buffer, buffer_size),
    )

