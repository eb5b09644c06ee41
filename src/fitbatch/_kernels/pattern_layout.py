"""One epoch of histogram patterns laid out: who goes where, and in which batch order.

The patterns of :mod:`fitbatch._kernels.packing_depth` say which lengths share a batch, and how
many times; an epoch only draws which sample of a length fills which place and the order of the
batches. Three steps, each a pass of a few nanoseconds per sample:

1. **grouped**: the positions by descending length, in index order within a length (a stable
   counting sort);
2. **drawn**: each length's positions shuffled (``Generator.shuffle`` of each length's block,
   blocks in order), and the batches' sequence drawn: one pattern label per batch, every
   arrangement of the labels equally likely (in cache-sized pieces: see :func:`_sequence`);
3. **laid out**: the batches written in that sequence, each place of a length taking that
   length's next drawn position (a read from one of a few hundred blocks, each in order).

The plan needs no other batch order (the batches are in their epoch's order already), and each
batch's count, longest and total come from its pattern (nothing read per sample). With the
``fast`` extra the three loops run compiled (:mod:`fitbatch._kernels.compiled_histogram`: the
shuffles are numpy's own, draw for draw, fed with the generator's raw outputs); without it numpy
does the same (stable argsorts and ``Generator.shuffle``): the same plan.

>>> import numpy as np
>>> sizes = np.array([5, 1, 3, 5, 2, 1])
>>> out = lay_out_drawn(sizes, np.bincount(sizes), [(2, (5, 1)), (1, (3, 2))], None, None)
>>> out.order.tolist(), out.offsets.tolist(), out.kind.tolist(), out.total.tolist(), out.tail
([0, 1, 3, 5, 2, 4], [0, 2, 4, 6], [0, 0, 1], [6.0, 5.0], 2)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import jit as _jit

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
Pattern = tuple[int, tuple[int, ...]]  # (times taken, lengths of one batch, longest first)

#: steps whose draws the compiled shuffle finds before making their swaps
STEPS = 1 << 14
#: batches of the drawn sequence shuffled at a time (512 KiB of labels: in the cache)
PIECE = 1 << 18


@dataclasses.dataclass(frozen=True)
class Layout:
    """An epoch's batches: positions in batch order, where each batch starts (and the end), each
    batch's pattern (``kind``), per pattern the count, longest and total size of its batches,
    and the batch that ended the plan (the last pattern's last batch, a ``drop_last``
    candidate; -1 when there is none)."""

    order: IntArray
    offsets: IntArray
    kind: NDArray[Any]
    count: IntArray
    longest: FloatArray
    total: FloatArray
    tail: int


@dataclasses.dataclass(frozen=True)
class _Tables:
    """The patterns as arrays: per pattern its batches, width, longest and total size and where
    its lengths start in ``item`` (the patterns' lengths, longest first, pattern after pattern)."""

    times: IntArray
    width: IntArray
    longest: FloatArray
    total: FloatArray
    first_item: IntArray
    item: IntArray


def lay_out_drawn(
    level: NDArray[Any], counts: IntArray, patterns: Sequence[Pattern],
    within: np.random.Generator | None, sequence: np.random.Generator | None,
) -> Layout:
    """``patterns`` (taking each sample of ``counts`` once) laid out for an epoch: positions drawn
    within each length from ``within`` and the batch sequence from ``sequence`` (``None``: in
    index order, and the batches pattern by pattern, as listed).

    ``level`` holds each position's length (in ``[0, len(counts) - 1]``); ``counts[v]`` is the
    number of positions of length ``v``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n, top = int(level.shape[0]), counts.size - 1
    tables = _tables(counts, patterns, n)
    loops = _loops(n)
    by_length = _grouped(level, counts, top, loops)
    if within is not None:
        desc = counts[::-1]
        _shuffle(by_length, np.concatenate([[0], np.cumsum(desc)]).astype(np.int64), within, loops)
    holding: list[tuple[int, int]] = []
    labels = _sequence(tables.times, sequence, loops, holding)
    last = tables.times.size - 1
    order, offsets = _written(labels, by_length, counts, tables, loops)
    del by_length
    start, end = holding[-1] if holding else (0, labels.size)
    tail = -1 if not labels.size else start + _last(labels[start:end], last)
    return Layout(order, offsets, labels, tables.width, tables.longest, tables.total, tail)


def _last(labels: NDArray[Any], label: int) -> int:
    """Where ``label`` is last in ``labels`` (not empty), looked for from the end in growing
    pieces (no array of the whole length); the last place when it is not there.

    >>> _last(np.array([0, 1, 0, 2, 2]), 0), _last(np.array([1, 1]), 0)
    (2, 1)
    """
    end, step = labels.size, 1 << 12
    while end > 0:
        start = max(0, end - step)
        hit = np.flatnonzero(labels[start:end] == label)
        if hit.size:
            return start + int(hit[-1])
        end, step = start, step * 4
    return labels.size - 1


def _sequence(
    times: IntArray, rng: np.random.Generator | None, loops: ModuleType | None, holding: list[tuple[int, int]] | None = None
) -> NDArray[Any]:
    """One pattern label per batch (pattern ``p`` ``times[p]`` times), in a drawn order: every
    arrangement equally likely (``rng=None``: pattern by pattern).

    The sequence is drawn in pieces of :data:`PIECE` batches, so that each shuffle stays in the
    cache: how many batches of each pattern a piece holds is drawn first for every piece (a
    multivariate hypergeometric draw from those left, as a uniform arrangement cut there would
    hold), then each piece is shuffled (``Generator.shuffle``). ``holding``, when given, gets
    the bounds of the pieces that hold the last pattern (where the plan's tail batch is)."""
    label = np.uint16 if times.size <= 1 << 16 else np.int64
    patterns = np.arange(times.size, dtype=label)
    total = int(times.sum())
    if rng is None or total <= 1:
        return np.repeat(patterns, times)
    left = np.asarray(times, dtype=np.int64).copy()
    labels = np.empty(total, dtype=label)
    bounds = [0]
    while bounds[-1] < total:
        size = min(PIECE, total - bounds[-1])
        held = rng.multivariate_hypergeometric(left, size) if size < left.sum() else left.copy()
        left -= held
        labels[bounds[-1] : bounds[-1] + size] = np.repeat(patterns, held)
        if holding is not None and held[-1]:
            holding.append((bounds[-1], bounds[-1] + size))
        bounds.append(bounds[-1] + size)
    _shuffle(labels, np.asarray(bounds, dtype=np.int64), rng, loops)
    return labels


def _tables(counts: IntArray, patterns: Sequence[Pattern], n: int) -> _Tables:
    """The patterns' tables (see :class:`_Tables`); ``ValueError`` unless they take every sample
    of ``counts`` once."""
    top = counts.size - 1
    times = np.asarray([t for t, _ in patterns], dtype=np.int64)
    width = np.asarray([len(items) for _, items in patterns], dtype=np.int64)
    item = np.asarray([x for _, items in patterns for x in items], dtype=np.int64)
    if item.size and (item.min() < 0 or item.max() > top):
        raise ValueError(f"patterns: a length is outside the counts' range [0, {top}]")
    taken = np.bincount(item, weights=np.repeat(times, width), minlength=counts.size) if item.size else np.zeros(counts.size)
    at = int(times @ width) if times.size else 0
    if at != n or not np.array_equal(taken, counts):
        raise ValueError(f"patterns: they take {at} samples in all, not each of the {n} once")
    first_item = np.zeros(times.size + 1, dtype=np.int64)
    np.cumsum(width, out=first_item[1:])
    return _Tables(
        times=times,
        width=width,
        longest=np.asarray([max(items, default=0) for _, items in patterns], dtype=np.float64),
        total=np.asarray([sum(items) for _, items in patterns], dtype=np.float64),
        first_item=first_item,
        item=item,
    )


def _loops(work: int) -> ModuleType | None:
    """The compiled loops, when :mod:`fitbatch._kernels.jit` has numba for ``work`` samples
    (``None``: numpy; the plan is the same)."""
    if _jit._kernels(work) is None:
        return None
    return _jit.companion("compiled_histogram", now=True)


def _grouped(level: NDArray[Any], counts: IntArray, top: int, loops: ModuleType | None) -> NDArray[Any]:
    """The positions by descending ``level``, in index order within a level (int32 below
    ``2**31`` positions)."""
    n = int(level.shape[0])
    out = np.empty(n, dtype=np.int32 if n < 1 << 31 else np.int64)
    if loops is not None:
        desc = counts[::-1]
        at = np.cumsum(desc) - desc  # indexed by top - level
        keys = level if level.dtype == np.uint16 else level.astype(np.int64, copy=False)
        loops.group_by_level(np.ascontiguousarray(keys), int(top), at, out)
        return out
    down = (np.int64(top) - level.astype(np.int64, copy=False)) if top >= 1 << 16 else (top - level).astype(np.uint16)
    out[:] = np.argsort(down, kind="stable")
    return out


def _shuffle(x: NDArray[Any], bounds: IntArray, rng: np.random.Generator, loops: ModuleType | None) -> None:
    """``rng.shuffle(x[bounds[d]:bounds[d + 1]])`` for every block in turn, in place (compiled:
    the same swaps, from the same draws)."""
    if loops is not None and x.flags.c_contiguous and type(rng.bit_generator) is np.random.PCG64 and _same_shuffle(loops):
        _compiled_shuffle(x, bounds, rng, loops)
        return
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if b - a > 1:
            rng.shuffle(x[a:b])


def _compiled_shuffle(x: NDArray[Any], bounds: IntArray, rng: np.random.Generator, loops: ModuleType) -> None:
    """The compiled :func:`_shuffle`: numpy's PCG64 run in the loop from the generator's state,
    which is set to where numpy's shuffle would leave it (``ValueError`` for another bit
    generator: its draws are not known)."""
    state = rng.bit_generator.state
    if state.get("bit_generator") != "PCG64":
        raise ValueError(f"the compiled shuffle follows PCG64's draws, not {state.get('bit_generator')!r}'s")
    inner, mask = state["state"], (1 << 64) - 1
    at, inc = int(inner["state"]), int(inner["inc"])
    words = np.array([at >> 64, at & mask, inc >> 64, inc & mask, int(state["has_uint32"]), int(state["uinteger"])], dtype=np.uint64)
    loops.shuffle_blocks(x, bounds, words, np.empty(STEPS, dtype=np.int64))
    high, low, _, _, kept, half = (int(w) for w in words)
    rng.bit_generator.state = {**state, "state": {"state": high << 64 | low, "inc": inc}, "has_uint32": kept, "uinteger": half}


@functools.lru_cache(maxsize=1)
def _same_shuffle(loops: ModuleType) -> bool:
    """Whether the compiled shuffle swaps as this numpy's ``Generator.shuffle`` does (checked
    once per process on a few blocks; when not, numpy shuffles: the plan never depends on numba)."""
    bounds = np.array([0, 1, 40, 40, 1000, 71_000], dtype=np.int64)
    mine, theirs = np.arange(71_000, dtype=np.int32), np.arange(71_000, dtype=np.int32)
    ours, numpys = (np.random.Generator(np.random.PCG64(20_211_128)) for _ in range(2))
    ours.integers(0, 1 << 20, dtype=np.uint32), numpys.integers(0, 1 << 20, dtype=np.uint32)  # a half kept
    _compiled_shuffle(mine, bounds, ours, loops)
    _shuffle(theirs, bounds, numpys, None)
    same = bool(np.array_equal(mine, theirs)) and ours.bit_generator.state == numpys.bit_generator.state
    if not same:
        logger.warning("this numpy shuffles otherwise than the compiled loop: numpy lays out histogram plans")
    return same


def _written(
    labels: NDArray[Any], by_length: NDArray[Any], counts: IntArray, tables: _Tables, loops: ModuleType | None
) -> tuple[IntArray, IntArray]:
    """The positions in batch order (int64) and the batch offsets, batches in the sequence
    ``labels``, each place of length ``v`` taking the next position of ``v`` in ``by_length``
    (the positions by descending length)."""
    n, m, top = int(by_length.shape[0]), int(labels.shape[0]), counts.size - 1
    desc = counts[::-1]
    at = (np.cumsum(desc) - desc)[::-1].copy()  # where each length's block starts, by length
    offsets = np.empty(m + 1, dtype=np.int64)
    if loops is not None:
        order = np.empty(n, dtype=np.int64)
        loops.lay_out_sequence(labels, by_length, tables.first_item, tables.item, at, order, offsets)
        return order, offsets
    offsets[0] = 0
    np.cumsum(tables.width[labels], out=offsets[1:])
    # the length of every place in batch order; places of a length in order take its positions in order
    places = np.repeat(tables.first_item[labels] - offsets[:-1], tables.width[labels]) + np.arange(n, dtype=np.int64)
    length = tables.item[places]
    del places
    down = (top - length).astype(np.uint16) if top < 1 << 16 else top - length
    order = np.empty(n, dtype=np.int64)
    order[np.argsort(down, kind="stable")] = by_length
    return order, offsets


def per_batch(kind: NDArray[Any], values: FloatArray) -> FloatArray:
    """Each batch's values from its kind's: ``values[:, kind]`` (``values``: one row of float64
    per quantity), compiled as one pass with the ``fast`` extra.

    >>> per_batch(np.array([1, 0, 1], np.uint16), np.array([[5.0, 6.0], [10.0, 18.0]])).tolist()
    [[6.0, 5.0, 6.0], [18.0, 10.0, 18.0]]
    """
    loops = _loops(0)
    values = np.ascontiguousarray(values, dtype=np.float64)
    if loops is None:
        return values[:, kind]
    out = np.empty((values.shape[0], kind.shape[0]), dtype=np.float64)
    loops.gather_kinds(np.ascontiguousarray(kind), values, out)
    return out
