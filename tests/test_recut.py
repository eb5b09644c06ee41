"""The cheapest cuts of a laid-out order at the greedy walk's batch count (few-batch "auto" epochs)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fitbatch
from fitbatch._kernels import batches as K
from fitbatch.costs import PaddedCost, SumCost
from fitbatch.epoch._arrange import plan_for_world
from fitbatch.plan._options import PlanOptions
from fitbatch.strategies import _recut
from fitbatch.strategies._recut import greedy_cuts, least_cost_starts


def _total(values, starts, budget):
    ends = list(starts[1:]) + [values.size]
    costs = [(b - a) * values[a:b].max() for a, b in zip(starts, ends)]
    assert max(costs) <= budget
    return sum(costs)


def _cheapest(values, budget, k):
    """Every way to cut ``values`` into ``k`` consecutive batches (the reference)."""
    best = np.inf
    for cuts in itertools.combinations(range(1, values.size), k - 1):
        starts = (0, *cuts)
        ends = (*cuts, values.size)
        costs = [(b - a) * values[a:b].max() for a, b in zip(starts, ends)]
        if max(costs) <= budget:
            best = min(best, sum(costs))
    return best


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 12), min_size=2, max_size=10),
    st.integers(12, 40),
)
def test_cuts_are_the_cheapest_at_the_greedy_count(sizes, budget):
    values = np.asarray(sizes, dtype=np.float64)
    greedy = K.greedy_starts(values, float(budget), PaddedCost())[0]
    got = least_cost_starts(values, greedy, float(budget), PaddedCost())
    starts = greedy if got is None else got
    assert starts.size == greedy.size and starts[0] == 0 and np.all(np.diff(starts) > 0)
    assert _total(values, starts, budget) == _cheapest(values, budget, greedy.size)
    if got is not None:  # only returned when strictly cheaper than the walk
        assert _total(values, got, budget) < _total(values, greedy, budget)


def _least_total(values, budget, k, cost, cap):
    """The least total cost of ``k`` consecutive batches, by a plain programme over positions
    (every start for every end; the reference for longer inputs than brute force reaches)."""
    n = values.size
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for _ in range(k):
        nxt = np.full(n + 1, np.inf)
        for p in range(1, n + 1):
            q = np.arange(p)
            mx = np.maximum.accumulate(values[:p][::-1])[::-1]
            c = cost.evaluate((p - q).astype(np.float64), mx, prefix[p] - prefix[q])
            fits = (c <= budget) & ((p - q) <= (np.inf if cap is None else cap))
            nxt[p] = np.min(np.where(fits, best[q] + c, np.inf))
        best = nxt
    return best[n]


SUM_AND_COUNT = fitbatch.costs.FunctionCost(lambda count, mx, sm: sm + 3.0 * count)
COST_MODELS = {
    "padded": PaddedCost(),
    "polynomial": fitbatch.PaddedPolynomial(fixed=5.0, linear=2.0, quadratic=0.01),
    "sum + count": SUM_AND_COUNT,
}


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(20, 110),
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(sorted(COST_MODELS)),
    budget=st.sampled_from([150.0, 400.0, 900.0]),
    cap=st.one_of(st.none(), st.integers(8, 40)),
    block=st.sampled_from([1, 7, 1 << 16]),
)
def test_cuts_match_a_plain_programme(n, seed, cost, budget, cap, block):
    """Longer orders, costs that read the sum or add a fixed part, a count cap and stage
    matrices in blocks of a few rows: the least total cost at the walk's batch count."""
    values = np.random.default_rng(seed).integers(1, 30, n).astype(np.float64)
    model = COST_MODELS[cost]
    greedy = K.greedy_starts(values, budget, model, cap=cap)[0]
    with pytest.MonkeyPatch.context() as mp:  # per example: later tests keep the real blocks
        mp.setattr(_recut, "MAX_STAGE_PAIRS", block)
        got = least_cost_starts(values, greedy, budget, model, cap)
    starts = greedy if got is None else got
    ends = np.append(starts[1:], n)
    mx = np.maximum.reduceat(values, starts)
    costs = model.evaluate((ends - starts).astype(np.float64), mx, np.add.reduceat(values, starts))
    assert starts.size == greedy.size and np.all(np.diff(starts) > 0)
    assert costs.max() <= budget and (cap is None or np.max(ends - starts) <= cap)
    assert np.isclose(costs.sum(), _least_total(values, budget, greedy.size, model, cap), rtol=1e-9)


def test_sum_cost_keeps_the_walk():
    """Every cut costs the same total under the sum cost: nothing to gain, nothing changes."""
    values = np.array([5.0, 4, 4, 3, 3, 3, 2, 2, 1])
    greedy = K.greedy_starts(values, 10.0, SumCost())[0]
    assert least_cost_starts(values, greedy, 10.0, SumCost()) is None


def test_few_batch_auto_epochs_pad_less_at_the_same_count(functions):
    """20,000 real function lengths at 65,536 tokens: ~30 batches, "auto" few-batch levels."""
    sizes = functions[np.random.default_rng(1).integers(0, functions.size, 20_000)]
    for epoch in range(3):
        cut = fitbatch.plan_batches(sizes, 65536, seed=3, epoch=epoch)
        with greedy_cuts():
            walk = fitbatch.plan_batches(sizes, 65536, seed=3, epoch=epoch)
        assert len(cut) == len(walk) < 64
        assert np.array_equal(np.sort(cut.order), np.arange(sizes.size))
        assert cut.costs.max() <= 65536
        assert cut.costs.sum() < walk.costs.sum()
        assert cut.stats().padding_efficiency > walk.stats().padding_efficiency


@pytest.mark.parametrize("world", [1, 8])
def test_several_ranks_keep_the_walk(functions, world):
    """Cheaper cuts make batch costs less even; steps of several ranks keep the greedy cuts."""
    sizes = fitbatch.as_sizes(functions[np.random.default_rng(2).integers(0, functions.size, 20_000)])
    opts = PlanOptions.build(65536, seed=3)
    plan = plan_for_world(sizes, opts, 0, world)
    with greedy_cuts():
        walk = plan_for_world(sizes, opts, 0, world)
    if world == 1:
        assert plan.costs.sum() < walk.costs.sum()
    else:
        assert np.array_equal(plan.offsets, walk.offsets) and np.array_equal(plan.order, walk.order)
