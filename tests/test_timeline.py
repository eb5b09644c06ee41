"""fitbatch.epoch._timeline: an epoch's steps as they run, and the changes that replace their rest."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fitbatch
from fitbatch.epoch._arrange import arrange
from fitbatch.epoch._timeline import Planner, Timeline, changed, restore_cost, scaled
from fitbatch.plan._planner import PlanOptions, lower_bound, plan_with
from fitbatch.sizes import as_sizes


def _epoch(n=60, seed=3, world=2):
    sizes = as_sizes(np.random.default_rng(seed).integers(1, 9, n))
    opts = PlanOptions.build(16, cost="sum", strategy="pooled", seed=seed)
    steps = arrange(plan_with(sizes, opts), sizes, opts.cost, world, seed=seed, epoch=0)
    return sizes, opts, Timeline.start(steps, opts.cost, opts.budget)


def _ran(timeline, start, stop):
    """The samples of steps start .. stop-1 of a timeline, all ranks."""
    out = []
    for seg, lo, hi in timeline.pieces(start):
        hi = min(hi, stop - seg.first)
        if hi > lo:
            out += seg.steps.consumed_samples(hi).tolist()[len(seg.steps.consumed_samples(lo)) :]
    return out


@pytest.mark.parametrize("changes", [[(3, 3)], [(3, 3), (5, 2)], [(0, 4), (2, 1)], [(6, 2), (4, 3)]])
def test_timeline_changes_keep_every_sample_once(changes):
    sizes, opts, timeline = _epoch()
    for generation, (step, world) in enumerate(changes, 1):
        step = min(step, timeline.total)
        before = timeline
        rest = arrange(timeline.rest_plan(step, sizes), sizes, opts.cost, world, seed=3, epoch=0, purpose=f"g{generation}")
        timeline = timeline.then(step, rest, opts.cost, opts.budget, world_change=True)
        assert timeline.base == step and timeline.world == world
        assert _ran(timeline, 0, step) == _ran(before, 0, step), "the steps before a change stay"
        assert sorted(_ran(timeline, step, timeline.total)) == sorted(before.rest_samples(step).tolist())
    assert sorted(_ran(timeline, 0, timeline.total)) == list(range(len(sizes)))
    samples = timeline.step_totals().samples
    assert samples.size == timeline.total and int(samples.sum()) == len(sizes)


def test_timeline_rest_plan_carries_the_lower_bound_of_its_samples():
    sizes, opts, timeline = _epoch(n=400)
    step = timeline.total // 2
    rest = timeline.rest_plan(step, sizes)
    alone = sizes.values[rest.order]
    assert rest.lower_bound == lower_bound(opts.cost, opts.budget, float(alone.sum()), rest.n_samples)
    assert rest.lower_bound < timeline.steps.plan.lower_bound
    assert timeline.rest_plan(0, sizes).lower_bound == timeline.steps.plan.lower_bound
    assert timeline.rest_plan(timeline.total, sizes).lower_bound == 0


def test_timeline_rank_plan_runs_the_current_world_from_its_base():
    sizes, opts, timeline = _epoch(n=200)
    assert timeline.rank_plan(1, sizes).to_lists() == timeline.steps.rank_plan(1).to_lists()
    rest = arrange(timeline.rest_plan(4, sizes), sizes, opts.cost, 3, seed=3, epoch=0, purpose="g1")
    moved = timeline.then(4, rest, opts.cost, opts.budget, world_change=True)
    for r in range(3):
        assert moved.rank_plan(r, sizes).to_lists() == rest.rank_plan(r).to_lists()
    # a change that keeps the world: the rank runs the old rows, then the new ones
    again = arrange(moved.rest_plan(6, sizes), sizes, opts.cost, 3, seed=3, epoch=0, purpose="g2")
    later = moved.then(6, again, opts.cost, opts.budget)
    assert later.base == 4
    for r in range(3):
        assert later.rank_plan(r, sizes).to_lists() == rest.rank_plan(r).to_lists()[:2] + again.rank_plan(r).to_lists()


def test_planner_replays_a_budget_change_like_the_live_change():
    sizes = as_sizes(np.random.default_rng(0).integers(1, 40, 300))
    planner, opts = Planner(sizes, "split", epoch=2), PlanOptions.build(200, seed=1)
    epoch = planner.start(opts, None, world=3)
    after, new, _ = planner.apply(epoch, {"step": 4, "budget": 120.0}, 1, opts, None)
    again, _, _ = planner.apply(planner.start(opts, None, world=3), {"step": 4, "budget": 120.0}, 1, opts, None)
    assert new.budget == 120.0 and after.total == again.total
    for r in range(3):
        assert after.rank_plan(r, sizes).to_lists() == again.rank_plan(r, sizes).to_lists()
    assert after.pieces(0)[0][0].steps is after.segments[0].steps
    ran = [b for seg, lo, hi in after.pieces() for b in seg.steps.plan.select(np.sort(seg.steps.grid[lo:hi].ravel())).to_lists()]
    assert sorted(i for b in ran for i in b) == list(range(300))
    with pytest.raises(ValueError, match=r"event 0 .* at step 99, outside epoch 2"):
        planner.apply(epoch, {"step": 99, "budget": 120.0}, 1, opts, None)


def test_options_after_changes_and_costs_rebuilt_from_their_description():
    opts = PlanOptions.build(100, cost="padded")
    assert changed(opts, None, {"step": 1, "budget": 50.0}) == (PlanOptions.build(50, cost="padded"), None)
    assert changed(opts, (100.0, 300.0), {"step": 1, "budget": 50.0})[1] == scaled((100.0, 300.0), 50.0) == (50.0, 150.0)
    for model in (fitbatch.SumCost(), fitbatch.PaddedCost(weights=(1.0, 0.5)), fitbatch.PaddedPolynomial(fixed=3.0, quadratic=0.1)):
        assert restore_cost(model.to_dict()) == model
    memory = fitbatch.memory.BatchMemoryModel(fixed=1e6, per_token=12.5, quadratic=0.25, margin=0.1, samples=((2.0, 64.0, 3e6),))
    assert restore_cost(json.loads(json.dumps(memory.to_dict()))) == memory, "what OOMGuard hands to set_cost"
    user = fitbatch.costs.FunctionCost(lambda count, max_size, sum_size: count * max_size)
    assert restore_cost(user.to_dict(), [user]) is user, "a known model is reused"
    with pytest.raises(ValueError, match="cannot be rebuilt from the state"):
        restore_cost(user.to_dict())
