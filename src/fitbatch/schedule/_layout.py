"""One epoch of a batch-size schedule laid out as micro-batches: pure numpy, no torch.

A :class:`Layout` holds every micro-batch of the epoch (a :class:`~fitbatch.BatchPlan`), a
``grid`` whose row i gives the micro-batch each rank runs at its i-th position, and the rows of
each optimizer step. Every rank computes the same layout from ``(seed, epoch)``; the rows make
micro-batch counts equal on all ranks by construction.

Sample-count steps (``micro_batch_size``): step s takes the next ``size(s)`` samples of the
epoch's order and cuts them into ``k = ceil(size / (micro_batch_size * world))`` micro-batches per
rank, of near-equal sizes (they differ by at most one sample; all are ``micro_batch_size`` when
the size is a multiple of ``micro_batch_size * world``), laid out by the fixed-count planner
:func:`fitbatch.strategies.fixed_counts`. ``rounding`` decides what a size that is not such a
multiple becomes (see :data:`ROUNDING`).

Budget steps (``micro_budget``): the core planner cuts the epoch into size-aware micro-batches,
:func:`fitbatch.epoch._arrange.arrange` groups them ``world`` at a time into cost-balanced rows, and
step s takes the next rows while their real units stay within ``size(s)`` (at least one row).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
from numpy.typing import NDArray

from fitbatch.costs import SumCost
from fitbatch.epoch._arrange import TooFewSamples, arrange
from fitbatch.plan._planner import BatchPlan, PlanOptions, plan_with
from fitbatch.schedule._sizes import BatchSizeSchedule
from fitbatch.sizes import Sizes
from fitbatch.strategies._fixed import fixed_counts

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

#: what a sample-count step size that is not a multiple of micro_batch_size x world becomes:
#: "error" (default) refuses it up front, "down"/"up" round it to the nearest multiple below
#: (at least one multiple) / above, "uneven" keeps it and makes micro-batches differ by one sample.
ROUNDING = ("error", "down", "up", "uneven")
_FIRST_CHUNK = 64


@dataclasses.dataclass(frozen=True)
class Layout:
    """An epoch's micro-batches: ``grid[i, r]`` is the batch of ``plan`` rank r runs i-th."""

    epoch: int
    first_step: int
    plan: BatchPlan
    grid: IntArray
    step_rows: IntArray  # rows of step k: step_rows[k] .. step_rows[k + 1] - 1
    step_samples: IntArray
    step_units: FloatArray
    scheduled: IntArray  # the schedule's (rounded) size of each step
    dropped: int  # samples of the epoch no step consumes
    step_loss_units: FloatArray  # tokens that carry loss per step (step_units without loss_sizes)

    @property
    def n_steps(self) -> int:
        return int(self.step_rows.size - 1)

    @property
    def n_rows(self) -> int:
        return int(self.grid.shape[0])

    def row_steps(self) -> IntArray:
        """Step (within the epoch) of every row."""
        return np.repeat(np.arange(self.n_steps, dtype=np.int64), np.diff(self.step_rows))


