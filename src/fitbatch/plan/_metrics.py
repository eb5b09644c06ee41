"""How random a plan is: metrics to check that size-aware batching still trains well.

Sorting by size pads little but can make an epoch predictable: the same samples meet in the
same batches every epoch, or batch sizes drift through the epoch. Two numbers catch both:

* :func:`repeat_rate` — of the sample pairs that share a batch in one epoch, the share that
  share one again in the next (1.0 for a fixed global sort of distinct sizes);
* :func:`epoch_repeat_rate` — the same, planning two epochs of ``plan_batches`` for you;
* :func:`position_size_correlation` — the Spearman correlation between a batch's position in the
  epoch and its mean size (±1 for sorted batch orders, about 0 when batches are interleaved).

>>> import fitbatch
>>> sizes = [5, 1, 4, 2, 3, 3, 6, 2]
>>> a = fitbatch.plan_batches(sizes, 6, strategy="sorted")
>>> repeat_rate(a, a)
1.0
>>> position_size_correlation(a, sizes) > 0.9
True
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.plan._planner import BatchPlan
from fitbatch.sizes import as_sizes


def batch_of_sample(plan: BatchPlan, n: int) -> NDArray[np.int64]:
    """Batch index of every sample 0..n-1 (-1 for samples not in the plan)."""
    top = int(plan.order.max(initial=-1))
    if top >= n:
        raise ValueError(f"n={n} but the plan holds sample {top}; pass the number of samples, more than {top}")
    ids = np.full(n, -1, dtype=np.int64)
    ids[plan.order] = np.repeat(np.arange(len(plan)), plan.counts)
    return ids


def repeat_rate(plan_a: BatchPlan, plan_b: BatchPlan, n: int | None = None) -> float:
    """Share of sample pairs sharing a batch in ``plan_a`` that share one again in ``plan_b``.

    Compare two epochs' plans: near 1.0, the same samples meet in the same batches every epoch;
    near 0, batches are re-drawn (what a shuffled fixed-size loader gives).

    Args:
        plan_a: one epoch's plan.
        plan_b: another epoch's plan of the same samples.
        n: the number of samples (default: one more than the largest index planned).

    Returns:
        A share in [0, 1]; 0.0 when ``plan_a`` has no batch of two or more samples.

    >>> import fitbatch
    >>> sizes = [5, 1, 4, 2, 3, 3, 6, 2]
    >>> a = fitbatch.plan_batches(sizes, 6, strategy="sorted")
    >>> a.to_lists()
    [[1, 7, 3], [5, 4], [2], [0], [6]]
    >>> repeat_rate(a, fitbatch.plan_batches(sizes, 6, strategy="sorted", epoch=1))
    1.0
    >>> b = fitbatch.plan_batches(sizes, 6, strategy="sequential", cost="sum")
    >>> b.to_lists()
    [[0, 1], [2, 3], [4, 5], [6], [7]]
    >>> repeat_rate(a, b)   # of the pairs (1, 7), (1, 3), (7, 3), (5, 4), only (5, 4) meets again
    0.25
    """
    if n is None:
        n = 1 + max(int(plan_a.order.max(initial=-1)), int(plan_b.order.max(initial=-1)))
    counts = plan_a.counts.astype(np.float64)
    pairs_a = float((counts * (counts - 1) / 2).sum())
    if pairs_a == 0:
        return 0.0
    # walk plan_a's order (grouped by its batch already): cells (batch in a, batch in b) are
    # runs of one key once each a-batch's b-batches are sorted; pairs in both = sum C(run, 2)
    in_b = batch_of_sample(plan_b, n)[plan_a.order]
    in_a = np.repeat(np.arange(len(plan_a), dtype=np.int64), plan_a.counts)
    both = in_b >= 0
    key = in_a[both] * (len(plan_b) + 1) + in_b[both]
    key.sort(kind="stable")  # already ordered by batch of a: long sorted runs
    ends = np.append(np.flatnonzero(np.diff(key)), key.size - 1)
    cell = np.diff(ends, prepend=-1).astype(np.float64)
    return float((cell * (cell - 1) / 2).sum()) / pairs_a


def epoch_repeat_rate(
    sizes: Any, budget: Any, *, epochs: tuple[int, int] = (0, 1), pairs: int = 1, **options: Any
) -> float:
    """:func:`repeat_rate` between the plans of two epochs of :func:`fitbatch.plan_batches`.

    Plans ``sizes`` for both epochs with the same ``options`` (``strategy``, ``seed``, ``cost``,
    ...) and compares them: the share of sample pairs batched together in the first epoch that
    are batched together again in the second. About 2 x one plan's time.

    One pair of epochs can flatter: ``pooled`` and ``buckets`` move their level boundaries by
    0.38 or 0.62 of a level from one epoch to the next, and a pair after the shorter move
    repeats up to twice as much. ``pairs=k`` averages ``k`` pairs, each shifted one epoch on:
    ``(a, b), (a + 1, b + 1), ...`` (``k + 1`` plans for consecutive epochs).

    Args:
        sizes: as for :func:`fitbatch.plan_batches`.
        budget: as for :func:`fitbatch.plan_batches`.
        epochs: the two epochs to compare (the first pair).
        pairs: how many pairs to average (at least 1).
        **options: any keyword option of :func:`fitbatch.plan_batches` but ``epoch``.

    Returns:
        A share in [0, 1] (the mean over the pairs).

    >>> import numpy as np, fitbatch
    >>> sizes = np.random.default_rng(0).integers(1, 400, 20000)
    >>> exact = epoch_repeat_rate(sizes, 4096, strategy=fitbatch.Pooled(randomness=None))
    >>> mixed = epoch_repeat_rate(sizes, 4096, strategy=fitbatch.Pooled(randomness=0.05))
    >>> exact > 0.5, mixed < 0.1
    (True, True)
    >>> one = [epoch_repeat_rate(sizes, 4096, epochs=(e, e + 1)) for e in range(3)]
    >>> abs(epoch_repeat_rate(sizes, 4096, pairs=3) - sum(one) / 3) < 1e-12
    True
    """
    from fitbatch.plan._planner import plan_batches

    if "epoch" in options:
        raise TypeError("epoch_repeat_rate takes epochs=(first, second), not epoch=")
    if isinstance(pairs, bool) or not isinstance(pairs, numbers.Integral) or pairs < 1:
        raise ValueError(f"pairs must be a whole number >= 1, got {pairs!r}")
    plans: dict[int, BatchPlan] = {}

    def plan(epoch: int) -> BatchPlan:
        if epoch not in plans:  # consecutive pairs share their plans
            plans[epoch] = plan_batches(sizes, budget, epoch=epoch, **options)
        return plans[epoch]

    rates = [repeat_rate(plan(epochs[0] + k), plan(epochs[1] + k)) for k in range(int(pairs))]
    return float(np.mean(rates))


def position_size_correlation(plan: BatchPlan, sizes: Any) -> float:
    """Spearman correlation between a batch's position in the epoch and its mean size.

    Args:
        plan: one epoch's plan.
        sizes: the sizes it was planned from (for ``(N, D)`` sizes, each row's product).

    Returns:
        A correlation in [-1, 1]: about 1 (or -1) when batch sizes drift through the epoch,
        about 0 when large and small batches are interleaved; 0.0 for fewer than three batches
        or when every batch has the same mean size.

    >>> import fitbatch
    >>> sizes = [5, 1, 4, 2, 3, 3, 6, 2]
    >>> a = fitbatch.plan_batches(sizes, 6, strategy="sorted")
    >>> round(position_size_correlation(a, sizes), 6)   # batch means 5/3, 3, 4, 5, 6
    1.0
    >>> b = fitbatch.plan_batches(sizes, 6, strategy="sequential", cost="sum")
    >>> round(position_size_correlation(b, sizes), 3)   # batch means 3, 3, 3, 6, 2
    -0.224
    """
    if len(plan) < 3:
        return 0.0
    values = as_sizes(sizes).values  # any form plan_batches takes (a mapping, columns, ...)
    if values.ndim > 1:
        values = values.prod(axis=1)
    mean = np.add.reduceat(values[plan.order], plan.offsets[:-1]) / plan.counts
    if np.all(mean == mean[0]):
        return 0.0
    return float(np.corrcoef(np.arange(len(plan), dtype=np.float64), _average_ranks(mean))[0, 1])


def _average_ranks(x: NDArray[np.float64]) -> NDArray[np.float64]:
    ranks = np.empty(x.size)
    ranks[np.argsort(x, kind="stable")] = np.arange(x.size)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    return np.bincount(inv, weights=ranks)[inv] / counts[inv]
