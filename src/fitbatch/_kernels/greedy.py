"""The in-order greedy over sizes in any order, any cost model: batch start positions.

A batch is a maximal run of consecutive positions whose cost fits the budget, never crossing a
position that must start a batch, a lone sample over budget forming a batch of its own.
:func:`greedy_starts` picks the cheapest of three forms that give the same starts:

* with the ``fast`` extra (numba), the built-in cost models run a compiled per-sample loop
  (:mod:`fitbatch._kernels.jit`: the same arithmetic);
* few batches are walked one at a time, each end found by vectorised windows of doubling width
  (a few numpy steps per batch);
* many are chunked: the greedy runs in lock-step over all chunks at once (one numpy step per
  position *within* a chunk), then each chunk seam is repaired sequentially: the true chain
  entering a chunk is simulated with vectorised windows until it meets the chunk's local chain,
  after which the two coincide;
* when those chains do not meet (near-equal sizes in a row, as the pooled levels lay them out)
  and the cost reads only the count and padded length, the rest is chained from every
  position's batch end, found for all positions at once by binary lifting.

"Few" is judged before planning: a batch costs at least its samples alone, so when their costs
sum to about one budget per chunk or less, the walk goes first; should it find more than twice
that many batches, it hands the rest of the sequence, at a batch start, to the chunks.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import jit as _jit
from fitbatch.costs import CostModel, PaddedCost, PaddedPolynomial

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


class OpenBatch(NamedTuple):
    """The batch still open at the end of a sequence: carried into the next call (streaming)."""

    count: int  # type: ignore[assignment]  # shadows tuple.count; the name is public API
    max_size: FloatArray  # shape () for 1-D sizes, (D,) for D-dimensional ones
    sum_size: FloatArray





class _Greedy(NamedTuple):
    """What one greedy scan works on: sizes in order, the budget and cost, the count cap
    (``inf``: none) and the positions that must start a batch."""

    sizes: FloatArray
    budget: float
    cost: CostModel
    cap: float
    force: NDArray[np.bool_] | None


def _window_next(g: _Greedy, p: int, end: int, state: OpenBatch) -> tuple[int, OpenBatch]:
    """First position q in [p, end) that must start a new batch when ``state`` is open at p.

    Returns (q, state of the open batch just before q); q == end when no new batch starts.
    """
    sizes, budget, cost, cap, force = g
    count, mx, sm = state.count, state.max_size, state.sum_size
    width = 64
    while p < end:
        stop = min(end, p + width)
        x = sizes[p:stop]
        run_max = np.maximum(np.maximum.accumulate(x, axis=0), mx)
        # sm + x[0], then + x[1], ...: the compiled kernel's additions in its order (cumsum(x) + sm
        # rounds otherwise, and fractional sums would give other batches)
        run_sum = np.array(x, dtype=np.float64)
        run_sum[0] += sm
        np.cumsum(run_sum, axis=0, out=run_sum)
        run_count = count + np.arange(1, stop - p + 1, dtype=np.float64)
        bad = (cost.evaluate(run_count, run_max, run_sum) > budget) | (run_count > cap)
        if force is not None:
            bad |= force[p:stop]
        if count == 0:
            bad[0] = False  # an empty batch always takes its first sample
        if bad.any():
            k = int(bad.argmax())
            if k == 0:
                return p, OpenBatch(count, mx, sm)
            return p + k, OpenBatch(count + k, run_max[k - 1], run_sum[k - 1])
        count, mx, sm = count + (stop - p), run_max[-1], run_sum[-1]
        p = stop
        width *= 4
    return end, OpenBatch(count, mx, sm)


def _open_batch(sizes: FloatArray, start: int, end: int) -> OpenBatch:
    part = sizes[start:end]
    # added in order, as the compiled loop does (np.sum adds pairwise: other roundings)
    total = np.add.accumulate(part, axis=0)[-1] if end > start else np.zeros(sizes.shape[1:])
    return OpenBatch(end - start, part.max(axis=0), total)


def _empty_state(sizes: FloatArray) -> OpenBatch:
    zero = np.zeros(sizes.shape[1:], dtype=np.float64)
    return OpenBatch(0, zero, zero.copy())


def greedy_starts(
    sizes: FloatArray,
    budget: float,
    cost: CostModel,
    *,
    cap: int | None = None,
    multiple: int = 1,
    force: NDArray[np.bool_] | None = None,
    carry: OpenBatch | None = None,
) -> tuple[IntArray, OpenBatch]:
    """Greedy batch starts over ``sizes`` (shape (n,) or (n, D)) in the given order.

    ``force`` marks positions that must start a batch (segment starts). ``carry`` is a batch
    left open by a previous call, continued at position 0. With ``multiple > 1`` each batch of
    at least ``multiple`` samples is cut back to a multiple of it (the rest starts the next
    batch); that path always walks.

    Returns the start positions (int64, ascending) and the batch still open at the end.
    """
    n = sizes.shape[0]
    capf = math.inf if cap is None else float(cap)
    state = carry if carry is not None else _empty_state(sizes)
    if n == 0:
        return np.zeros(0, np.int64), state
    g = _Greedy(sizes, budget, cost, capf, force)
    if multiple > 1:
        starts, state, _ = _walk_windows(g, multiple, state)
        return starts, state
    compiled = _jit.greedy(sizes, budget, cost, capf, force, state.count, state.max_size, state.sum_size)
    if compiled is not None:
        starts, (count, mx, sm) = compiled
        return starts, OpenBatch(count, np.asarray(mx), np.asarray(sm))
    # (not while numba loads in the background: a Python loop holding the GIL starves the
    # loader's file reads, which then take seconds instead of about one)
    if n <= SCALAR_AT and sizes.ndim == 1 and type(cost) is PaddedCost and not _jit.loading():
        return _padded_scalar(sizes, budget, capf, force, state)
    chunk = _chunk(n)
    head, at = np.zeros(0, np.int64), 0
    # batches cost at least their samples alone, and each forced start begins one: when that
    # allows few batches (about one per chunk), walk them, handing over only past twice that
    # many (an order may start short)
    alone = cost.sample_cost(sizes)
    with np.errstate(over="ignore"):  # a total past float64: inf, many batches (walked in lock-step)
        least = max(float(np.sum(alone)) / budget, 0 if force is None else int(np.count_nonzero(force)))
    if least <= n / chunk:
        head, state, at = _walk_windows(g, 1, state, most=2 * (n // chunk))
    if at >= n:
        return head, state
    # the rest from `at` (a batch start: a fresh batch unless nothing was walked) in lock-step
    rest = g._replace(sizes=sizes[at:], force=None if force is None else force[at:])
    chunk = _chunk(n - at)
    lift = alone[at:] if sizes.ndim == 1 and type(cost) in _LIFTED else None
    tail, state = _repair_seams(rest, chunk, _lockstep(rest, chunk, state), state, lift)
    return np.concatenate([head, tail + at]), state


# numpy: sets of up to this many samples under the padded cost run the greedy as a plain Python
# loop over the sizes (~0.1 us a sample, no numpy call per batch or per chunk position): faster
# than the numpy forms up to a few 100k samples (at 100k, 8-10 ms against 11-15 ms; at 1M, even)
SCALAR_AT = 1 << 18


def _padded_scalar(
    sizes: FloatArray, budget: float, cap: float, force: NDArray[np.bool_] | None, state: OpenBatch
) -> tuple[IntArray, OpenBatch]:
    """The in-order greedy under :class:`PaddedCost` (1-D sizes) as one Python loop: the compiled
    kernel's arithmetic (``(count + 1) * max(longest, size) > budget``, in float64), so the
    same starts.

    >>> _padded_scalar(np.array([3.0, 4.0, 1.0, 9.0]), 9.0, math.inf, None, _empty_state(np.zeros(1)))[0].tolist()
    [0, 2, 3]
    """
    starts: list[int] = []
    add = starts.append
    count, mx = float(state.count), float(state.max_size)
    budget, sm = float(budget), float(state.sum_size)
    if force is None and cap == math.inf:  # the common case, a third faster: no flags, no cap
        values = sizes.tolist()
        first = 0
        if count == 0.0 and values:  # an empty batch takes its first sample
            add(0)
            count, mx, first = 1.0, values[0], 1
        for t in range(first, len(values)):
            x = values[t]
            m = mx if mx >= x else x
            c = count + 1.0
            if c * m > budget:
                add(t)
                count, mx = 1.0, x
            else:
                count, mx = c, m
    else:
        flags = [False] * sizes.shape[0] if force is None else force.tolist()
        for t, (x, forced) in enumerate(zip(sizes.tolist(), flags)):
            m = mx if mx >= x else x
            c = count + 1.0
            if count == 0.0 or forced or c * m > budget or c > cap:
                add(t)
                count, mx = 1.0, x
            else:
                count, mx = c, m
    if starts:  # the open batch: from the last start, its sizes added in order
        last = starts[-1]
        sm = float(np.add.accumulate(sizes[last:])[-1])
    else:  # the carried batch goes on: added to its sum in order, as the loop would
        for x in sizes.tolist():
            sm += x
    return np.asarray(starts, dtype=np.int64), OpenBatch(int(count), np.asarray(mx), np.asarray(sm))


_LIFTED = (PaddedCost, PaddedPolynomial)  # sum-free, non-decreasing in count and length
LIFT_POSITIONS = 700  # positions x levels of lifting that cost what one window step does
LIFT_BLOCK = 1 << 16  # starts whose batch ends are found together (memory: ~ 8 B x levels each)


def _chain_starts(g: _Greedy, state: OpenBatch, levels: int) -> tuple[IntArray, OpenBatch]:
    """Greedy starts for a cost of count and padded length alone, from the batch ends.

    The batch starting fresh at each position ends where the next starts: found for every
    position at once by binary lifting over windows of 2**k positions (a batch fits while its
    count and longest sample fit, so the end is the longest run that fits). The greedy's
    starts are then the chain of ends from the first batch, one list lookup per batch. A
    batch longer than the ``2**levels`` positions the windows reach is walked when the chain
    meets it.
    """
    sizes, force = g.sizes, g.force
    n = sizes.shape[0]
    first = 0
    if state.count:
        first, state = _window_next(g, 0, n, state)
        if first >= n:
            return np.zeros(0, np.int64), state
    forced = None if force is None else np.append(np.flatnonzero(force), n)
    starts: list[int] = []
    reach: list[int] = []
    p, lo = first, 0
    while p < n:
        if p >= lo + len(reach):  # the ends of a block of starts from p: found together
            lo = p
            ends = _batch_ends(g, lo, min(n, lo + LIFT_BLOCK), levels)
            here = np.arange(lo, lo + ends.size)
            if forced is not None:  # up to the next forced start
                ends = np.where(ends < 0, ends, np.minimum(ends, forced[np.searchsorted(forced, here, side="right")]))
            if g.cap < math.inf:
                ends = np.where(ends < 0, ends, np.minimum(ends, here + int(g.cap)))
            reach = ends.tolist()
        starts.append(p)
        q = reach[p - lo]
        if q < 0:  # past the lifted windows: walk this batch
            q, _ = _window_next(g, p, n, _empty_state(sizes))
        p = q
    return np.asarray(starts, dtype=np.int64), _open_batch(sizes, starts[-1], n)


def _lift_levels(alone: FloatArray, budget: float) -> int:
    """How many window widths (2**0 .. 2**(levels - 1)) to lift over, from the samples' costs
    alone (``alone``): each level costs a few vectorised steps over all positions, and every
    batch longer than ``2**levels`` a walk (about :data:`LIFT_POSITIONS` positions' worth).
    A batch that long holds only samples that cost ``budget / 2**levels`` or less alone, so
    at most that many samples / ``2**levels`` batches are walked.

    >>> _lift_levels(np.full(10_000, 100.0), 1000.0)  # ten a batch: no walks from 4 levels
    4
    """
    n = alone.shape[0]
    step = max(1, n // 65536)  # counted on a regular sample of positions
    depth = np.log2(budget / np.maximum(alone[::step], budget / 8192.0))  # up to 13
    small = np.bincount(np.clip(depth, 0, 13).astype(np.int64), minlength=14)[::-1].cumsum()[::-1] * step
    levels = np.arange(1, 13)
    spent = levels * float(n) + small[levels] / 2.0**levels * LIFT_POSITIONS
    return int(levels[int(np.argmin(spent))])


def _batch_ends(g: _Greedy, lo: int, hi: int, levels: int) -> IntArray:
    """Where the batch starting fresh at each position of [lo, hi) would end without forced
    starts or a count cap (``-1``: it holds ``2**levels`` samples, all the windows reach, and
    may go on)."""
    sizes, budget, cost = g.sizes, g.budget, g.cost
    n = sizes.shape[0]
    top = min(n, hi + (1 << levels))
    window = [sizes[lo:top].astype(np.float64, copy=False)]  # window[k][i]: max of 2**k from lo + i
    for k in range(1, levels):
        prev, half = window[-1], 1 << (k - 1)
        window.append(np.maximum(prev[:-half], prev[half:]))
    start = np.arange(lo, hi, dtype=np.int64)
    end = start + 1  # a batch always takes its first sample
    longest = window[0][: hi - lo]
    # Invariant: [start, end) fits and holds the longest sample `longest`; every extension by
    # the windows tried so far failed, so the true end lies before end + 2**k.
    for k in range(levels - 1, -1, -1):
        width = 1 << k
        if window[k].size == 0:
            continue  # no window of this width fits before the end
        inside = end + width <= top
        grown = np.maximum(longest, window[k][np.where(inside, end - lo, 0)])
        fits = inside & (cost.evaluate((end + width - start).astype(np.float64), grown, grown) <= budget)
        end = np.where(fits, end + width, end)
        longest = np.where(fits, grown, longest)
    return np.where((end - start >= 1 << levels) & (end < n), -1, end)


def _chunk(n: int) -> int:
    """Positions per chunk of the lock-step scan over ``n`` (about sqrt(n) steps and seams)."""
    return int(min(4096, max(64, math.isqrt(n))))


def _lockstep(g: _Greedy, chunk: int, carry: OpenBatch) -> NDArray[np.bool_]:
    """Greedy start flags computed independently in every chunk, all chunks at once."""
    sizes, budget, cost, cap, force = g
    n, tail = sizes.shape[0], sizes.shape[1:]
    n_chunks = -(-n // chunk)
    grid = np.zeros((n_chunks * chunk, *tail), dtype=np.float64)
    grid[:n] = sizes
    # (chunk, n_chunks[, D]): row t holds position t of every chunk, contiguous for the scan.
    grid = np.ascontiguousarray(np.swapaxes(grid.reshape(n_chunks, chunk, *tail), 0, 1))
    fgrid = None
    if force is not None:
        fpad = np.zeros(n_chunks * chunk, dtype=bool)
        fpad[:n] = force
        fgrid = np.ascontiguousarray(fpad.reshape(n_chunks, chunk).T)
    flags = np.empty((chunk, n_chunks), dtype=bool)
    count = np.zeros(n_chunks)
    mx = np.zeros((n_chunks, *tail))
    sm = np.zeros((n_chunks, *tail))
    count[0], mx[0], sm[0] = carry.count, carry.max_size, carry.sum_size
    expand = (slice(None),) + (None,) * len(tail)
    # Invariant: before row t, (count, mx, sm)[c] describe the batch open in chunk c after its
    # first t positions, assuming chunk c (c > 0) started a fresh batch at its first position.
    for t in range(chunk):
        x = grid[t]
        new_count = count + 1
        new_max = np.maximum(mx, x)
        new_sum = sm + x
        start = cost.evaluate(new_count, new_max, new_sum) > budget
        if cap < math.inf:
            start |= new_count > cap
        if fgrid is not None:
            start |= fgrid[t]
        if t == 0:
            start[1:] = True  # chunks assume a fresh batch at their first position
            if carry.count == 0:
                start[0] = True
        flags[t] = start
        count = np.where(start, 1.0, new_count)
        mx = np.where(start[expand], x, new_max)
        sm = np.where(start[expand], x, new_sum)
    return flags.T.reshape(-1)[:n].copy()


def _repair_seams(
    g: _Greedy, chunk: int, local: NDArray[np.bool_], carry: OpenBatch, alone: FloatArray | None = None
) -> tuple[IntArray, OpenBatch]:
    """Make chunk-local start flags globally correct, chunk by chunk, left to right.

    Chains that meet soon after a seam (sizes in random order) make this a few vectorised steps
    a seam. In an order of near-equal sizes they can run out of phase for a whole chunk; for a
    cost of count and padded length alone (``alone``: each sample's cost alone) the rest is
    then chained from lifted batch ends (:func:`_chain_starts`) once the seams so far took
    more window steps than lifting their chunks would cost (:data:`LIFT_POSITIONS`).
    """
    sizes = g.sizes
    n = sizes.shape[0]
    open_start: int | None = None  # None: the batch carried in from before position 0 is open
    first = np.flatnonzero(local[:chunk])
    if first.size:
        open_start = int(first[-1])
    walked, levels = 0, 1  # levels: at least one, until the handover looks near
    for seam, c0 in enumerate(range(chunk, n, chunk)):
        # a window step costs about as much as lifting LIFT_POSITIONS positions one level
        if alone is not None and open_start is not None and seam >= 4 and walked * LIFT_POSITIONS > seam * chunk * levels:
            levels = _lift_levels(alone, g.budget)  # worked out once the handover looks near
            if walked * LIFT_POSITIONS > seam * chunk * levels:
                rest = g._replace(sizes=sizes[open_start:], force=None if g.force is None else g.force[open_start:])
                tail, state = _chain_starts(rest, _empty_state(sizes), levels)
                return np.concatenate([np.flatnonzero(local[:open_start]), tail + open_start]), state
        c1 = min(n, c0 + chunk)
        if open_start is None:
            state = _carried_through(sizes, carry, c0)
        else:
            state = _open_batch(sizes, open_start, c0)
        p = c0
        # Invariant: `state` is the true open batch at position p; flags in [c0, p) are true.
        while True:
            q, _ = _window_next(g, p, c1, state)
            walked += 1
            local[p:q] = False
            if q >= c1 or local[q]:
                break  # chunk done, or merged with the chunk's own chain: the rest is right
            local[q] = True
            state = OpenBatch(1, sizes[q].astype(np.float64), sizes[q].astype(np.float64))
            p = q + 1
        here = np.flatnonzero(local[c0:c1])
        if here.size:
            open_start = c0 + int(here[-1])
    starts = np.flatnonzero(local).astype(np.int64)
    if open_start is None:
        return starts, _carried_through(sizes, carry, n)
    return starts, _open_batch(sizes, open_start, n)


def _carried_through(sizes: FloatArray, carry: OpenBatch, end: int) -> OpenBatch:
    part = sizes[:end]
    if end == 0:
        return carry
    return OpenBatch(carry.count + end, np.maximum(carry.max_size, part.max(axis=0)), carry.sum_size + part.sum(axis=0))


def _walk_windows(
    g: _Greedy, multiple: int, state: OpenBatch, most: int = 0
) -> tuple[IntArray, OpenBatch, int]:
    """Greedy starts walked batch by batch (each batch of at least ``multiple`` samples cut back
    to a multiple of it), stopping at a batch start once more than ``most`` batches are walked
    (``0``: never).

    Returns the starts before the stop, the open batch there (empty at a stop) and the stop
    position (``n`` when the walk reached the end).
    """
    sizes, force = g.sizes, g.force
    n = sizes.shape[0]
    starts: list[int] = []
    batch_start = 0 if state.count == 0 else -state.count
    p = 0
    while p < n:
        q, state = _window_next(g, p, n, state)
        if q >= n:
            break
        size = q - batch_start
        cut = batch_start + size - size % multiple
        if size >= multiple and cut >= 0 and (force is None or not force[q]):
            q = cut
        if batch_start >= 0:
            starts.append(batch_start)
        batch_start = q
        state = _empty_state(sizes)
        p = q
        if most and len(starts) + 1 > most:
            return np.asarray(starts, dtype=np.int64), state, q
    if batch_start >= 0:
        starts.append(batch_start)
        state = _open_batch(sizes, batch_start, n)
    return np.asarray(starts, dtype=np.int64), state, n