def round_sizes(
    sched: BatchSizeSchedule, values: IntArray, micro: int, world: int, rounding: str, first_step: int | None
) -> IntArray:
    """Step sizes after ``rounding`` (see :data:`ROUNDING`); raises naming the offending steps."""
    q = micro * world
    if rounding == "down":
        return np.maximum(values // q * q, q)
    if rounding == "up":
        return -(-values // q) * q
    if rounding == "error":
        bad = np.flatnonzero(values % q)
        rule = f"a multiple of micro_batch_size x num_replicas = {micro} x {world} = {q}"
    else:
        bad = np.flatnonzero(values < -(-values // q) * world)
        rule = f"at least num_replicas ({world}) x the micro-batches per rank it needs"
    if bad.size:
        shown = ", ".join(
            f"{int(values[k])} at " + (sched.where(int(values[k])) if first_step is None else f"step {first_step + int(k)}")
            for k in bad[:3]
        )
        raise ValueError(
            f"{bad.size} batch size{'s' if bad.size > 1 else ''} of the schedule cannot be split into equal "
            f"micro-batch counts per rank: {shown}; each must be {rule}. Fix the schedule or pass "
            f"rounding= one of {tuple(r for r in ROUNDING if r != rounding)}"
        )
    return values


def _splittable(remainder: int, micro: int, world: int) -> int:
    """The most samples (<= remainder) of a final short step that split into equal counts."""
    k = -(-remainder // (micro * world))
    if remainder >= k * world:
        return remainder
    return (k - 1) * micro * world


def _step_values(sched: BatchSizeSchedule, start: int, count: int) -> IntArray:
    """``count`` sizes from ``start``, fewer at the end of a finite schedule that must not run out."""
    if sched.on_exhausted == "error" and sched.length is not None:
        count = min(count, max(sched.length - start, 1))  # asking past the end raises, naming it
    return sched.values(start, count)


def sample_layout(
    sched: BatchSizeSchedule, sizes: Sizes, *, micro: int, world: int, rounding: str,
    seed: int, epoch: int, first_step: int, shuffle: bool, drop_last: bool, loss: FloatArray | None = None,
) -> Layout:
    """Sample-count steps (see the module docstring); ``loss``: loss sizes the plan carries."""
    n = len(sizes)
    chunks: list[IntArray] = []
    total, start, want = 0, first_step, _FIRST_CHUNK
    finite = sched.on_exhausted == "error" and sched.length is not None
    while total < n:
        if drop_last and finite and start >= sched.length:  # type: ignore[operator]
            break  # the samples left are dropped: no step past the schedule's end is needed
        got = round_sizes(sched, _step_values(sched, start, want), micro, world, rounding, start)
        chunks.append(got)
        total += int(got.sum())
        start, want = start + got.size, want * 2
    planned = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    ends = np.cumsum(planned)
    full = int(np.searchsorted(ends, n, side="right"))
    steps, scheduled = planned[:full], planned[: full + 1] if full < planned.size else planned[:full]
    rest = n - (int(ends[full - 1]) if full else 0)
    if rest and not drop_last and rest >= world:
        steps = np.append(steps, _splittable(rest, micro, world))
    scheduled = scheduled[: steps.size]
    per_rank = -(-steps // (micro * world))
    parts = per_rank * world
    step_of = np.repeat(np.arange(steps.size), parts)
    j = np.arange(int(parts.sum())) - np.repeat(np.cumsum(parts) - parts, parts)
    counts = steps[step_of] // parts[step_of] + (j < steps[step_of] % parts[step_of])
    used = int(steps.sum())
    batches = fixed_counts(n, counts, shuffle=shuffle, seed=seed, epoch=epoch, purpose="schedule-order")
    plan = BatchPlan.from_batches(
        sizes, SumCost(), batches.order[:used], np.append(batches.starts, used), budget=None,
        strategy_name="schedule", dropped=batches.order[used:],
    )
    plan.loss_sizes = loss
    grid = np.arange(counts.size, dtype=np.int64).reshape(-1, world)
    step_rows = np.concatenate([[0], np.cumsum(per_rank)]).astype(np.int64)
    return _finish(epoch, first_step, plan, grid, step_rows, scheduled, plan.dropped.size)


def budget_layout(
    sched: BatchSizeSchedule, sizes: Sizes, opts: PlanOptions, *, world: int, epoch: int,
    first_step: int, drop_last: bool, loss: FloatArray | None = None,
) -> Layout:
    """Budget steps: core plan -> rows of ``world`` micro-batches -> steps of rows."""
    plan = plan_with(sizes, opts, epoch, loss_sizes=loss)
    try:
        arranged = arrange(plan, sizes, opts.cost, world, seed=opts.seed, epoch=epoch, purpose="schedule-rows")
    except TooFewSamples:  # its way out names the budget samplers' policy=, which this one has not
        raise ValueError(
            f"cannot give every rank a batch: the {plan.n_samples} samples ({len(plan)} micro-batches "
            f"under the budget {opts.budget:g}) do not split into one micro-batch for each of {world} "
            "ranks; use fewer ranks, a smaller micro_batch_size budget, or more samples"
        ) from None
    plan, grid, row_units = arranged.plan, arranged.grid, arranged.step_units
    cum = np.concatenate([[0.0], np.cumsum(row_units)])
    bounds: list[int] = [0]
    budgets: list[int] = []
    # Invariant: rows [0, bounds[-1]) form the steps so far; each step holds >= 1 row.
    while bounds[-1] < grid.shape[0]:
        i = bounds[-1]
        budget = int(_step_values(sched, first_step + len(budgets), 1)[0])
        j = int(np.searchsorted(cum, cum[i] + budget * (1 + 1e-12), side="right")) - 1
        bounds.append(max(j, i + 1))
        budgets.append(budget)
    step_rows = np.array(bounds, np.int64)
    lost = np.zeros(0, np.int64)
    if drop_last and budgets and cum[step_rows[-1]] - cum[step_rows[-2]] < budgets[-1]:
        cut = int(step_rows[-2])
        lost = plan.select(grid[cut:].ravel()).order if cut < grid.shape[0] else lost
        grid, step_rows, budgets = grid[:cut], step_rows[:-1], budgets[:-1]
    dropped = np.concatenate([plan.dropped, lost]).astype(np.int64)
    if lost.size:  # keep only the rows that run, re-indexing the grid into them
        kept = np.sort(grid.ravel())
        plan, grid = plan.select(kept), np.searchsorted(kept, grid).astype(np.int64)
    plan.dropped = dropped
    left_out = dropped.size + plan.skipped.size
    return _finish(epoch, first_step, plan, grid, step_rows, np.array(budgets, np.int64), left_out)


def _finish(
    epoch: int, first_step: int, plan: BatchPlan, grid: IntArray, step_rows: IntArray,
    scheduled: IntArray, dropped: int,
) -> Layout:
    rows = np.repeat(np.arange(step_rows.size - 1), np.diff(step_rows))
    step_samples = np.zeros(step_rows.size - 1, np.int64)
    step_units = np.zeros(step_rows.size - 1, np.float64)
    step_loss = np.zeros(step_rows.size - 1, np.float64)
    np.add.at(step_samples, rows, plan.counts[grid].sum(axis=1))
    np.add.at(step_units, rows, plan.real_units[grid].sum(axis=1))
    np.add.at(step_loss, rows, plan.loss_units[grid].sum(axis=1))
    if dropped:
        logger.info("epoch %d: %d samples fill no whole step and are dropped (counted in plan().stats())", epoch, dropped)
    return Layout(epoch, first_step, plan, grid, step_rows, step_samples, step_units, scheduled, int(dropped), step_loss)
