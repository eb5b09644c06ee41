"""Packing on the length histogram: whole-number sizes, a small budget, and a cap on samples per
batch (``max_batch_size``), the ``packed`` strategy's path for token counts.

When sizes are whole numbers up to a budget of about a thousand, millions of samples share a few
hundred lengths: the packing is decided on the counts per length (patterns of lengths, each
taken as many times as the counts allow), and indices are handed out once at the end.

**Patterns.** The longest length left opens a batch; the rest of the budget is filled *exactly*
where the lengths left allow it (else as nearly as they allow), with at most ``cap - 1`` more
samples. Which sums the lengths left reach with ``j`` samples is a boolean convolution per ``j``
(recomputed only when a length runs out), so the fill is found without search: the largest
reachable total at or under the room, then one length at a time, each chosen so that the rest
stays reachable with one sample fewer. Two rules choose that length:

- ``"large"``: the longest such length (few samples per batch: the short ones are kept for the
  batches that need an exact small fill);
- ``"small"``: the shortest (every batch takes as many samples as its cap allows: under a tight
  cap the short samples are spent beside the long ones instead of being left over).

The same pattern is then taken as many times as the counts allow (every repetition would make
the same choice), so the loop runs once per change of the lengths available, not per batch.
Both rules run, under the cap and under a cap of 3; the best is run again up to three times with
priority (as fillers) to the lengths that ended in loose batches the time before, since a greedy
that spends the short samples on the longest ones leaves middle lengths no three of which fill
a batch. The plan with fewest batches is kept. On the Wikipedia histogram of Krell et al.
(2021; 16,279,552 sequences, budget 512) this gives 8,135,757 batches without a cap (1.00017x
ceil(tokens / 512)), 8,135,743 at 12 per batch and 8,150,461 at 3 (the authors' LPFHP at 12:
8,149,619; NNLSHP at 3: 8,155,057; ``bench/packing_depth.py``).

>>> import numpy as np
>>> order, starts = histogram_pack(np.array([5, 3, 2, 5, 4, 1]), 10, None)
>>> [sorted(order[a:b].tolist()) for a, b in zip(starts, [*starts[1:], 6])]
[[0, 3], [1, 2, 4, 5]]
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels.batches import FloatArray, IntArray
from fitbatch._kernels.histogram import histogram_first_fit, histogram_plan

MAX_BUDGET = 1024  # above this a histogram has too many lengths for per-length convolutions
NEAR_BOUND = 2e-4  # without a cap, the patterns are kept within this of ceil(tokens / budget)
REWEIGHTS = 3  # passes that give the lengths left in loose batches priority as fillers
RULES = ("large", "small")
REPAIR_BATCHES = 1 << 17  # quick patterns: loose batches re-packed by first fit up to this many

Pattern = tuple[int, tuple[int, ...]]  # (times taken, lengths of one batch, longest first)


def applies(values: NDArray[np.float64], budget: float, integral: bool) -> bool:
    """Whether ``values`` (one size per sample) can be packed on their histogram: whole numbers
    in ``[1, budget]`` and a whole-number budget of at most :data:`MAX_BUDGET`.

    >>> applies(np.array([1.0, 512.0]), 512.0, True), applies(np.array([0.5]), 512.0, False)
    (True, False)
    """
    if not integral or values.ndim != 1 or values.size == 0 or budget != int(budget) or not 1 <= budget <= MAX_BUDGET:
        return False
    return bool(values.min() >= 1 and values.max() <= budget)


def _reach(counts: IntArray, room: int, depth: int) -> list[NDArray[np.bool_]]:
    """``reach[j][t]``: ``t <= room`` is a sum of at most ``j`` samples of the lengths with a
    count (each length any number of times), for ``j`` up to ``depth``."""
    avail = (counts[: room + 1] > 0).astype(np.float64)
    avail[0] = 0.0
    cur = np.zeros(room + 1, dtype=bool)
    cur[0] = True
    out = [cur]
    for _ in range(depth):
        nxt = cur | (np.convolve(cur.astype(np.float64), avail)[: room + 1] > 0.5)
        if np.array_equal(nxt, cur):  # saturated: more samples reach nothing new
            break
        out.append(nxt)
        cur = nxt
    return out


def _fill(counts: IntArray, room: int, depth: int, rule: str, prio: FloatArray | None = None) -> list[int]:
    """Lengths of at most ``depth`` samples (from ``counts``) with the largest total at or under
    ``room`` that ``rule`` can lay out, one length at a time; lengths of higher ``prio`` first
    (the last two of a batch by the sum of theirs), then by ``rule``."""
    if room <= 0 or depth <= 0:
        return []
    depth = min(depth, room)
    reach = _reach(counts, room, depth)
    last = len(reach) - 1  # reach[j] for j > last equals reach[last]
    left = counts[: room + 1].copy()

    def options(rest: int, d: int) -> list[int]:
        # the lengths that leave a rest reachable with d - 1 samples, in the rule's order
        ahead = reach[min(d - 1, last)]
        xs = np.arange(1, rest + 1)
        ok = np.flatnonzero((left[1 : rest + 1] > 0) & ahead[rest - xs]) + 1
        if rule == "large":
            ok = ok[::-1]
        if prio is not None and ok.size > 1:
            # by priority, but a length that fills the rest alone keeps the rule's place
            # (first for "large", last for "small")
            alone = ok == rest
            more = ok[~alone]
            score = prio[more] + (prio[rest - more] if d == 2 else 0.0)
            more = more[np.argsort(-score, kind="stable")]
            ok = np.concatenate([ok[alone], more] if rule == "large" else [more, ok[alone]])
        return ok.tolist()

    def lay(total: int) -> list[int] | None:
        # depth-first, without recursion: reach ignores how many samples a length has, so a
        # choice can fail; the next is tried, up to 64 choices in all
        items: list[int] = []
        stack = [options(total, depth)]
        rest, tries = total, 0
        while stack:
            if rest == 0:
                return items
            if not stack[-1] or tries >= 64 or len(items) == depth:
                stack.pop()
                if items:
                    x = items.pop()
                    left[x] += 1
                    rest += x
                continue
            x = stack[-1].pop(0)
            tries += 1
            items.append(x)
            left[x] -= 1
            rest -= x
            if rest:
                stack.append(options(rest, depth - len(items)))
        for x in items:
            left[x] += 1
        return None

    for total in np.flatnonzero(reach[last])[::-1].tolist():
        items = lay(total)
        if items is not None:
            return items
    return []


def histogram_patterns(
    counts: IntArray, budget: int, cap: int | None, rule: str, prio: FloatArray | None = None
) -> list[Pattern]:
    """The batches of ``counts`` (samples per length, index = length) as patterns, by ``rule``
    (and ``prio``: see :func:`_fill`).

    >>> histogram_patterns(np.array([0, 2, 1, 0, 1]), 5, None, "large")
    [(1, (4, 1)), (1, (2, 1))]
    """
    c = np.asarray(counts, dtype=np.int64).copy()
    depth = budget if cap is None else int(cap) - 1
    out: list[Pattern] = []
    top = c.size - 1
    while True:
        while top > 0 and c[top] == 0:
            top -= 1
        if top == 0:
            return out
        c[top] -= 1
        items = [top, *_fill(c, budget - top, depth, rule, prio)]
        c[top] += 1
        lengths, per = np.unique(np.asarray(items, dtype=np.int64), return_counts=True)
        times = int(np.min(c[lengths] // per))
        c[lengths] -= times * per
        out.append((times, tuple(sorted(items, reverse=True))))


def _batches(patterns: list[Pattern]) -> int:
    return sum(t for t, _ in patterns)


def _left_loose(patterns: list[Pattern], counts: IntArray, budget: int) -> FloatArray:
    """Per length, the share of its samples that ended in batches more than 1/64 of the budget
    short of full (the lengths the greedy could not place well)."""
    loose = np.zeros(len(counts), dtype=np.float64)
    for times, items in patterns:
        if budget - sum(items) > budget / 64:
            np.add.at(loose, list(items), float(times))
    loose[0] = 0.0
    return loose / np.maximum(np.asarray(counts, dtype=np.float64), 1.0)


def best_patterns(counts: IntArray, budget: int, cap: int | None) -> list[Pattern]:
    """:func:`histogram_patterns` by every rule, under ``cap`` and under a cap of 3 (a plan of at
    most 3 per batch obeys any larger cap, and the ``"small"`` rule spends short samples fastest
    when it may take many); then the best of these again, :data:`REWEIGHTS` times, with
    priority to the lengths that ended in loose batches (they are used as fillers earlier). The
    fewest batches of all (the first tried on ties).

    >>> _batches(best_patterns(np.array([0, 4, 0, 0, 2]), 5, 3))
    3
    """
    best: tuple[list[Pattern], int | None, str] | None = None
    caps = [cap] if cap is not None and cap <= 3 else [cap, 3]
    for limit in caps:
        for rule in RULES:
            got = histogram_patterns(counts, budget, limit, rule)
            if best is None or _batches(got) < _batches(best[0]):
                best = (got, limit, rule)
    if best is None:
        return []
    patterns, limit, rule = best
    prio = np.zeros(len(counts), dtype=np.float64)
    last = patterns
    for _ in range(REWEIGHTS):
        if _batches(patterns) == 0 or near_bound(patterns, counts, budget, 0.0):
            break
        prio += _left_loose(last, counts, budget)
        last = histogram_patterns(counts, budget, limit, rule, prio)
        if _batches(last) < _batches(patterns):
            patterns = last
    return patterns


def cached_best_patterns(counts: IntArray, budget: int, cap: int | None) -> list[Pattern]:
    """:func:`best_patterns`, kept per histogram, budget and cap (the patterns do not depend on
    the epoch: later epochs and plans of the same lengths only lay them out again).

    >>> cached_best_patterns(np.array([0, 4, 0, 0, 2]), 5, 3) == best_patterns(np.array([0, 4, 0, 0, 2]), 5, 3)
    True
    """
    c = np.ascontiguousarray(counts, dtype=np.int64)
    return list(_best_patterns(c.tobytes(), int(budget), None if cap is None else int(cap)))


@functools.lru_cache(maxsize=8)
def _best_patterns(counts: bytes, budget: int, cap: int | None) -> tuple[Pattern, ...]:
    return tuple(best_patterns(np.frombuffer(counts, dtype=np.int64).copy(), budget, cap))


def near_bound(patterns: list[Pattern], counts: IntArray, budget: int, slack: float = 2e-4) -> bool:
    """Whether ``patterns`` use at most ``slack`` (:data:`NEAR_BOUND`) more batches than ceil(tokens / budget)
    (first-fit decreasing is kept otherwise: on wide length sets it packs tighter).

    >>> near_bound([(2, (5, 5))], np.array([0, 0, 0, 0, 0, 4]), 10)
    True
    """
    tokens = int(np.dot(np.asarray(counts, dtype=np.int64), np.arange(len(counts), dtype=np.int64)))
    bound = -(-tokens // budget)
    return _batches(patterns) <= bound + max(1.0 if slack else 0.0, slack * bound)


def histogram_pack(
    lengths: IntArray, budget: int, cap: int | None, rng: np.random.Generator | None = None
) -> tuple[IntArray, IntArray]:
    """Pack whole-number ``lengths`` (each in ``[1, budget]``) into batches of total at most
    ``budget`` and at most ``cap`` samples: returns ``(order, starts)``, the positions in batch
    order and each batch's start. Which sample of a length goes to which batch is drawn from
    ``rng`` (in position order without it).

    >>> order, starts = histogram_pack(np.array([3, 3, 3, 1, 1, 1]), 4, 2)
    >>> [order[a:b].tolist() for a, b in zip(starts, [*starts[1:], 6])]
    [[0, 3], [1, 4], [2, 5]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = np.bincount(lengths, minlength=budget + 1)
    return assign(lengths, budget, best_patterns(counts, budget, cap), rng)


def assign(
    lengths: IntArray, budget: int, patterns: list[Pattern], rng: np.random.Generator | None = None
) -> tuple[IntArray, IntArray]:
    """The positions of ``lengths`` laid out as ``patterns`` (which must take every sample once):
    ``(order, starts)`` as :func:`histogram_pack` returns them."""
    n = lengths.size
    counts = np.bincount(lengths, minlength=budget + 1)
    # the positions of each length, in a drawn order (a stable sort of 16-bit keys is a radix sort)
    perm = rng.permutation(n) if rng is not None else np.arange(n, dtype=np.int64)
    by_length = perm[np.argsort(lengths[perm].astype(np.uint16), kind="stable")]
    first = np.zeros(budget + 2, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    taken = first[:-1].copy()  # the next position of each length to hand out
    parts: list[IntArray] = []
    sizes: list[IntArray] = []
    for times, items in patterns:
        lens, per = np.unique(np.asarray(items, dtype=np.int64), return_counts=True)
        block = np.empty((times, len(items)), dtype=np.int64)
        col = 0
        for length, k in zip(lens.tolist()[::-1], per.tolist()[::-1]):  # longest first
            a = int(taken[length])
            block[:, col : col + k] = by_length[a : a + times * k].reshape(times, k)
            taken[length] = a + times * k
            col += k
        parts.append(block.ravel())
        sizes.append(np.full(times, len(items), dtype=np.int64))
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.concatenate(parts)
    per_batch = np.concatenate(sizes)
    starts = np.zeros(per_batch.size, dtype=np.int64)
    np.cumsum(per_batch[:-1], out=starts[1:])
    return order, starts


def quick_patterns(counts: IntArray, budget: int) -> list[Pattern]:
    """The patterns of ``counts`` without a cap by the ``"large"`` rule alone (no other rule, no
    reweighting): the uncapped default's packing, a few hundredths of a second on a histogram of
    a few hundred lengths. On Wikipedia-512 it gives 8,135,857 batches (1.00018x the bound,
    :func:`best_patterns`: 8,135,757 in about five times as long; first-fit decreasing:
    8,138,483).

    >>> quick_patterns(np.array([0, 2, 1, 0, 1]), 5)
    [(1, (4, 1)), (1, (2, 1))]
    """
    c = np.ascontiguousarray(counts, dtype=np.int64)
    return list(_quick_patterns(c.tobytes(), int(budget)))


@functools.lru_cache(maxsize=8)
def _quick_patterns(counts: bytes, budget: int) -> tuple[Pattern, ...]:
    """:func:`quick_patterns` kept per histogram (the counts' bytes), so later epochs and plans of
    the same lengths skip it."""
    return tuple(_repaired(histogram_patterns(np.frombuffer(counts, dtype=np.int64), budget, None, "large"), budget))


def _repaired(patterns: list[Pattern], budget: int) -> list[Pattern]:
    """``patterns`` with the samples of their batches under ``budget`` packed again by
    first-fit decreasing (:func:`fitbatch._kernels.histogram.histogram_first_fit`), when that
    takes fewer batches. The ``"large"`` rule fills batches exactly while it can and leaves the
    rest loose at the end; first fit can place those leftovers tighter (on sets of short and
    long lengths measured: 20 loose batches to 12, the bound), in milliseconds (few samples).
    Skipped over :data:`REPAIR_BATCHES` loose batches (lengths that rarely fill a batch exactly:
    first fit then plans the whole set anyway where it does better).

    >>> _repaired([(1, (6, 1)), (1, (5,)), (1, (4,)), (1, (2,))], 8)
    [(1, (6, 2)), (1, (5, 1)), (1, (4,))]
    """
    tight = [p for p in patterns if sum(p[1]) >= budget]
    loose = [p for p in patterns if sum(p[1]) < budget]
    n_loose = sum(t for t, _ in loose)
    if n_loose < 2 or n_loose > REPAIR_BATCHES:
        return patterns
    counts = np.zeros(budget + 1, dtype=np.int64)
    for times, items in loose:
        for x in items:
            counts[x] += times
    # longest first, by counts (no sort); first fit's count before its batches are laid out
    laid = np.repeat(np.arange(budget, -1, -1, dtype=np.int64), counts[::-1])
    if histogram_plan(laid, float(budget))[1].size >= n_loose:
        return patterns
    dest, starts = histogram_first_fit(laid, float(budget))
    placed = np.empty_like(laid)
    placed[dest] = laid
    repacked: list[Pattern] = []
    for batch in np.split(placed, starts[1:]):
        items = tuple(sorted(batch.tolist(), reverse=True))
        if repacked and repacked[-1][1] == items:
            repacked[-1] = (repacked[-1][0] + 1, items)
        else:
            repacked.append((1, items))
    return tight + repacked
