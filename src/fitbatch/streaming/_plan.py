"""Planners behind :mod:`fitbatch.streaming`: chunks of (positions, items, sizes) in, batches out.

Both planners only decide *which buffered items go together*; the batch lengths come from the
core kernels (:func:`fitbatch._kernels.batches.greedy_starts`, :func:`~fitbatch._kernels.batches.sum_starts`,
:func:`~fitbatch._kernels.batches.edge_counts`) and :func:`fitbatch.strategies.fit_buckets`, and the
oversized and budget rules from :mod:`fitbatch.plan._rules`, so a stream and an indexed plan of the
same data follow one engine.

Resume contract (relied on by :class:`fitbatch.streaming.BatchStream`): what a planner emits in
a round depends only on the items it holds, grouped per bucket in source order, and every
emitted batch is a *prefix* of what its bucket (or the sequential open run) holds. A restarted
stream that re-absorbs the not-yet-emitted items in one segment therefore emits exactly the
batches the uninterrupted stream still had to emit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import batches as K
from fitbatch._kernels import jit as _jit
from fitbatch._kernels import sorting as SK
from fitbatch._validate import choice
from fitbatch.costs import CostModel
from fitbatch.plan._rules import planning_budget
from fitbatch.strategies import Buckets, Sequential, Strategy
from fitbatch.strategies._buckets import fit_buckets
from fitbatch.streaming._shuffle import emission_key

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
STREAM_STRATEGIES = ("sequential", "buckets")
# Items read from the source per round; large enough to amortise the kernels' numpy calls.
CHUNK = 8192
# A sequential stream reads min(this, buffer_size) items per round and holds one round plus the
# open batch: larger rounds make fewer per-round calls, buffer_size bounds memory for big items.
SEQUENTIAL_CHUNK = 32768
# Bucket boundaries are refitted while fewer than this many sizes have been seen.
RESERVOIR = 1 << 16
# Buckets are fitted as narrow as for this many buffers' worth of the sizes seen: each then fills
# a couple of batches per that many buffers, so the fullest bucket is usually full when needed
# (36 with FILL_FLOOR: narrower than the 25 before, and the evictions that this brings are
# filled up from the buckets below; held-out sets of issue #39, bench/stream.py --tails
# --families: padding efficiency up on 15 of 16, batches the same or fewer on all 16).
VIRTUAL_BUFFERS = 36
# An evicted bucket short of its count takes the largest items of the buckets below up to it,
# those of at least this share of its top (smaller ones would pad the batch more than they save:
# at 0.85 the quotation-like lognormal(3, 1) fell to 0.949, at 0.95 fewer batches are saved)
EVICT_FILLS = True
FILL_FLOOR = 0.9


@dataclasses.dataclass
class Segment:
    """Items in source order with their stream positions and sizes."""

    items: list[Any]
    positions: IntArray
    sizes: FloatArray

    def __len__(self) -> int:
        return len(self.items)

    def take(self, index: IntArray) -> Segment:
        return Segment([self.items[i] for i in index.tolist()], self.positions[index], self.sizes[index])

    def cut(self, a: int, b: int) -> Segment:
        return Segment(self.items[a:b], self.positions[a:b], self.sizes[a:b])

    @staticmethod
    def join(parts: list[Segment]) -> Segment:
        if len(parts) == 1:
            return parts[0]
        items: list[Any] = []
        for p in parts:
            items.extend(p.items)
        return Segment(items, _cat([p.positions for p in parts], np.int64), _cat([p.sizes for p in parts], np.float64))


def _cat(arrays: list[Any], dtype: Any) -> Any:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def empty_segment() -> Segment:
    return Segment([], np.zeros(0, np.int64), np.zeros(0))


def plan_starts(sizes: FloatArray, budget: float, cost: CostModel, cap: int | None) -> IntArray:
    """Greedy batch starts from a fresh batch at position 0 (the indexed ``sequential`` plan).

    An unweighted sum cost searches prefix sums (compiled with the ``fast`` extra, else
    :func:`fitbatch._kernels.batches.sum_starts`); other costs run :func:`fitbatch._kernels.batches.greedy_starts`.
    """
    if K.plain_sum(cost) and sizes.size:
        compiled = _jit.prefix_sum_starts(sizes, budget, sizes.size if cap is None else cap)
        if compiled is not None:
            return compiled
        return K.sum_starts(sizes, budget, cap)
    starts, _ = K.greedy_starts(sizes, budget, cost, cap=cap)
    return starts


def split(seg: Segment, starts: IntArray) -> list[Segment]:
    bounds = np.append(starts, len(seg)).tolist()
    return [seg.cut(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class Run(NamedTuple):
    """A segment and the bounds of consecutive batches in it, so that thousands of small
    batches cost one list slice each, not an object each (the planners' output)."""

    seg: Segment
    bounds: list[int]
    cuts: IntArray | None = None  # ``bounds`` as an array, when the planner found them as one


def whole_runs(batches: list[Segment]) -> list[Run]:
    return [Run(b, [0, len(b)]) for b in batches]


def lower_budget(planner: SequentialPlanner | BucketPlanner, sizes: FloatArray) -> None:
    """Plan against :func:`fitbatch.plan._rules.planning_budget` once a fractional size shows up.

    The indexed planner follows the same rule, so both agree. The switch is sticky: a stream
    cannot know its later sizes.
    """
    if planner.integral and not _jit.all_integral(sizes):
        mark_fractional(planner)


def mark_fractional(planner: SequentialPlanner | BucketPlanner) -> None:
    """Plan against the lowered budget from now on (a fractional size was seen; a restore says so)."""
    if planner.integral:
        planner.integral = False
        planner.budget = planning_budget(planner.budget, integral=False)
        if isinstance(planner, BucketPlanner) and planner.tops is not None:
            planner.restore(planner.tops, planner.next_fit)
            planner.recounted = True


class SequentialPlanner:
    """Greedy in source order; the batch still open at a chunk's end waits for the next chunk."""

    def __init__(self, budget: float, cost: CostModel, cap: int | None, buffer_size: int = SEQUENTIAL_CHUNK) -> None:
        self.budget, self.cost, self.cap = budget, cost, cap
        self.chunk = max(1, min(SEQUENTIAL_CHUNK, buffer_size))
        self._open: list[Segment] = []
        self.integral = True
        self._held = 0
        self._carry: K.OpenBatch | None = None

    @property
    def held(self) -> int:
        return self._held

    def want(self) -> int:
        return self.chunk

    def absorb(self, seg: Segment) -> list[Run]:
        if not len(seg):
            return []
        if self._held <= self.chunk:
            # re-plan the open batch with the chunk: cheap (one batch) and allows the sum fast path
            whole = Segment.join([*self._open, seg])
            cuts = plan_starts(whole.sizes, self.budget, self.cost, self.cap)
            starts = cuts.tolist()
            last = starts[-1]
            self._open, self._held = [whole.cut(last, len(whole))], len(whole) - last
            self._carry = None
            return [Run(whole, starts, cuts)] if len(starts) > 1 else []
        # a long open batch (a huge budget): continue it with the kernel's carry, no re-planning
        carry = self._carry or self._carry_of(self._open)
        found, self._carry = K.greedy_starts(seg.sizes, self.budget, self.cost, cap=self.cap, carry=carry)
        if not found.size:
            self._open.append(seg)
            self._held += len(seg)
            return []
        starts = found.tolist()
        first = Segment.join([*self._open, seg.cut(0, starts[0])])
        self._open, self._held = [seg.cut(starts[-1], len(seg))], len(seg) - starts[-1]
        return [Run(first, [0, len(first)]), Run(seg, starts, found)]

    def _carry_of(self, parts: list[Segment]) -> K.OpenBatch:
        s = _cat([p.sizes for p in parts], np.float64)
        return K.OpenBatch(s.size, np.asarray(s.max()), np.asarray(s.sum()))

    def finish(self) -> list[Run]:
        out = whole_runs([Segment.join(self._open)]) if self._held else []
        self._open, self._held, self._carry = [], 0, None
        return out

    def held_segments(self) -> list[Segment]:
        return list(self._open)

    def final(self, seg: Segment) -> list[Run]:
        """Plan ``seg`` as the last items of an ended stream (what :meth:`finish` had planned)."""
        return self.absorb(seg) + self.finish()


class BucketPlanner:
    """Size buckets over a bounded buffer (see :func:`fitbatch.batch_stream`).

    Bucket ``b < len(tops)`` holds sizes in ``(tops[b-1], tops[b]]`` and emits a batch as soon as
    it holds ``counts[b]`` items (the count whose cost at size ``tops[b]`` fits); the last bucket
    holds sizes above every top and is planned greedily in source order. When the buffer is full
    the fullest bucket emits what it holds.
    """

    def __init__(
        self, budget: float, cost: CostModel, cap: int | None, buffer_size: int, strategy: Buckets, salt: int | None = None
    ) -> None:
        self.budget, self.cost, self.cap = budget, cost, cap
        self.salt = salt  # a seeded stream emits a round's batches by a keyed hash of their first position
        self.integral = True
        self.buffer_size = buffer_size
        self.strategy = strategy
        self.chunk = max(1, min(CHUNK, buffer_size // 4))
        # keep this much room free after a round so the next chunk fits in the buffer
        self.room = max(1, min(1024, buffer_size // 8))
        self.tops: FloatArray | None = None
        self.counts: IntArray = np.zeros(0, np.int64)
        self.reservoir: list[FloatArray] = []
        self.seen = 0  # sizes in the reservoir
        self.next_fit: int | None = None
        self._buckets: list[list[Segment]] = []
        self._lens: list[int] = []
        self._warm: list[Segment] = []
        self._held = 0
        # the bucket counts changed (a lowered budget): what is held is placed again, as after a refit
        self.recounted = False
        if strategy.boundaries is not None:
            self._set_tops(np.asarray(strategy.boundaries, dtype=np.float64))

    @property
    def held(self) -> int:
        return self._held

    @property
    def fitting(self) -> bool:
        """Whether boundaries are still being (re)fitted from the sizes seen so far."""
        return self.strategy.boundaries is None and (self.tops is None or self.next_fit is not None)

    def want(self) -> int:
        if self.tops is None:
            return min(self.chunk, self.buffer_size - self._held)
        return max(1, min(self.chunk, self.buffer_size - self._held))

    # ------------------------------------------------------------------ boundaries

    def observe(self, sizes: FloatArray) -> None:
        """Record sizes for the boundary estimate (the first ``RESERVOIR`` kept sizes)."""
        if self.wants_sizes():
            part = sizes[: max(RESERVOIR, self.buffer_size) - self.seen]
            self.reservoir.append(part)
            self.seen += part.size

    def _fit(self) -> None:
        seen = _cat(self.reservoir, np.float64)
        self.reservoir = [seen]
        # fit_buckets sizes buckets by how many items they get: scale the histogram (see VIRTUAL_BUFFERS)
        sample = np.tile(seen, max(1, -(-VIRTUAL_BUFFERS * self.buffer_size // max(seen.size, 1))))
        integral = bool(np.all(sample == np.floor(sample)))
        keys, edges = SK.size_keys(sample, integral)
        _, tops = fit_buckets(keys, edges, self.budget, self.cost, self.cap, self.strategy.spread, self.strategy.min_batches)
        self._set_tops(tops)
        limit = max(RESERVOIR, self.buffer_size)
        if seen.size >= limit:
            self.next_fit, self.reservoir = None, []
        else:
            self.next_fit = min(2 * seen.size, limit)

    def wants_sizes(self) -> bool:
        """Whether sizes are still recorded for the boundary estimate."""
        return self.fitting and self.seen < max(RESERVOIR, self.buffer_size)

    def restore(self, tops: FloatArray, next_fit: int | None) -> None:
        """Boundaries of a saved stream (the reservoir is rebuilt by :meth:`observe`)."""
        self._set_tops(tops)
        self.next_fit = next_fit

    def _set_tops(self, tops: FloatArray) -> None:
        self.tops = tops
        self.counts = K.edge_counts(tops, self.budget, self.cost, self.cap)

    # ------------------------------------------------------------------ rounds

    def absorb(self, seg: Segment) -> list[Run]:
        self.observe(seg.sizes)
        if self.tops is None:
            self._warm.append(seg)
            self._held += len(seg)
            if self._held < self.buffer_size:
                return []
            self._fit()
            seg, self._warm, self._held = Segment.join(self._warm), [], 0
        else:
            refit = self.next_fit is not None and self.seen >= self.next_fit
            if refit:
                self._fit()
            if refit or self.recounted:
                seg = Segment.join([*self._drain(), seg])
        self.recounted = False
        return self.place(seg)

    def _drain(self) -> list[Segment]:
        """Every held item, in source order, buckets emptied."""
        parts = [s for b in self._buckets for s in b] + self._warm
        self._buckets, self._lens, self._warm, self._held = [], [], [], 0
        if not parts:
            return []
        whole = Segment.join(parts)
        return [whole.take(np.argsort(whole.positions, kind="stable"))]

    def place(self, seg: Segment) -> list[Run]:
        tops = self.tops if self.tops is not None else np.zeros(0)
        n_buckets = tops.size + 1
        if not self._buckets:
            self._buckets = [[] for _ in range(n_buckets)]
            self._lens = [0] * n_buckets
        ids = np.searchsorted(tops, seg.sizes, side="left")
        order = np.argsort(ids, kind="stable")
        bounds = np.searchsorted(ids[order], np.arange(n_buckets + 1)).tolist()
        out: list[Segment] = []
        for b in range(n_buckets):
            if bounds[b] < bounds[b + 1]:
                self._buckets[b].append(seg.take(order[bounds[b] : bounds[b + 1]]))
                self._lens[b] += bounds[b + 1] - bounds[b]
                self._held += bounds[b + 1] - bounds[b]
                out.extend(self._full(b))
        if self.salt is None:
            out.sort(key=lambda s: int(s.positions[0]))
        else:
            salt = self.salt
            out.sort(key=lambda s: emission_key(int(s.positions[0]), salt))
        while self._held > self.buffer_size - self.room and self._held:
            out.append(self._evict())
        return whole_runs(out)

    def _full(self, b: int) -> list[Segment]:
        """Emit the bucket's full batches (a prefix of what it holds)."""
        if b < self.counts.size:
            count = int(self.counts[b])
            if self._lens[b] < count:
                return []
            whole = Segment.join(self._buckets[b])
            k = len(whole) // count * count
            out = [whole.cut(a, a + count) for a in range(0, k, count)]
        else:  # above every top: greedy in source order, the open batch stays
            whole = Segment.join(self._buckets[b])
            parts = split(whole, plan_starts(whole.sizes, self.budget, self.cost, self.cap))
            out, k = parts[:-1], len(whole) - len(parts[-1])
        self._keep(b, [whole.cut(k, len(whole))] if k < len(whole) else [])
        return out

    def _keep(self, b: int, rest: list[Segment]) -> None:
        kept = sum(len(s) for s in rest)
        self._held -= self._lens[b] - kept
        self._buckets[b], self._lens[b] = rest, kept

    def _fill(self, b: int) -> float:
        if not self._lens[b]:
            return -1.0
        if b < self.counts.size:
            return self._lens[b] / float(self.counts[b])
        sizes = _cat([s.sizes for s in self._buckets[b]], np.float64)
        one = np.ones(1)
        return float(self.cost.evaluate(one * sizes.size, sizes.max(keepdims=True), sizes.sum(keepdims=True))[0]) / self.budget

    def _evict(self) -> Segment:
        fills = [self._fill(b) for b in range(len(self._buckets))]
        b = int(np.argmax(fills))  # ties: the smallest sizes first
        whole = Segment.join(self._buckets[b])
        if b < self.counts.size:
            count = min(len(whole), int(self.counts[b]))
        else:
            count = int(np.append(plan_starts(whole.sizes, self.budget, self.cost, self.cap), len(whole))[1])
        self._keep(b, [whole.cut(count, len(whole))] if count < len(whole) else [])
        batch = whole.cut(0, count)
        if b < self.counts.size and count < int(self.counts[b]) and EVICT_FILLS:
            batch = self._filled(b, batch)
        return batch

    def _filled(self, b: int, batch: Segment) -> Segment:
        """An evicted batch of bucket ``b`` short of its count, filled up to it with the largest
        items of the buckets below (all at most ``tops[b]``, so the batch still fits): one full
        batch where a short one would leave the smaller sizes a batch more to fill."""
        need = int(self.counts[b]) - len(batch)
        top = float(self.tops[b]) if self.tops is not None else 0.0
        parts = [batch]
        for lower in range(b - 1, -1, -1):
            if need <= 0:
                break
            if not self._lens[lower]:
                continue
            held = Segment.join(self._buckets[lower])
            largest = np.argsort(-held.sizes, kind="stable")
            take = min(need, int(np.count_nonzero(held.sizes >= FILL_FLOOR * top)))
            if take == 0:
                break
            chosen = np.sort(largest[:take])
            rest = np.sort(largest[take:])
            parts.append(held.take(chosen))
            self._keep(lower, [held.take(rest)] if rest.size else [])
            need -= take
        return Segment.join(parts)

    def finish(self) -> list[Run]:
        """Flush: every held item, planned together sorted by size (as the core ``sorted`` plan).

        Exactly sorted (ties by stream position) and cut greedily from the largest, then emitted
        smallest first: the items left after any number of these batches are a prefix of that
        order, which cuts the same way, so a stream restored after its source ended plans the
        rest exactly (sort keys fitted to the set, as ``plan_batches`` uses, would not).
        """
        parts = self._drain()
        if not parts:
            return []
        rest = parts[0]
        down = np.lexsort((rest.positions, -rest.sizes))
        starts = plan_starts(rest.sizes[down], self.budget, self.cost, self.cap)
        n = len(rest)
        offsets = (n - np.append(starts, n))[::-1].astype(np.int64)  # the order reversed: smallest first
        return [Run(rest.take(down[::-1].copy()), offsets.tolist(), offsets)] if n else []

    def held_segments(self) -> list[Segment]:
        return [s for b in self._buckets for s in b] + list(self._warm)

    def final(self, seg: Segment) -> list[Run]:
        """Plan ``seg`` as the last items of an ended stream (what :meth:`finish` had planned)."""
        self._warm.append(seg)
        self._held += len(seg)
        return self.finish()


def to_runs(positions: IntArray) -> list[list[int]]:
    """Sorted positions as [first, length] runs (a sequential stream's pending items are one run)."""
    if positions.size == 0:
        return []
    p = np.sort(positions)
    cut = np.flatnonzero(np.diff(p) != 1) + 1
    firsts = p[np.concatenate([[0], cut])]
    lengths = np.diff(np.concatenate([[0], cut, [p.size]]))
    return [[int(a), int(n)] for a, n in zip(firsts, lengths, strict=True)]


def from_runs(runs: Any) -> IntArray:
    parts = [np.arange(int(a), int(a) + int(n), dtype=np.int64) for a, n in runs]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def resolve_stream_strategy(strategy: str | Strategy) -> Strategy:
    if isinstance(strategy, (Sequential, Buckets)):
        return strategy
    if isinstance(strategy, Strategy):
        raise ValueError(f"a stream supports the strategies {STREAM_STRATEGIES}, got {strategy!r}")
    name = choice("strategy", strategy, STREAM_STRATEGIES)
    return Sequential() if name == "sequential" else Buckets()
