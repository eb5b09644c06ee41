"""Fixed-count batches: the baseline a budget is compared to, and the schedule's sample steps."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from fitbatch import _rng
from fitbatch._validate import positive_int
from fitbatch.strategies._base import Context, IntArray, Result, Strategy, _tails


def fixed_counts(
    n: int, counts: IntArray, *, shuffle: bool, seed: int, epoch: int, purpose: str
) -> Result:
    """The fixed-count planner: batch k holds the next ``counts[k]`` samples, whatever they cost.

    Samples come in index order, or in the permutation drawn from (seed, epoch, ``purpose``)
    when ``shuffle``; those past ``counts.sum()`` end ``order`` in no batch. Serves
    :class:`Fixed` and the sample-count steps of :mod:`fitbatch.schedule`.
    """
    if shuffle:
        order = _rng.generator(seed, epoch, purpose).permutation(n).astype(np.int64, copy=False)
    else:
        order = np.arange(n, dtype=np.int64)
    starts = (np.cumsum(counts) - counts).astype(np.int64)
    return Result(
        order,
        starts,
        _tails(starts, np.zeros(min(n, 1), np.int64), int(counts.sum())),
        identity=not shuffle,
    )


@dataclasses.dataclass(frozen=True)
class Fixed(Strategy):
    """``batch_size`` samples per batch whatever they cost: the baseline a budget is compared to.

    Samples are taken in order (shuffled by default, as a fixed-size ``DataLoader`` does), the
    last batch takes the rest. The budget only measures the batches (their fills); it does not
    shape them, so a batch may exceed it. ``max_batch_size`` must allow ``batch_size``, and
    ``batch_size_multiple`` must divide it.

    >>> import fitbatch
    >>> plan = fitbatch.plan_batches([4, 1, 3, 2, 5], 8, strategy=fitbatch.strategies.Fixed(2), shuffle=False)
    >>> plan.to_lists(), plan.costs.tolist(), plan.strategy_name
    ([[0, 1], [2, 3], [4]], [8.0, 6.0, 5.0], 'fixed(2)')
    """

    batch_size: int
    name: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", positive_int("batch_size", self.batch_size))

    @property
    def plan_name(self) -> str:
        return f"fixed({self.batch_size})"

    def plan(self, ctx: Context) -> Result:
        bs = self.batch_size
        if (ctx.cap is not None and ctx.cap < bs) or bs % ctx.multiple:
            raise ValueError(
                f"Fixed(batch_size={bs}) does not fit max_batch_size={ctx.cap} and "
                f"batch_size_multiple={ctx.multiple}: pass a batch size within both, or leave them out"
            )
        n = len(ctx.sizes)
        counts = np.full(n // bs, bs, dtype=np.int64)
        if n % bs:
            counts = np.append(counts, n % bs)
        return fixed_counts(
            n, counts, shuffle=ctx.shuffle, seed=ctx.seed, epoch=ctx.epoch, purpose="fixed-order"
        )

    def batch_order(self, ctx: Context, n_batches: int) -> IntArray | None:
        return None
