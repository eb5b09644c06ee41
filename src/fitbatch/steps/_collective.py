"""The step split when each rank holds only its own sequences: :func:`partition_local`.

Each rank finds the fewest micro-batches its own sequences pack into under the cap; one
all-reduce (MAX) makes that count common, and each rank then packs into exactly that many. A
rank can always pack into more micro-batches than it needs (its packing at its own count, plus
empty ones, is the fallback), so the count is never retried collectively. The same all-reduce
carries an error flag, so that a rank whose input is refused raises on every rank instead of
leaving the others waiting; an all-gather then shares the per-micro-step totals.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fitbatch.costs import CostModel
from fitbatch.steps._count import settle
from fitbatch.steps._partition import FloatArray, Partition, WeightsLike, _Plan, by_rank


def partition_local(
    local_sizes: Any,
    budget: float | str,
    *,
    group: Any = None,
    weights: WeightsLike = None,
    cost: str | CostModel = "sum",
    micro_multiple: int = 1,
    min_micro: int | None = None,
    groups: Any = None,
    loss_sizes: Any = None,
    oversized: str = "error",
    cp_size: int | None = None,
) -> Partition:
    """Split this rank's sequences into as many capped micro-batches as every other rank.

    Call it on every rank of ``group`` (a ``torch.distributed`` process group; ``None``: the
    default group). Without an initialised process group it plans this process alone.

    Args:
        local_sizes: this rank's lengths (1-D).
        budget: the cap on each micro-batch's cost.
        group: the data-parallel process group.
        weights: as for :func:`~fitbatch.steps.partition`.
        cost: as for :func:`~fitbatch.steps.partition`.
        micro_multiple: as for :func:`~fitbatch.steps.partition`.
        min_micro: as for :func:`~fitbatch.steps.partition`.
        loss_sizes: as for :func:`~fitbatch.steps.partition`.
        oversized: as for :func:`~fitbatch.steps.partition`.
        cp_size: as for :func:`~fitbatch.steps.partition`.
        groups: one id per local sequence: each group is kept in one micro-batch (a rank's
            sequences are on that rank already).

    Returns:
        A :class:`~fitbatch.steps.Partition` holding this rank's micro-batches (``p[rank]``,
        indices into ``local_sizes``), with ``n_micro`` the same on every rank and the
        per-micro-step totals, workloads and efficiency over all ranks.

    Raises:
        ValueError, TypeError: as :func:`~fitbatch.steps.partition`, on the rank whose input is
            refused; ``RuntimeError`` on the other ranks, naming it.

    >>> p = partition_local([900, 700, 400, 300], 1000)   # no process group: this process alone
    >>> p.ranks, p.n_micro, [b.tolist() for b in p[0]]
    ((0,), 3, [[0], [1], [2, 3]])
    """
    comm = _Comm(group)
    try:
        plan = _Plan.build(local_sizes, budget, weights, cost, micro_multiple, min_micro, groups,
                           "micro" if groups is not None else "rank", loss_sizes, oversized, cp_size)
        order, alone, bound = plan.micro_rows(np.zeros(plan.group.size, dtype=np.int64), 1)
    except (TypeError, ValueError):
        comm.agree(0, 0, failed=True)
        raise
    lower = [0]

    def agree(count: int) -> int:
        final, lower[0] = comm.agree(count, int(bound[0]))
        return final

    m, bins = settle(order, alone, plan.units, int(bound[0]), plan, agree)
    unit = plan.unit_of[plan.kept]
    p = plan.result(*by_rank(bins, m, np.zeros(unit.size, dtype=np.int64), unit), m, (comm.rank,), comm.world,
                    gather=comm.gather)
    floor = max(lower[0], plan.floor)
    return _with_bound(p, -(-floor // plan.step) * plan.step)


def _with_bound(p: Partition, bound: int) -> Partition:
    return dataclasses.replace(p, lower_bound=bound)


class _Comm:
    """The two collectives of :func:`partition_local` (or their one-process forms)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.dist: Any = None
        self.world, self.rank = 1, 0
        try:
            import torch.distributed as dist
        except ImportError:  # no torch: one process
            return
        if dist.is_available() and dist.is_initialized():
            self.dist = dist
            self.world = dist.get_world_size(group)
            self.rank = dist.get_rank(group)

    def agree(self, count: int, bound: int, *, failed: bool = False) -> tuple[int, int]:
        """MAX over the ranks of (count, bound, failed rank + 1)."""
        if self.dist is None:
            return count, bound
        import torch

        t = torch.tensor([count, bound, self.rank + 1 if failed else 0], dtype=torch.int64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        if int(t[2]) and not failed:
            raise RuntimeError(
                f"partition_local: rank {int(t[2]) - 1} (or more) refused its input and raised there; "
                "this rank stops too"
            )
        return int(t[0]), int(t[1])

    def gather(self, local: FloatArray) -> FloatArray:
        """Every rank's ``(4, m)`` totals and workloads, stacked ``(world, 4, m)``."""
        if self.dist is None:
            return local[None]
        import torch

        t = torch.from_numpy(np.ascontiguousarray(local, dtype=np.float64))
        out = [torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t, group=self.group)
        return np.stack([o.numpy() for o in out])
