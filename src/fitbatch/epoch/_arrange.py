"""Data-parallel plans: the same number of cost-balanced batches on every rank, nothing lost.

Every rank computes the same global plan from ``(seed, epoch)`` with no communication, then
:func:`arrange` cuts it into *steps* of ``world`` batches, one per rank:

1. **Equal counts.** When the batch count is not a multiple of the world size, the leftover is
   handled by ``policy``: ``"split"`` (default) halves the most expensive batches until the
   count divides evenly, so every sample is still seen exactly once and no batch grows;
   ``"drop"`` drops the last batches of the epoch and counts their samples in the stats.
2. **Balance.** Batches are sorted by cost (ties broken at random) and grouped ``world`` at a
   time, so the batches of one step cost nearly the same; the step order and the rank of each
   batch inside its step are then shuffled, which keeps the epoch random.
3. **Per-step totals.** For each step, the samples and real (unpadded) size units summed over
   all ranks, for exact loss normalisation without communication.

Per-rank budgets (ranks with different memory): :func:`arrange_budgets` deals the samples to
ranks in proportion to their budgets, plans each rank's share with its own budget and then
splits batches on the ranks that have fewer, so that step counts are equal again.

>>> import fitbatch
>>> from fitbatch.epoch._arrange import arrange
>>> sizes = fitbatch.as_sizes([5, 3, 8, 2, 7, 4, 6, 1, 9])
>>> plan = fitbatch.plan_batches(sizes, 10, strategy="sorted")
>>> steps = arrange(plan, sizes, fitbatch.costs.resolve_cost("padded"), 2, seed=0, epoch=0)
>>> steps.grid.shape[1], len(steps.rank_plan(0)) == len(steps.rank_plan(1))
(2, True)
>>> sorted(int(i) for r in range(2) for b in steps.rank_plan(r) for i in b)
[0, 1, 2, 3, 4, 5, 6, 7, 8]
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from fitbatch import _rng
from fitbatch._validate import choice, parse_budget
from fitbatch.costs import CostModel
from fitbatch.plan._planner import BatchPlan, PlanOptions, measure_batches, plan_with
from fitbatch.sizes import Sizes
from fitbatch.strategies._recut import greedy_cuts

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
POLICIES = ("split", "drop")
# Below this many steps per epoch a ragged step matters (>= 1/64 of the epoch's balance):
# :func:`plan_for_world` re-plans to a batch count the world size divides.
FEW_STEPS = 64


class StepTotals(NamedTuple):
    """Per step of an epoch, over all ranks and micro-batches: what a loop normalises its loss by.

    Known from the shared plan on every rank, with no all-reduce. ``loss_units`` counts the
    tokens that carry loss (labels != -100) given as the sampler's ``loss_sizes=``; without
    them it equals ``units``.

    >>> from fitbatch import BudgetBatchSampler
    >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 4, strategy="sorted", loss_sizes=[2, 1, 3, 0], num_replicas=1, rank=0)
    >>> totals = sampler.step_totals()
    >>> totals.samples.tolist(), totals.units.tolist(), totals.loss_units.tolist()
    ([2, 1, 1], [2.0, 3.0, 4.0], [1.0, 2.0, 3.0])

    Attributes:
        samples: samples in each step (int64).
        units: real (unpadded) size units in each step.
        loss_units: tokens that carry loss in each step (``units`` without ``loss_sizes``).
    """

    samples: NDArray[np.int64]
    units: NDArray[np.float64]
    loss_units: NDArray[np.float64]


@dataclasses.dataclass(frozen=True)
class Steps:
    """A plan arranged into steps: ``grid[k, r]`` is the batch of ``plan`` that rank r runs at step k.

    >>> from fitbatch import as_sizes, plan_batches
    >>> from fitbatch.costs import SumCost
    >>> sizes = as_sizes([4, 4, 4, 4, 4, 4])
    >>> steps = arrange(plan_batches(sizes, 8, cost="sum"), sizes, SumCost(), 3, seed=0, epoch=0)
    >>> steps.n_steps, steps.grid.shape, steps.step_samples.tolist()
    (1, (1, 3), [6])
    """

    plan: BatchPlan
    grid: IntArray
    step_samples: IntArray
    step_units: FloatArray
    straggler_ratio: float | None
    #: per-rank budgets when ranks differ (fills are then cost / own budget)
    budgets: tuple[float, ...] | None = None

    @property
    def n_steps(self) -> int:
        return int(self.grid.shape[0])

    @property
    def step_loss_units(self) -> FloatArray:
        """Tokens that carry loss in each step, all ranks (``step_units`` when the plan has no ``loss_sizes``)."""
        return self.plan.loss_units[self.grid].sum(axis=1) if self.n_steps else np.zeros(0)

    def rank_plan(self, rank: int) -> BatchPlan:
        """The batches of one rank, in step order (its stats carry the straggler ratio)."""
        out = self.plan.select(self.grid[:, rank], straggler_ratio=self.straggler_ratio)
        # A rank's share: no split into equal steps has fewer than ceil(global bound / world).
        out.lower_bound = -(-self.plan.lower_bound // self.grid.shape[1])
        return out

    def consumed_samples(self, steps_done: int) -> IntArray:
        """Indices of the samples in the first ``steps_done`` steps, all ranks together."""
        done = self.grid[:steps_done].ravel()
        return self.plan.select(done).order if done.size else np.zeros(0, np.int64)


def straggler_ratio(costs: FloatArray) -> float:
    """Mean over steps (rows) of max rank cost / mean rank cost; 1.0 is perfect balance."""
    if costs.size == 0:
        return 1.0
    mean = costs.mean(axis=1)
    ok = mean > 0
    return float(np.mean(costs.max(axis=1)[ok] / mean[ok])) if ok.any() else 1.0


class TooFewSamples(ValueError):
    """Too few samples to give every rank a batch at every step (``policy="split"``).

    >>> from fitbatch import as_sizes, plan_batches
    >>> from fitbatch.costs import SumCost
    >>> sizes = as_sizes([4, 4])
    >>> arrange(plan_batches(sizes, 8, cost="sum"), sizes, SumCost(), 3, seed=0, epoch=0)
    Traceback (most recent call last):
    ...
    fitbatch.epoch._arrange.TooFewSamples: cannot give every rank a batch: 2 samples in 1 batches need 2 more batches; use fewer ranks, a smaller budget, or policy='drop'
    """


def split_batches(plan: BatchPlan, sizes: Sizes, model: CostModel, extra: int) -> BatchPlan:
    """Add ``extra`` batches by halving the most expensive batches (repeatedly if needed).

    Every sample stays in exactly one batch and no batch costs more than before (cost models
    are non-decreasing). Raises :class:`TooFewSamples` (a ``ValueError``) if there are too few
    samples.
    """
    if extra > plan.n_samples - len(plan):
        raise TooFewSamples(
            f"cannot give every rank a batch: {plan.n_samples} samples in {len(plan)} batches need "
            f"{extra} more batches; use fewer ranks, a smaller budget, or policy='drop'"
        )
    order, offsets = plan.order, plan.offsets
    # Invariant: (order, offsets) holds every planned sample once; `extra` batches are missing.
    while extra > 0:
        counts = np.diff(offsets)
        _, costs, _, _ = measure_batches(sizes, model, order, offsets)
        can = np.flatnonzero(counts >= 2)
        pick = can[np.argsort(-costs[can], kind="stable")[:extra]]
        mids = offsets[pick] + (counts[pick] + 1) // 2
        offsets = np.sort(np.concatenate([offsets, mids]))
        extra -= pick.size
    _, costs, real, padded = measure_batches(sizes, model, order, offsets)
    return plan.rebatched(order, offsets, (costs, real, padded))


def _even_count(plan: BatchPlan, sizes: Sizes, model: CostModel, world: int, policy: str) -> BatchPlan:
    left = len(plan) % world
    if left == 0:
        return plan
    if policy == "split":
        return split_batches(plan, sizes, model, world - left)
    keep = len(plan) - left
    gone = plan.select(np.arange(keep, len(plan)))
    out = plan.select(np.arange(keep))
    out.dropped = np.concatenate([plan.dropped, gone.order])
    out.dropped_batches = plan.dropped_batches + left
    logger.info("policy='drop': dropped %d batches (%d samples) to even out %d ranks", left, gone.n_samples, world)
    return out


def arrange(
    plan: BatchPlan,
    sizes: Sizes,
    model: CostModel,
    world: int,
    *,
    seed: int,
    epoch: int,
    policy: str = "split",
    purpose: str = "steps",
) -> Steps:
    """Arrange a global plan into cost-balanced steps of ``world`` batches (see the module doc).

    One rank runs the plan as it is, in its order, with no straggler ratio.

    >>> from fitbatch import as_sizes, plan_batches
    >>> from fitbatch.costs import PaddedCost
    >>> sizes = as_sizes([5, 3, 8, 2, 7, 4, 6, 1, 9])
    >>> steps = arrange(plan_batches(sizes, 10, strategy="sorted"), sizes, PaddedCost(), 2, seed=0, epoch=0)
    >>> sorted(int(i) for r in range(2) for b in steps.rank_plan(r) for i in b)
    [0, 1, 2, 3, 4, 5, 6, 7, 8]
    """
    choice("policy", policy, POLICIES)
    if world == 1:
        grid = np.arange(len(plan), dtype=np.int64)[:, None]
        return Steps(plan, grid, plan.counts.copy(), plan.real_units.copy(), None)
    plan = _even_count(plan, sizes, model, world, policy)
    n_steps = len(plan) // world
    rng = _rng.generator(seed, epoch, purpose)
    tie = rng.permutation(len(plan))
    by_cost = tie[np.argsort(plan.costs[tie], kind="stable")]
    grid = by_cost.reshape(n_steps, world) if n_steps else np.zeros((0, world), np.int64)
    grid = grid[rng.permutation(n_steps)]
    grid = np.take_along_axis(grid, np.argsort(rng.random(grid.shape), axis=1), axis=1)
    return _steps(plan, grid.astype(np.int64), plan.costs[grid])



def plan_for_world(
    sizes: Sizes, opts: PlanOptions, epoch: int, world: int, policy: str = "split", *,
    loss_sizes: FloatArray | None = None, shapes_over: Sizes | None = None,
) -> BatchPlan:
    """The epoch's plan for ``world`` ranks: with few steps, a batch count that divides evenly.

    With fewer than :data:`FEW_STEPS` steps per epoch, a batch count that ``world`` does not
    divide, no ``drop_last`` and no ``max_shapes`` (whose shape set must not change), splitting
    the leftover (``policy="split"``) would leave a step of half-size batches next to full ones.
    Instead the plan is made again at the lowest budget (found by bisection, never below the
    costliest sample that fits alone) whose plan still has no more than the next multiple of
    ``world`` batches: the same samples spread over evenly full batches. Whatever
    that leaves over is split by :func:`arrange` as before. The plan keeps the options' budget
    and lower bound, so fills are still against the budget asked for. Every rank computes the
    same plan from (sizes, options, epoch): no communication.

    >>> import fitbatch
    >>> from fitbatch.plan._options import PlanOptions
    >>> sizes = fitbatch.as_sizes([100] * 10)
    >>> opts = PlanOptions.build(300, cost="sum", strategy="sequential")
    >>> [len(b) for b in plan_for_world(sizes, opts, 0, 1)], [len(b) for b in plan_for_world(sizes, opts, 0, 3)]
    ([3, 3, 3, 1], [2, 2, 2, 2, 2])
    """
    if world > 1:  # steps of several ranks: batches of even cost, not the cheapest cuts
        with greedy_cuts():
            return _plan_for_world(sizes, opts, epoch, world, policy, loss_sizes, shapes_over)
    return plan_with(sizes, opts, epoch, loss_sizes=loss_sizes, shapes_over=shapes_over)


def _plan_for_world(
    sizes: Sizes, opts: PlanOptions, epoch: int, world: int, policy: str,
    loss_sizes: FloatArray | None, shapes_over: Sizes | None,
) -> BatchPlan:
    plan = plan_with(sizes, opts, epoch, loss_sizes=loss_sizes, shapes_over=shapes_over)
    n = len(plan)
    if policy != "split" or opts.drop_last or opts.max_shapes is not None or n % world == 0 or n >= FEW_STEPS * world:
        return plan  # (drop_last keeps its full batches and drops; max_shapes keeps its shape set)
    target = -(-n // world) * world
    alone = opts.cost.sample_cost(sizes.values)
    fits = alone[alone <= opts.budget]
    lo, hi = (float(fits.max()) if fits.size else opts.budget), opts.budget
    best = plan
    # Invariant: the plan at `hi` (best) has at most `target` batches; below `lo` nothing is tried.
    for _ in range(40):
        if hi - lo <= 1e-4 * opts.budget:
            break
        mid = (lo + hi) / 2
        trial = plan_with(sizes, dataclasses.replace(opts, budget=mid), epoch, loss_sizes=loss_sizes)
        if len(trial) <= target:
            hi, best = mid, trial
        else:
            lo = mid
    if best is not plan:
        logger.debug("epoch %d: %d batches re-planned as %d for %d ranks (budget %g -> %g)", epoch, n, len(best), world, opts.budget, hi)
        best.budget, best.lower_bound = plan.budget, plan.lower_bound
    return best


def _steps(plan: BatchPlan, grid: IntArray, step_costs: FloatArray, budgets: tuple[float, ...] | None = None) -> Steps:
    return Steps(
        plan=plan,
        grid=grid,
        step_samples=plan.counts[grid].sum(axis=1).astype(np.int64),
        step_units=plan.real_units[grid].sum(axis=1),
        straggler_ratio=straggler_ratio(step_costs),
        budgets=budgets,
    )


def arrange_budgets(
    sizes: Sizes, opts: PlanOptions, budgets: Sequence[float | str], epoch: int
) -> Steps:
    """Steps for ranks with their own budgets (see the module docstring).

    Samples are dealt to ranks at random in proportion to their budgets; every rank plans all
    shares (the work is one plan of all samples, whatever the world size).

    >>> from fitbatch import as_sizes
    >>> from fitbatch.plan import PlanOptions
    >>> steps = arrange_budgets(as_sizes([3] * 12), PlanOptions.build(6, cost="sum"), [6, 12], 0)
    >>> steps.budgets, steps.grid.shape[1]
    ((6.0, 12.0), 2)
    """
    caps = np.array([parse_budget(b, "budgets[i]") for b in budgets])
    n = len(sizes)
    alone = opts.cost.sample_cost(sizes.values)
    deal = _rng.generator(opts.seed, epoch, "rank-deal").permutation(n)
    share = np.cumsum(alone[deal]) / max(float(alone.sum()), 1e-300)
    bounds = np.searchsorted(share, np.cumsum(caps)[:-1] / caps.sum(), side="right")
    parts = np.split(deal, bounds)
    plans = []
    for rank, (part, cap) in enumerate(zip(parts, caps)):
        sub = sizes.subset(part)
        # each rank's share gets its own keyed stream (no seed or epoch arithmetic)
        rank_seed = int(_rng.generator(opts.seed, epoch, "rank-plan", rank).integers(1 << 62))
        local = plan_with(sub, dataclasses.replace(opts, budget=float(cap), seed=rank_seed), epoch)
        plans.append((part, local))
    target = max(len(p) for _, p in plans)
    ranked: list[BatchPlan] = []
    for part, local in plans:
        sub = sizes.subset(part)
        if len(local) < target:
            local = split_batches(local, sub, opts.cost, target - len(local))
        ranked.append(_reindex(local, part))
    return _stack(ranked, caps, sizes, opts.cost)


def _reindex(plan: BatchPlan, part: IntArray) -> BatchPlan:
    out = plan.select(np.arange(len(plan)))
    per_batch = (out.costs, out.real_units, out.padded_units)
    return plan.rebatched(part[out.order], out.offsets, per_batch, index_map=part)


def _stack(ranked: list[BatchPlan], caps: FloatArray, sizes: Sizes, model: CostModel) -> Steps:
    """One plan holding every rank's batches, rank-major, and the grid of steps over it."""
    world, n_steps = len(ranked), len(ranked[0])
    order = np.concatenate([p.order for p in ranked])
    lengths = np.concatenate([p.counts for p in ranked])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    plan = BatchPlan.from_batches(
        sizes, model, order, offsets, budget=float(caps.min()), strategy_name=ranked[0].strategy_name,
        lower_bound=sum(p.lower_bound for p in ranked), skipped=np.concatenate([p.skipped for p in ranked]),
        dropped=np.concatenate([p.dropped for p in ranked]), dropped_batches=sum(p.dropped_batches for p in ranked),
    )
    grid = (np.arange(world)[None, :] * n_steps + np.arange(n_steps)[:, None]).astype(np.int64)
    fills = plan.costs[grid] / caps[None, :]
    return _steps(plan, grid, fills, tuple(float(c) for c in caps))


__all__ = [
    "POLICIES",
    "StepTotals",
    "Steps",
    "TooFewSamples",
    "arrange",
    "arrange_budgets",
    "split_batches",
    "straggler_ratio",
]
