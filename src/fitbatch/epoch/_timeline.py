"""An epoch that changes part-way: its steps as they run, and how a change replaces their rest.

A :class:`~fitbatch.BudgetBatchSampler` epoch begins as one arrangement of steps (see
:mod:`fitbatch.epoch._arrange`). A change at step ``k`` — a new budget or cost model
(``set_budget``/``set_cost`` part-way through the epoch) or a new world size (a resume on other
ranks) — keeps steps ``0 .. k-1`` and replaces the rest: a new budget or cost model plans the
samples of the remaining steps again, a new world size arranges their batches for the new
ranks. A :class:`Timeline` holds the result; the sampler's state holds the changes as *events*
(``{"step": k, "budget": b}``, ``{"step": k, "cost": {...}}``, ``{"step": k, "num_replicas": w}``)
and a :class:`Planner` replays them in order on resume, so the resumed epoch runs the same
batches, every sample once. Every rank applies the same events and computes the same timeline.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch import _rng
from fitbatch._state import BUDGET_KEY, COST_KEY, NUM_REPLICAS_KEY, STEP_KEY
from fitbatch._validate import parse_budget
from fitbatch.costs import (
    CostModel,
    Limits,
    PaddedCost,
    PaddedPolynomial,
    SumCost,
    resolve_cost,
    resolve_limits,
)
from fitbatch.costs._limits import check_budget_shape, check_limits, describer, limit_columns
from fitbatch.epoch._arrange import (
    Steps,
    StepTotals,
    TooFewSamples,
    arrange,
    arrange_budgets,
    plan_for_world,
    straggler_ratio,
)
from fitbatch.plan import _shapes as S
from fitbatch.plan._planner import BatchPlan, PlanOptions
from fitbatch.plan._rules import screen_oversized
from fitbatch.plan._stats import samples_bound
from fitbatch.sizes import Sizes

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
Budgets = tuple[float, ...] | None  # per-rank budgets, or None for one budget


@dataclasses.dataclass(frozen=True)
class Segment:
    """One arrangement of an epoch and where it runs: its row ``k`` is step ``first + k`` of the epoch.

    Attributes:
        first: the step of the epoch its first row runs at.
        steps: the arrangement (all ranks).
        model, budget: the cost model and the (largest) budget its batches were planned with,
            for the lower bound of a part of it.
    """

    first: int
    steps: Steps
    model: CostModel
    budget: float


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The steps of one epoch as they run: the first arrangement, then one per change.

    Step ``k`` of the epoch runs row ``k - first`` of the last segment that begins at or before
    ``k``. A change at step ``s`` (:meth:`then`) keeps steps ``0 .. s-1`` and replaces the rest
    with an arrangement of the samples the rest held (:meth:`rest_samples`, :meth:`rest_plan`),
    so every sample of the epoch still runs exactly once. ``base`` is the step at which the
    world size last changed: a rank of the current world runs steps ``base ..`` only.

    >>> from fitbatch.epoch._arrange import arrange
    >>> from fitbatch.plan._planner import PlanOptions, plan_with
    >>> from fitbatch.sizes import as_sizes
    >>> sizes, opts = as_sizes([1] * 12), PlanOptions.build(2, cost="sum", strategy="sequential")
    >>> steps = arrange(plan_with(sizes, opts), sizes, opts.cost, 2, seed=0, epoch=0)
    >>> epoch = Timeline.start(steps, opts.cost, opts.budget)
    >>> epoch.total, len(epoch.rest_samples(1))  # 6 batches of 2 on 2 ranks; 2 steps left after step 1
    (3, 8)
    >>> rest = arrange(epoch.rest_plan(1, sizes), sizes, opts.cost, 4, seed=0, epoch=0, purpose="resume-steps-1")
    >>> after = epoch.then(1, rest, opts.cost, opts.budget, world_change=True)
    >>> after.total, after.base, after.world, after.step_totals().samples.tolist()
    (2, 1, 4, [4, 8])
    """

    segments: tuple[Segment, ...]
    base: int = 0

    @classmethod
    def start(cls, steps: Steps, model: CostModel, budget: float) -> Timeline:
        """An epoch as first arranged."""
        return cls((Segment(0, steps, model, budget),))

    @property
    def steps(self) -> Steps:
        """The arrangement in force (that of the last change)."""
        return self.segments[-1].steps

    @property
    def total(self) -> int:
        """Steps in the epoch."""
        last = self.segments[-1]
        return last.first + last.steps.n_steps

    @property
    def world(self) -> int:
        """Ranks of the arrangement in force."""
        return int(self.steps.grid.shape[1])

    def pieces(self, start: int = 0) -> list[tuple[Segment, int, int]]:
        """``(segment, first row, end row)`` of the segments that run steps ``start ..`` of the epoch."""
        out = []
        for i, seg in enumerate(self.segments):
            end = self.segments[i + 1].first if i + 1 < len(self.segments) else self.total
            lo, hi = max(start, seg.first), end
            if lo < hi:
                out.append((seg, lo - seg.first, hi - seg.first))
        return out

    def then(self, step: int, steps: Steps, model: CostModel, budget: float, *, world_change: bool = False) -> Timeline:
        """This timeline with the steps from ``step`` on replaced by ``steps`` (``0 <= step <= total``)."""
        kept = tuple(seg for seg in self.segments if seg.first < step)
        return Timeline((*kept, Segment(step, steps, model, budget)), step if world_change else self.base)

    def rest_samples(self, step: int) -> IntArray:
        """The samples of the steps from ``step`` on (all ranks), sorted."""
        parts = [_batches(seg.steps, lo, hi).order for seg, lo, hi in self.pieces(step)]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def rest_plan(self, step: int, sizes: Sizes) -> BatchPlan:
        """The batches of the steps from ``step`` on (all ranks), as one plan with the bound of its samples."""
        pieces = self.pieces(step)
        parts = [_batches(seg.steps, lo, hi) for seg, lo, hi in pieces]
        bound = sum(_bound(seg, lo, hi, sizes) for seg, lo, hi in pieces)
        return _join(parts, self.steps.plan, lower_bound=bound, straggler=None)

    def step_totals(self) -> StepTotals:
        """Per step of the epoch: samples, real units and loss units over all ranks."""
        pieces = self.pieces()
        samples = [seg.steps.step_samples[lo:hi] for seg, lo, hi in pieces]
        units = [seg.steps.step_units[lo:hi] for seg, lo, hi in pieces]
        loss = [seg.steps.step_loss_units[lo:hi] for seg, lo, hi in pieces]
        return StepTotals(
            np.concatenate([np.zeros(0, np.int64), *samples]), np.concatenate([np.zeros(0), *units]),
            np.concatenate([np.zeros(0), *loss]),
        )

    def rank_plan(self, rank: int, sizes: Sizes) -> BatchPlan:
        """The batches rank ``rank`` runs at steps ``base ..``, in step order."""
        if len(self.segments) == 1:
            return self.steps.rank_plan(rank)
        pieces = self.pieces(self.base)
        parts = [seg.steps.plan.select(seg.steps.grid[lo:hi, rank]) for seg, lo, hi in pieces]
        bound = sum(_bound(seg, lo, hi, sizes) for seg, lo, hi in pieces)
        ratio = None
        if self.world > 1 and pieces:
            ratio = straggler_ratio(np.concatenate([_step_costs(seg.steps, lo, hi) for seg, lo, hi in pieces]))
        return _join(parts, self.steps.plan, lower_bound=-(-bound // self.world), straggler=ratio)


def _batches(steps: Steps, lo: int, hi: int) -> BatchPlan:
    """The batches of rows ``lo .. hi-1`` of an arrangement, all ranks, in plan order."""
    return steps.plan.select(np.sort(steps.grid[lo:hi].ravel()))


def _bound(seg: Segment, lo: int, hi: int, sizes: Sizes) -> int:
    """A lower bound of the batches of rows ``lo .. hi-1`` of a segment (its plan's own when whole)."""
    if lo == 0 and hi == seg.steps.n_steps:
        return int(seg.steps.plan.lower_bound)
    return samples_bound(seg.model, seg.budget, sizes.values[_batches(seg.steps, lo, hi).order])


def _step_costs(steps: Steps, lo: int, hi: int) -> FloatArray:
    costs: FloatArray = steps.plan.costs[steps.grid[lo:hi]]
    return costs / np.asarray(steps.budgets)[None, :] if steps.budgets is not None else costs


def _join(parts: Sequence[BatchPlan], like: BatchPlan, *, lower_bound: int, straggler: float | None) -> BatchPlan:
    """One plan of the batches of ``parts`` in order, with the epoch's metadata from ``like``."""
    counts = np.concatenate([np.zeros(0, np.int64), *(p.counts for p in parts)])
    arrays = [np.concatenate([np.zeros(0), *(getattr(p, name) for p in parts)]) for name in ("costs", "real_units", "padded_units")]
    out = BatchPlan(
        np.concatenate([np.zeros(0, np.int64), *(p.order for p in parts)]),
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        costs=arrays[0], real_units=arrays[1], padded_units=arrays[2],
        budget=like.budget, cost_name=like.cost_name, strategy_name=like.strategy_name, lower_bound=lower_bound,
        skipped=like.skipped, dropped=like.dropped, dropped_batches=like.dropped_batches,
        plan_seconds=like.plan_seconds, straggler_ratio=straggler, loss_sizes=like.loss_sizes,
        shape_set=S.union([p.shape_set for p in parts]),
    )
    return out


@dataclasses.dataclass(frozen=True)
class Planner:
    """How a sampler plans one epoch and re-plans its rest: the samples, the rank policy, the epoch.

    ``loss`` (the sampler's ``loss_sizes``, or ``None``) is attached to every plan it makes, so
    every arrangement's ``step_loss_units`` counts them.

    >>> from fitbatch.sizes import as_sizes
    >>> planner = Planner(as_sizes([4, 4, 4, 4, 4, 4]), "split", epoch=0)
    >>> opts = PlanOptions.build(8, cost="sum", strategy="sequential")
    >>> epoch = planner.start(opts, None, world=1)
    >>> epoch.rank_plan(0, planner.sizes).to_lists()
    [[0, 1], [2, 3], [4, 5]]
    >>> epoch, opts, _ = planner.apply(epoch, {"step": 1, "budget": 4.0}, 1, opts, None)
    >>> epoch.rank_plan(0, planner.sizes).to_lists(), opts.budget
    ([[0, 1], [2], [3], [4], [5]], 4.0)
    """

    sizes: Sizes
    policy: str
    epoch: int
    loss: FloatArray | None = None

    def arrange(self, opts: PlanOptions, budgets: Budgets, world: int) -> Steps:
        """The epoch's fresh arrangement (per-rank budgets: one per rank, ``world`` ignored)."""
        if budgets is not None:
            return self._with_loss(arrange_budgets(self.sizes, opts, budgets, self.epoch))
        plan = plan_for_world(self.sizes, opts, self.epoch, world, self.policy, loss_sizes=self.loss)
        return arrange(plan, self.sizes, opts.cost, world, seed=opts.seed, epoch=self.epoch, policy=self.policy)

    def _with_loss(self, steps: Steps) -> Steps:
        steps.plan.loss_sizes = self.loss  # the plan of a whole arrangement, indexed like the dataset
        return steps

    def start(self, opts: PlanOptions, budgets: Budgets, world: int) -> Timeline:
        """The epoch as first arranged."""
        return Timeline.start(self.arrange(opts, budgets, world), opts.cost, _largest(opts, budgets))

    def apply(
        self,
        timeline: Timeline,
        event: Mapping[str, Any],
        generation: int,
        opts: PlanOptions,
        budgets: Budgets,
        known: Sequence[CostModel] = (),
    ) -> tuple[Timeline, PlanOptions, Budgets]:
        """Apply one event (the ``generation``-th of the epoch) to ``timeline``; the options after it.

        ``opts`` and ``budgets`` are those in force before the event; ``known`` are cost models
        to reuse when a cost event describes one of them (see :func:`restore_cost`).

        Raises:
            ValueError: the event's step is outside the steps of ``timeline`` this world runs,
                or (``oversized="error"``) a remaining sample exceeds a new budget alone.
        """
        step = int(event[STEP_KEY])
        check_step(f"event {generation - 1} ({dict(event)!r})", step, timeline, self.epoch)
        if NUM_REPLICAS_KEY in event:
            return self._rearranged(timeline, step, int(event[NUM_REPLICAS_KEY]), generation, opts, budgets), opts, budgets
        opts, budgets = changed(opts, budgets, event, known)
        screen(self.sizes, opts)
        return self._replanned(timeline, step, generation, opts, budgets, event), opts, budgets

    def _rearranged(
        self, timeline: Timeline, step: int, world: int, generation: int, opts: PlanOptions, budgets: Budgets
    ) -> Timeline:
        """The batches of the steps from ``step`` on, arranged for ``world`` ranks."""
        rest = arrange(
            timeline.rest_plan(step, self.sizes), self.sizes, opts.cost, world, seed=opts.seed, epoch=self.epoch,
            policy=self.policy, purpose=f"resume-steps-{generation}",
        )
        return timeline.then(step, rest, opts.cost, _largest(opts, budgets), world_change=True)

    def _replanned(
        self, timeline: Timeline, step: int, generation: int, opts: PlanOptions, budgets: Budgets, event: Mapping[str, Any]
    ) -> Timeline:
        """The samples of the steps from ``step`` on, planned again with ``opts`` for the same ranks."""
        samples, like = timeline.rest_samples(step), timeline.steps.plan
        largest = _largest(opts, budgets)
        if samples.size == 0:  # a change at the end of the epoch: an empty rest, the epoch's left-out samples
            empty = arrange(like.select(np.zeros(0, np.int64)), self.sizes, opts.cost, timeline.world, seed=opts.seed, epoch=self.epoch)
            return timeline.then(step, empty, opts.cost, largest)
        try:
            steps = self._plan_rest(samples, generation, opts, budgets, timeline.world)
        except TooFewSamples:
            # equal steps within the new budget would need an empty batch: the rest keeps its
            # batches (every sample once, equal steps); the change holds from the next epoch
            logger.warning(
                "epoch %d: the %d samples left cannot fill equal steps for %d ranks after %s; "
                "the rest of the epoch keeps its batches", self.epoch, samples.size, timeline.world, dict(event),
            )
            return timeline
        plan = steps.plan  # the epoch's samples left out so far, and those the new plan leaves out
        plan.skipped = np.concatenate([like.skipped, plan.skipped])
        plan.dropped = np.concatenate([like.dropped, plan.dropped])
        plan.dropped_batches += like.dropped_batches
        return timeline.then(step, steps, opts.cost, largest)

    def _plan_rest(self, samples: IntArray, generation: int, opts: PlanOptions, budgets: Budgets, world: int) -> Steps:
        sub = self.sizes.subset(samples)
        # the rest gets its own keyed stream, one per change (no seed arithmetic)
        seed = int(_rng.generator(opts.seed, self.epoch, "replan", generation).integers(1 << 62))
        local = dataclasses.replace(opts, seed=seed)
        if budgets is not None:
            steps = arrange_budgets(sub, local, budgets, self.epoch)
            return self._with_loss(dataclasses.replace(steps, plan=_renamed(steps.plan, samples)))
        rest = _renamed(plan_for_world(sub, local, self.epoch, world, self.policy, shapes_over=self.sizes), samples)
        rest.loss_sizes = self.loss
        return arrange(
            rest, self.sizes, opts.cost, world, seed=opts.seed,
            epoch=self.epoch, policy=self.policy, purpose=f"replan-steps-{generation}",
        )


def changed(
    opts: PlanOptions, budgets: Budgets, event: Mapping[str, Any], known: Sequence[CostModel] = ()
) -> tuple[PlanOptions, Budgets]:
    """The options after a budget or cost event (per-rank budgets keep their proportions).

    >>> opts, budgets = changed(PlanOptions.build(100), (100.0, 200.0), {"step": 3, "budget": 80.0})
    >>> opts.budget, budgets
    (80.0, (80.0, 160.0))
    """
    if BUDGET_KEY in event:
        value = float(event[BUDGET_KEY])
        return dataclasses.replace(opts, budget=value), None if budgets is None else scaled(budgets, value)
    return dataclasses.replace(opts, cost=restore_cost(event[COST_KEY], (*known, opts.cost))), budgets


Change = tuple[dict[str, Any], CostModel | None]  # a change's event fields, and the cost model it sets


def budget_change(opts: PlanOptions, budget: Any) -> Change | None:
    """What ``set_budget(budget)`` changes under ``opts``: a budget, or (several limits, a mapping
    of every column to its budget) a cost model; ``None`` when nothing changes.

    >>> budget_change(PlanOptions.build(100), 80), budget_change(PlanOptions.build(100), "100")
    (({'budget': 80.0}, None), None)
    """
    check_budget_shape(limit_columns(opts.cost), budget=budget)  # the shape plan_batches takes
    if isinstance(budget, Mapping) and isinstance(opts.cost, Limits):  # several limits: new fills
        limits = opts.cost
        if tuple(sorted(budget)) != limits.names:
            raise ValueError(f"set_budget needs a budget for each limit {list(limits.names)}, got {sorted(budget)}")
        return cost_change(opts, resolve_limits(budget, dict(zip(limits.names, limits.costs))))
    value = parse_budget(budget)
    return ({BUDGET_KEY: value}, None) if value != opts.budget else None


def cost_change(opts: PlanOptions, cost: Any) -> Change | None:
    """What ``set_cost(cost)`` changes under ``opts`` (``None`` when it is the cost model in force).

    >>> cost_change(PlanOptions.build(100), "sum")[0]
    {'cost': {'kind': 'sum', 'weights': None}}
    """
    model = resolve_cost(cost)
    check_budget_shape(limit_columns(opts.cost), cost=model)  # the shape plan_batches takes
    return ({COST_KEY: model.to_dict()}, model) if model != opts.cost else None


def screen(sizes: Sizes, opts: PlanOptions) -> None:
    """Under ``oversized="error"``, refuse options that a sample exceeds alone (before any change).

    Every sample is checked, not only those left in the epoch: later epochs plan them all.

    >>> from fitbatch.sizes import as_sizes
    >>> screen(as_sizes([3, 9, 4]), PlanOptions.build(8))
    Traceback (most recent call last):
    ...
    ValueError: 1 sample cost more than the budget 8 even alone; largest: index 1 (cost 9.0). Pass oversized='single' to give each its own batch, or oversized='skip' to leave them out (they are counted in the plan's stats).
    """
    if opts.oversized == "error":
        model = check_limits(sizes.columns, opts.cost)
        alone = model.sample_cost(sizes.values)
        screen_oversized(alone, opts.budget, "error", sizes=sizes.values, describe=describer(model, sizes.values))


def check_step(what: str, step: int, timeline: Timeline, epoch: int) -> None:
    """Refuse a saved step outside the steps of ``timeline`` that its current world runs."""
    if not timeline.base <= step <= timeline.total:
        raise ValueError(
            f"state's {what} is at step {step}, outside epoch {epoch}, whose steps run "
            f"{timeline.base}..{timeline.total} there; pass what state_dict() returned, unchanged"
        )


def scaled(budgets: tuple[float, ...], smallest: float) -> tuple[float, ...]:
    """Per-rank budgets scaled so that the smallest becomes ``smallest``.

    >>> scaled((100.0, 200.0), 50.0)
    (50.0, 100.0)
    """
    factor = smallest / min(budgets)
    return tuple(b * factor for b in budgets)


def _largest(opts: PlanOptions, budgets: Budgets) -> float:
    return opts.budget if budgets is None else max(budgets)


def _renamed(plan: BatchPlan, samples: IntArray) -> BatchPlan:
    """A plan of ``sizes[samples]`` with its indices mapped back to the whole dataset."""
    per_batch = (plan.costs, plan.real_units, plan.padded_units)
    return plan.rebatched(samples[plan.order], plan.offsets, per_batch, index_map=samples)


_BUILT_IN_COSTS: dict[str, type[CostModel]] = {c.name: c for c in (SumCost, PaddedCost, PaddedPolynomial)}


def restore_cost(description: Mapping[str, Any], known: Sequence[CostModel] = ()) -> CostModel:
    """The cost model a cost event describes (its ``to_dict()``): one of ``known``, a built-in or a memory model.

    Raises:
        ValueError: a description no built-in or :mod:`fitbatch.memory` model reads (a
            function cost, say), naming it.

    >>> restore_cost(PaddedPolynomial(fixed=5.0).to_dict()) == PaddedPolynomial(fixed=5.0)
    True
    """
    for model in known:
        if json.dumps(model.to_dict(), sort_keys=True) == json.dumps(description, sort_keys=True):
            return model
    fields = {k: v for k, v in description.items() if k != "kind"}
    kind = description.get("kind")
    try:
        if kind in _BUILT_IN_COSTS:
            return _BUILT_IN_COSTS[kind](**fields)
        if kind == Limits.name:  # several limits: each column's model restored the same way
            return Limits(tuple(fields["names"]), tuple(fields["budgets"]), tuple(restore_cost(c, known) for c in fields["costs"]))
        from fitbatch.memory.model import load_memory_model

        restored: CostModel = load_memory_model(dict(description))
        return restored
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(
            f"state changes the cost model to {dict(description)!r} during the epoch, which cannot be "
            f"rebuilt from the state ({e}); only the built-in cost models and fitbatch.memory models can"
        ) from e


__all__ = [
    "Budgets", "Change", "Planner", "Segment", "Timeline", "budget_change", "changed", "check_step", "cost_change",
    "restore_cost", "scaled", "screen",
]
