"""Cut a laid-out order into a given number of batches at the least total cost.

A greedy walk fills every batch to the budget and leaves the rest to the next one; over a few
dozen batches that puts boundaries wherever the budget runs out, often just past a jump in the
sizes, so a batch pads its last samples to a longer first one. With the walk's order and batch
count fixed, the cheapest cuts are an exact dynamic programme over the batches: the end of batch
``k`` can only lie between where ``k`` greedy batches from the front reach and where
``K - k`` greedy batches from the back start (:func:`least_cost_starts`), so each stage looks at
one window of ends against the previous window, as one vectorised matrix.

``Pooled`` uses it on the few-batch epochs of ``randomness="auto"`` (see
:mod:`fitbatch.strategies._mixing`): same samples in the same order, same batch count, never
more cost in total, and each batch within the budget by the same test as the greedy walk. Not
for several ranks (:func:`greedy_cuts`): cheaper cuts make batch costs less even.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import batches as K
from fitbatch.costs import CostModel

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

# the programme's matrices hold at most this many (end, previous end) pairs in all (about a
# second of numpy per 2**26); beyond it (batches of many thousands of samples) the greedy cuts stay
MAX_PAIRS = 1 << 24

# ... in blocks of at most this many (a block's few matrices stay in the CPU's cache: 512 KiB each)
MAX_STAGE_PAIRS = 1 << 16

_greedy_only = contextvars.ContextVar("fitbatch_greedy_cuts", default=False)


@contextlib.contextmanager
def greedy_cuts() -> Iterator[None]:
    """Plans made inside keep the greedy walk's cuts: the steps of several ranks need batches of
    even cost (the slowest rank sets a step's time) more than the least total cost
    (``plan_for_world``); nor do ``"auto"`` plans cut their densest batches in parts
    (:func:`fitbatch.strategies._ordered.split_densest`)."""
    token = _greedy_only.set(True)
    try:
        yield
    finally:
        _greedy_only.reset(token)


def enabled() -> bool:
    """Whether plans made now get the cheapest cuts (not inside :func:`greedy_cuts`)."""
    return not _greedy_only.get()


def least_cost_starts(
    values: FloatArray, starts: IntArray, budget: float, cost: CostModel, cap: int | None = None
) -> IntArray | None:
    """Batch starts over ``values`` (1-D sizes in planning order) with as many batches as the
    greedy ``starts`` and the least total cost; ``None`` when no cuts are cheaper than the greedy
    ones or the search would exceed :data:`MAX_PAIRS` (the greedy cuts then stand).

    >>> from fitbatch.costs import PaddedCost
    >>> v = np.array([9.0, 9, 5, 5, 5, 5, 1, 1])  # greedy at 20: [9 9] [5 5 5 5] [1 1]
    >>> starts = K.greedy_starts(v, 20.0, PaddedCost())[0]
    >>> starts.tolist(), least_cost_starts(v, starts, 20.0, PaddedCost())  # already the cheapest
    ([0, 2, 6], None)
    >>> v = np.array([8.0, 4, 4, 4, 4, 4, 1, 1, 1])  # greedy: [8 4] [4 4 4 4 1] [1 1]
    >>> starts = K.greedy_starts(v, 20.0, PaddedCost())[0]
    >>> starts.tolist(), least_cost_starts(v, starts, 20.0, PaddedCost()).tolist()
    ([0, 2, 7], [0, 1, 6])
    """
    n, k_all = values.size, starts.size
    if k_all < 2:
        return None
    back = K.greedy_starts(values[::-1].copy(), budget, cost, cap=cap)[0]
    if back.size != k_all:  # both walks find the fewest batches; kept as a guard
        return None
    # end of batch k (1..K) lies in [low[k], high[k]]: k front batches reach high[k], and the
    # last K - k batches from the back can start no earlier than low[k]
    high = np.append(starts, n)  # starts[0] is 0
    low = n - np.append(back, n)[k_all - np.arange(k_all + 1)]
    widths = high - low + 1
    # each end window lies past the one before (else K - 1 batches would hold the order: only a
    # cost that is not monotone can do that, and then the walk's cuts stay)
    if np.any(widths <= 0) or np.any(low[1:] <= high[:-1]) or int(np.sum(widths[1:] * widths[:-1])) > MAX_PAIRS:
        return None
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    capf = np.inf if cap is None else float(cap)
    sum_free = cost.max_count(values[:1], budget) is not None
    best = np.zeros(1)  # least cost of the first k batches, per end in [low[k], high[k]]
    choice = []
    for k in range(1, k_all + 1):
        first, stop = int(low[k - 1]), int(high[k - 1]) + 1  # the previous ends: starts here
        prev = np.arange(first, stop, dtype=np.float64)
        own = values[first:stop]
        all_ends = np.arange(low[k], high[k] + 1)
        # max(values[q:p]) = max(the starts' own values from q on, the values from stop up to p)
        from_start = np.maximum.accumulate(own[::-1])[::-1]
        to_end = np.maximum.accumulate(np.concatenate([[-np.inf], values[stop : int(all_ends[-1])]]))
        stage_best, stage_pick = np.empty(all_ends.size), np.empty(all_ends.size, np.int64)
        rows = max(1, MAX_STAGE_PAIRS // prev.size)
        for at in range(0, all_ends.size, rows):  # blocks of ends: bounded matrices
            ends = all_ends[at : at + rows]
            count = ends[:, None] - prev[None, :]  # >= 1: every end lies past every start
            mx = np.maximum(from_start[None, :], to_end[ends - stop][:, None])
            # a cost with a closed-form count (max_count) does not read the sum: not built then
            sm = mx if sum_free else prefix[ends][:, None] - prefix[first:stop][None, :]
            c = cost.evaluate(count.ravel(), mx.ravel(), sm.ravel()).reshape(count.shape)
            ok = c <= budget
            if capf < np.inf:
                ok &= count <= capf
            total = np.where(ok, c + best[None, :], np.inf)
            pick = np.argmin(total, axis=1)
            stage_best[at : at + ends.size] = total[np.arange(ends.size), pick]
            stage_pick[at : at + ends.size] = pick
        best = stage_best
        choice.append(first + stage_pick)
    ends = np.append(starts[1:], n)
    mx = np.maximum.reduceat(values, starts)
    greedy = float(np.sum(cost.evaluate((ends - starts).astype(np.float64), mx, prefix[ends] - prefix[starts])))
    if not best[-1] < greedy * (1.0 - 1e-9):  # no cheaper (the sum cost never is): keep the walk's
        return None
    out = np.empty(k_all, dtype=np.int64)
    end = n
    for k in range(k_all, 0, -1):  # walk the choices back from the last batch's end
        start = int(choice[k - 1][end - low[k]])
        out[k - 1] = start
        end = start
    return out

